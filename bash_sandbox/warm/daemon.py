"""The warm CLI's daemon: a per-user process that has imported the CLI once and forks a
copy of itself for each `bash-sandbox run`.

What a call shares with the calls before it: only the modules imported at the daemon's
start, the argument parser built from them, the two seccomp programs compiled from them,
and one survey of the default `deny_read` (`shadow_cache.seed`), which each call checks
against the host's stamps before it uses it, as an executor does between its own commands.
Nothing a call learns goes back to the daemon. A call runs in a fork of the daemon, or in
a spare (`spare.py`): a fork made when the last call of the same shape ended, which built
and rehearsed that shape's executor meanwhile and serves this one call only if it is the
call it was made for (the same environment, umask, directory and config). Either becomes
the client's process as far as the run can tell: the client's stdin, stdout and stderr
(dup'ed onto 0, 1 and 2), its working directory (a descriptor, so a rename in between
cannot redirect it), its umask and its whole environment; then it runs the same `main()` a
fresh `bash-sandbox` runs. So the config file, the session log and every policy are read
as a fresh process reads them. The call's process answers the client itself once `main()`
has returned, before its own exit (which closes its inotify instances: closing them first
would wait out a kernel grace period, 15-16 ms).

The daemon serves only its own uid (SO_PEERCRED), from a socket in the uid's private
directory, and only a request whose sender (SCM_CREDENTIALS: the process that wrote it,
not the one that connected) is as free as the daemon and holds exactly its credentials
(`wire.holds_own_rights`: gids, groups, capabilities, namespaces, root, cgroup, rlimits,
LSM label; the connector's groups too): a confined command reaching the socket is never
served, and a caller with other rights is told to run fresh, with its own. It forwards the
client's interrupt signals to the call's process, hangs it up if the client goes away
(SIGHUP: it stops its command and cleans up; SIGKILL after a grace period), and exits
after `IDLE_ENV` seconds without a call, or at once when its own code changed on disk (the
client then runs fresh); its spares close their executors and exit with it.

    python -I -m bash_sandbox.warm.daemon SOCKET_PATH
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import importlib
import io
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bash_sandbox.warm import spare, wire
from bash_sandbox.warm.code_watch import CodeWatch

if TYPE_CHECKING:
    from bash_sandbox.cli.arguments import CliArgumentParser

# Imported before any fork: everything `bash-sandbox run` loads on its way to the spawn.
_PRELOAD = (
    "bash_sandbox.cli.main",
    "bash_sandbox.executor",
    "bash_sandbox.confined_spawn",
    "bash_sandbox.backends.bwrap",
    "bash_sandbox.backends.landlock",
    "bash_sandbox.backends.landlock_only",
    "bash_sandbox.linux.supervisor",
    "bash_sandbox.git_spawn",
    "bash_sandbox.mirrors",
    "ipaddress",
    "landlockpy",
    "pyseccomp",
    "concurrent.futures.thread",  # the loop's default executor, imported on first use
    "tomllib",  # a workspace's pyproject.toml, read for the notice about its table
)
_REQUEST_TIMEOUT_S = 10.0
_HANGUP_GRACE_S = 5.0
_FORWARDED = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})


@dataclass
class _Call:
    conn: socket.socket
    pid: int
    # What a spare for the next call of this shape is made from: the key, the request and
    # a descriptor of its working directory (closed once the spare is forked).
    template: tuple[tuple[Any, ...], dict[str, Any], int] | None = None

    def drop_template(self) -> None:
        if self.template is not None:
            os.close(self.template[2])
            self.template = None


@dataclass
class _Spare:
    pid: int
    ctrl: socket.socket  # the daemon's end; closing it retires the spare
    born: float


@dataclass
class _Daemon:
    listener: socket.socket
    path: str
    idle_s: float
    lock: int  # the flock that makes this the socket's one daemon
    parser: CliArgumentParser
    code: CodeWatch  # the loaded modules' files
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    wake: tuple[int, int] = (-1, -1)
    retiring: bool = False  # its code changed: serves its running calls, takes no new ones
    calls: dict[int, _Call] = field(default_factory=dict)  # fork pid -> call
    spares: dict[tuple[Any, ...], _Spare] = field(default_factory=dict)  # call shape -> spare
    doomed: dict[int, float] = field(default_factory=dict)  # hung up: pid -> SIGKILL time
    last_active: float = field(default_factory=time.monotonic)

    def retire(self) -> None:
        """Let a daemon of the new code take the socket; exit once the running calls end."""
        self.retiring = True
        for key in list(self.spares):
            self.drop_spare(key)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self.listener.close()
        os.close(self.lock)

    def drop_spare(self, key: tuple[Any, ...]) -> None:
        """Close a spare's end: it closes its executor and exits (reaped like a call)."""
        kept = self.spares.pop(key, None)
        if kept is not None:
            kept.ctrl.close()

    def close_in_fork(self, conn: socket.socket | None) -> None:
        """The daemon's own descriptors, in a fork that is about to become the client's
        (``conn``, the call's own socket, stays: the fork answers on it) or a spare."""
        signal.set_wakeup_fd(-1)
        self.selector.close()
        self.listener.close()
        for call in self.calls.values():
            if call.conn is not conn:
                call.conn.close()
            call.drop_template()
        for kept in self.spares.values():
            kept.ctrl.close()
        for fd in (*self.wake, self.lock):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.code.close()  # this process's reference only: the daemon's watch stays


def _warm_up() -> CliArgumentParser:
    """Import what a run imports on its way, build the parser and the seccomp programs
    every run uses (made from the code alone), and seed the one host survey each run
    checks before it trusts it (`shadow_cache.seed`, with the daemon's HOME: a client with
    another surveys afresh). Nothing else a run reads from the host or the environment is
    computed here."""
    for name in _PRELOAD:
        with contextlib.suppress(ImportError):  # landlockpy, pyseccomp: Linux only
            importlib.import_module(name)
    with contextlib.suppress(Exception):
        import landlockpy

        # Its first call loads libc through `ctypes.util.find_library`, which runs
        # `ldconfig -p` (a process, some milliseconds): paid here once, not in every fork.
        # The answer itself is not kept: each run asks the kernel again.
        landlockpy.abi_version()
    with contextlib.suppress(Exception):  # no libseccomp (macOS): the runs say so themselves
        from bash_sandbox.linux import seccomp

        # Both filters are functions of the code and the architecture alone (cached per
        # process): compiled once here instead of in every fork, 3-5 ms each.
        seccomp.compile_notify_filter()
        seccomp.compile_seccomp(seccomp.SeccompOptions())
    with contextlib.suppress(Exception):
        from bash_sandbox.backends import shadow_cache
        from bash_sandbox.host_view import denied_paths
        from policies import default_deny_read

        # The read-only survey of the default deny list (17-19 ms, the largest part of a
        # fresh executor's first spawn): each fork checks its stamps before using it.
        shadow_cache.seed(denied_paths(default_deny_read()), ())
    from bash_sandbox.cli.arguments import build_parser
    from bash_sandbox.cli.settings import package_version

    parser = build_parser(package_version)
    # argparse compiles its patterns on the first parse (kept in `re`'s cache): once here.
    with contextlib.suppress(Exception):
        parser.parse_known_args(["run", "--mode", "read-only", "--", "true"])
    return parser


def _become_client(request: dict[str, Any], fds: list[int]) -> None:
    """In the fork: take the client's descriptors, directory, umask and environment."""
    stdin, stdout, stderr, cwd = fds
    _log.append(os.dup(2))  # the daemon's log, for what comes after the answer (`_reply`)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    os.fchdir(cwd)
    for fd in fds:
        os.close(fd)
    os.umask(int(request["umask"]))
    spare.adopt_environment({str(k): str(v) for k, v in dict(request["env"]).items()})
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=os.isatty(1)
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )


def _leave_daemon(daemon: _Daemon, conn: socket.socket | None) -> None:
    """In a new fork (a call's or a spare's): none of the daemon's descriptors or handlers."""
    daemon.close_in_fork(conn)
    for sig in (*_FORWARDED, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it


def _run_call(
    daemon: _Daemon,
    conn: socket.socket,
    request: dict[str, Any],
    fds: list[int],
    prepared: spare.Prepared | None = None,
) -> None:
    """The call, in its own process (a fork, or a spare handed it): never returns."""
    code = 70
    try:
        _become_client(request, fds)
        argv = [str(word) for word in request["argv"]]
        sys.argv = ["bash-sandbox", *argv]
        from bash_sandbox.cli.main import main
        from bash_sandbox.linux.inotify import leave_closing_to_exit

        leave_closing_to_exit()  # this process ends with the run: after its answer

        ready = prepared.take if prepared is not None and prepared.fits(request) else None
        code = main(argv, parser=daemon.parser, ready=ready, answer=lambda c: _reply(conn, c))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # the fork must never return into the daemon's loop
        with contextlib.suppress(Exception):
            sys.stderr.write(f"bash-sandbox: warm run failed: {exc!r}\n")
    finally:
        _reply(conn, code)
        if prepared is not None:
            prepared.close_unused()  # a spare's executor the call could not use
        os._exit(code)


def _run_spare(daemon: _Daemon, ctrl: socket.socket, template: dict[str, Any], cwd: int) -> None:
    """The spare (`spare.py`): prepare, wait for one call, serve it. Never returns."""
    try:
        _leave_daemon(daemon, None)
        prepared = spare.prepare(template, cwd, daemon.parser)
        os.close(cwd)
        handed = spare.wait_for_call(ctrl)
    except BaseException:
        os._exit(70)  # the daemon answers a call it handed over with this status
    if handed is None:
        if prepared is not None:
            prepared.close_unused()
        os._exit(0)
    request, fds = handed
    conn = socket.socket(fileno=fds[4])
    _run_call(daemon, conn, request, fds[:4], prepared)


_answered: list[int] = []  # in a call's process: the status its client was given
_log: list[int] = []  # in a call's process: the daemon's stderr, its log


def _reply(conn: socket.socket, code: int) -> None:
    """The run is over: its output flushed, tell the client now (once), not after the
    executor's teardown and this process's exit (the kernel's teardown of its inotify
    instances, mappings and threads takes milliseconds nobody needs to wait for). The
    write side is then shut down, so the daemon's own reply at the reap fails quietly (and
    the SIGHUP it sends when the client, answered, closes its end changes nothing the
    client can see); a process that dies before this point is answered by the daemon,
    with its signal."""
    if _answered:
        return
    _answered.append(code)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(Exception):
        wire.send_frame(conn, {"exit": code})
        conn.shutdown(socket.SHUT_WR)
    _release_stdio()


def _release_stdio() -> None:
    """Let go of the client's stdin, stdout and stderr with the answer: a caller that reads
    them to their end (pipes) is done when the client exits, not when this process has
    closed its executor (a fresh process holds them until its exit, milliseconds later).
    What the teardown still writes goes to the daemon's log."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        for fd, target in ((null, 0), (null, 1), (_log[0] if _log else null, 2)):
            os.dup2(fd, target)
        os.close(null)


def _accept(daemon: _Daemon) -> None:
    try:
        conn, _ = daemon.listener.accept()
    except BlockingIOError:
        return
    daemon.last_active = time.monotonic()
    try:
        if wire.peer_uid(conn) != os.geteuid():
            conn.close()  # another user: never served, told nothing
            return
        # The connector's gid and groups as the kernel recorded them at its connect (the
        # sender's whole credentials are read below): judged with the request, so a caller
        # of this uid with other groups is told to run fresh, not left without an answer.
        connector = wire.peer_identity(conn)
        conn.settimeout(_REQUEST_TIMEOUT_S)
        # The whole request within the timeout: one trickled in a byte at a time held the
        # daemon (and every other client) as long as the sender liked.
        deadline = time.monotonic() + _REQUEST_TIMEOUT_S
        request, fds, (sender, pidfd) = wire.recv_request(conn, max_fds=4, deadline=deadline)
    except OSError:
        conn.close()
        return
    stale = daemon.code.changed()
    # The request's sender, not only the connector: a confined command's connect is made
    # for it by its executor (whose credentials the socket then carries), its frames are its
    # own; pinned by its pidfd where the kernel gives one, so its pid reused meanwhile by an
    # unconfined process does not pass for it. The call runs with the daemon's credentials,
    # so the sender must hold exactly those (groups, capabilities, namespaces, ...): a
    # caller with fewer runs fresh, with its own.
    try:
        own = connector == wire.own_identity() and wire.holds_own_rights(sender, pidfd)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    if len(fds) != 4 or stale or not own:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            wire.send_frame(conn, {"stale": stale})
        conn.close()
        if stale:
            daemon.retire()
        return
    key = _call_shape(request, fds[3])
    pid = None if key is None else _to_spare(daemon, key, request, [*fds, conn.fileno()])
    if pid is None:
        pid = os.fork()
        if pid == 0:
            _leave_daemon(daemon, conn)
            _run_call(daemon, conn, request, fds)
    call = _Call(conn, pid)
    if key is not None and not daemon.retiring:
        call.template = (key, request, os.dup(fds[3]))
    for fd in fds:
        os.close(fd)
    daemon.calls[pid] = call
    daemon.selector.register(conn, selectors.EVENT_READ, pid)


def _call_shape(request: dict[str, Any], cwd: int) -> tuple[Any, ...] | None:
    """Which spare a call may fit: its options (the words before `--`), environment, umask
    and directory; None for a request the fork will refuse. Only a routing hint: the spare
    checks the call itself (`spare.py`)."""
    try:
        argv = [str(word) for word in request["argv"]]
        options = argv[: argv.index("--")] if "--" in argv else argv
        st = os.fstat(cwd)
        env = tuple(sorted((str(k), str(v)) for k, v in dict(request["env"]).items()))
        return (tuple(options), env, int(request["umask"]), st.st_dev, st.st_ino)
    except (KeyError, TypeError, ValueError, OSError):
        return None


def _to_spare(
    daemon: _Daemon, key: tuple[Any, ...], request: dict[str, Any], fds: list[int]
) -> int | None:
    """Hand the call to the spare made for its shape; its pid, or None (fork instead)."""
    kept = daemon.spares.pop(key, None)
    if kept is None:
        return None
    body = spare.encode_call(request)
    handed = body is not None and spare.hand_over(kept.ctrl, body, fds)
    kept.ctrl.close()  # handed over: its end of file comes after the call, unread
    return kept.pid if handed else None


def _make_spare(daemon: _Daemon, call: _Call) -> None:
    """After a call ends: a spare for the next call of its shape (none while retiring)."""
    template, call.template = call.template, None
    if template is None:
        return
    key, request, cwd = template
    try:
        if daemon.retiring or key in daemon.spares:
            return
        if len(daemon.spares) >= spare.MAX_SPARES:
            daemon.drop_spare(min(daemon.spares, key=lambda k: daemon.spares[k].born))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            ours.close()
            _run_spare(daemon, theirs, request, cwd)
        theirs.close()
        daemon.spares[key] = _Spare(pid, ours, time.monotonic())
    finally:
        os.close(cwd)


def _expire_spares(daemon: _Daemon) -> None:
    now = time.monotonic()
    for key, kept in list(daemon.spares.items()):
        if kept.born + spare.MAX_AGE_S <= now:
            daemon.drop_spare(key)


def _from_client(daemon: _Daemon, pid: int) -> None:
    call = daemon.calls.get(pid)
    if call is None:
        return
    try:
        message = wire.recv_frame(call.conn)
    except OSError:
        message = None
    if message is None:
        # The client is gone: hang the run up (it stops its command and cleans up, as on a
        # terminal's hangup), and SIGKILL it if it is still there after a grace period.
        daemon.selector.unregister(call.conn)
        daemon.doomed[pid] = time.monotonic() + _HANGUP_GRACE_S
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGHUP)
        return
    signum = message.get("signal")
    if isinstance(signum, int) and signum in _FORWARDED:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _reap(daemon: _Daemon) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        daemon.doomed.pop(pid, None)
        call = daemon.calls.pop(pid, None)
        if call is None:
            for key, kept in list(daemon.spares.items()):
                if kept.pid == pid:  # died waiting: its end would refuse the hand-over
                    daemon.drop_spare(key)
            continue
        daemon.last_active = time.monotonic()
        with contextlib.suppress(KeyError, ValueError):
            daemon.selector.unregister(call.conn)
        reply: dict[str, int] = (
            {"signal": os.WTERMSIG(status)}
            if os.WIFSIGNALED(status)
            else {"exit": os.WEXITSTATUS(status)}
        )
        with contextlib.suppress(OSError):
            wire.send_frame(call.conn, reply)
        call.conn.close()
        _make_spare(daemon, call)


def _kill_overdue(daemon: _Daemon) -> None:
    now = time.monotonic()
    for pid, deadline in list(daemon.doomed.items()):
        if deadline <= now:
            del daemon.doomed[pid]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def serve(path: str, idle_s: float, lock: int) -> None:
    """Serve on ``path`` until idle; ``lock``: the daemon lock, held."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # inherited by each call
    with contextlib.suppress(OSError):  # Linux 6.5+: the sender's pidfd too
        listener.setsockopt(socket.SOL_SOCKET, wire.SO_PASSPIDFD, 1)
    wire.at_path(listener, path, bind=True)
    listener.listen(64)
    listener.setblocking(False)
    parser = _warm_up()
    daemon = _Daemon(listener, path, idle_s, lock, parser, CodeWatch())
    gc.freeze()  # the forks share these pages instead of copying them on the first collection
    daemon.wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(daemon.wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    daemon.selector.register(listener, selectors.EVENT_READ, "listen")
    daemon.selector.register(daemon.wake[0], selectors.EVENT_READ, "wake")
    try:
        while daemon.calls or not daemon.retiring:
            now = time.monotonic()
            deadlines = [kept.born + spare.MAX_AGE_S for kept in daemon.spares.values()]
            deadlines += daemon.doomed.values()
            if not daemon.calls:
                if daemon.last_active + idle_s <= now:
                    return  # the spares see their ends close with this process
                deadlines.append(daemon.last_active + idle_s)
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            for key, _ in daemon.selector.select(timeout):
                if key.data == "listen":
                    _accept(daemon)
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(daemon.wake[0], 512)
                else:
                    _from_client(daemon, int(key.data))
            _reap(daemon)
            _kill_overdue(daemon)
            _expire_spares(daemon)
    finally:
        if not daemon.retiring:
            # Unlinked under the lock: a client that finds no socket starts a new daemon.
            with contextlib.suppress(OSError):
                os.unlink(path)
            listener.close()


def main(argv: list[str]) -> int:
    path = argv[0]
    idle_s = float(os.environ.get(wire.IDLE_ENV) or wire.DEFAULT_IDLE_S)
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another daemon serves this socket
    os.ftruncate(lock, 0)
    os.write(lock, f"{os.getpid()}\n".encode())
    os.chdir("/")  # not the first caller's directory, held for as long as the daemon lives
    serve(path, idle_s, lock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
