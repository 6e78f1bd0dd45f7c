"""The warm CLI's daemon: a per-user process that has imported the CLI once and forks a
copy of itself for each `bash-sandbox run`.

What a call shares with the calls before it: only the modules imported at the daemon's
start, the argument parser built from them, the two seccomp programs compiled from them,
and one survey of the default `deny_read` (`shadow_cache.seed`), which each call checks
against the host's stamps before it uses it, as an executor does between its own commands.
No executor, config or probe result is made before the fork, and nothing a call learns
goes back to the daemon. The fork then becomes the client's process as far as the run can
tell: the client's stdin, stdout and stderr (dup'ed onto 0, 1 and 2), its working directory
(a descriptor, so a rename in between cannot redirect it), its umask and its whole
environment; then it runs the same `main()` a fresh `bash-sandbox` runs. So the config
file, the session log, the probe cache and every policy are read as a fresh process reads
them. The fork answers the client itself once `main()` has returned, before its own exit
(which closes its inotify instances: closing them first would wait out a kernel grace
period, 15-16 ms).

The daemon serves only its own uid (SO_PEERCRED), from a socket in the uid's private
directory, and only a request whose sender (SCM_CREDENTIALS: the process that wrote it,
not the one that connected) is as free as the daemon (`wire.unconfined_peer`): a confined
command reaching the socket is never served. It forwards the client's interrupt signals to
the fork, hangs the fork up if the client goes away (SIGHUP: it stops its command and cleans
up; SIGKILL after a grace period), and exits after `IDLE_ENV` seconds without a call, or at
once when its own code changed on disk (the client then runs fresh).

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

from bash_sandbox.warm import wire

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
)
_PREFIXES = ("bash_sandbox", "bash_local", "bash_seam", "policies")
_REQUEST_TIMEOUT_S = 10.0
_HANGUP_GRACE_S = 5.0
_FORWARDED = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})


@dataclass
class _Call:
    conn: socket.socket
    pid: int


@dataclass
class _Daemon:
    listener: socket.socket
    path: str
    idle_s: float
    lock: int  # the flock that makes this the socket's one daemon
    parser: CliArgumentParser
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    wake: tuple[int, int] = (-1, -1)
    retiring: bool = False  # its code changed: serves its running calls, takes no new ones
    code: dict[str, int] = field(default_factory=dict)  # module file -> mtime at start
    calls: dict[int, _Call] = field(default_factory=dict)  # fork pid -> call
    doomed: dict[int, float] = field(default_factory=dict)  # hung up: pid -> SIGKILL time
    last_active: float = field(default_factory=time.monotonic)

    def retire(self) -> None:
        """Let a daemon of the new code take the socket; exit once the running calls end."""
        self.retiring = True
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self.listener.close()
        os.close(self.lock)

    def close_in_fork(self, conn: socket.socket) -> None:
        """The daemon's own descriptors, in a fork that is about to become the client's
        (``conn``, the call's own socket, stays: the fork answers on it)."""
        self.selector.close()
        self.listener.close()
        for call in self.calls.values():
            call.conn.close()
        for fd in (*self.wake, self.lock):
            with contextlib.suppress(OSError):
                os.close(fd)

    def code_changed(self) -> bool:
        for path, mtime in self.code.items():
            try:
                if os.stat(path).st_mtime_ns != mtime:
                    return True
            except OSError:
                return True
        return False


def _loaded_code() -> dict[str, int]:
    code: dict[str, int] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and name.split(".")[0] in _PREFIXES:
            with contextlib.suppress(OSError):
                code[path] = os.stat(path).st_mtime_ns
    return code


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
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    os.fchdir(cwd)
    for fd in fds:
        os.close(fd)
    os.umask(int(request["umask"]))
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})
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


def _run_fork(
    daemon: _Daemon, conn: socket.socket, request: dict[str, Any], fds: list[int]
) -> None:
    """The forked call: never returns."""
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        daemon.close_in_fork(conn)
        for sig in (*_FORWARDED, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it
        _become_client(request, fds)
        argv = [str(word) for word in request["argv"]]
        sys.argv = ["bash-sandbox", *argv]
        from bash_sandbox.cli.main import main
        from bash_sandbox.linux.inotify import leave_closing_to_exit

        leave_closing_to_exit()  # this process ends with the run: after its answer

        code = main(argv, parser=daemon.parser)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # the fork must never return into the daemon's loop
        with contextlib.suppress(Exception):
            sys.stderr.write(f"bash-sandbox: warm run failed: {exc!r}\n")
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        _reply_and_exit(conn, code)


def _reply_and_exit(conn: socket.socket, code: int) -> None:
    """The run is over (its output flushed): tell the client now, not after this process's
    exit (the kernel's teardown of its inotify instances, mappings and threads takes
    milliseconds nobody needs to wait for). The write side is then shut down, so the
    daemon's own reply at the reap fails quietly (and the SIGHUP it sends when the client,
    answered, closes its end changes nothing the client can see); a fork that dies before
    this point is answered by the daemon, with its signal."""
    with contextlib.suppress(Exception):
        wire.send_frame(conn, {"exit": code})
        conn.shutdown(socket.SHUT_WR)
    os._exit(code)


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
        conn.settimeout(_REQUEST_TIMEOUT_S)
        request, fds, sender = wire.recv_request(conn, max_fds=4)
    except OSError:
        conn.close()
        return
    stale = daemon.code_changed()
    # The request's sender, not the connector: a confined command's connect is made for it
    # by its executor (whose credentials the socket then carries), its frames are its own.
    if len(fds) != 4 or stale or not wire.unconfined_peer(sender):
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            wire.send_frame(conn, {"stale": stale})
        conn.close()
        if stale:
            daemon.retire()
        return
    pid = os.fork()
    if pid == 0:
        _run_fork(daemon, conn, request, fds)
    for fd in fds:
        os.close(fd)
    daemon.calls[pid] = _Call(conn, pid)
    daemon.selector.register(conn, selectors.EVENT_READ, pid)


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
    wire.at_path(listener, path, bind=True)
    listener.listen(64)
    listener.setblocking(False)
    parser = _warm_up()
    daemon = _Daemon(listener, path, idle_s, lock, parser, code=_loaded_code())
    gc.freeze()  # the forks share these pages instead of copying them on the first collection
    daemon.wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(daemon.wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    daemon.selector.register(listener, selectors.EVENT_READ, "listen")
    daemon.selector.register(daemon.wake[0], selectors.EVENT_READ, "wake")
    try:
        while daemon.calls or not daemon.retiring:
            timeout = max(0.0, daemon.last_active + idle_s - time.monotonic())
            if not daemon.calls and timeout == 0:
                return
            if daemon.doomed:
                timeout = max(0.0, min(daemon.doomed.values()) - time.monotonic())
            for key, _ in daemon.selector.select(
                timeout if daemon.doomed or not daemon.calls else None
            ):
                if key.data == "listen":
                    _accept(daemon)
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(daemon.wake[0], 512)
                else:
                    _from_client(daemon, int(key.data))
            _reap(daemon)
            _kill_overdue(daemon)
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
    serve(path, idle_s, lock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
