"""The warm CLI's client: `bash-sandbox run` through this uid's daemon (`daemon.py`).

Built-in modules only before it connects (the point is to skip the CLI's imports). It
sends the arguments, the environment, the umask and four descriptors (stdin, stdout,
stderr, the working directory), forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to the run, and
exits with the run's status. `run()` returns None whenever the daemon cannot take the
call (none yet and none could be started, its code changed, another uid's socket), and the
caller then runs fresh, as without the daemon: the daemon is a cache, never a requirement.
"""

from __future__ import annotations

import _signal  # `signal` imports enum: 9 ms here (no stub: pyproject)
import _socket
import os
import sys
import time

from bash_sandbox.warm import wire

_START_WAIT_S = 5.0
# A daemon that died starting (its log says why) is not started again for this long: each
# call runs fresh meanwhile, instead of waiting for a daemon that cannot come up.
_RETRY_AFTER_S = 60.0
# The daemon imports the package from where this client's came from, not from whatever
# `PYTHONPATH` the first caller had (`-I`: a long-lived process keeps no caller's paths).
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[2]); "
    "from bash_sandbox.warm.daemon import main; raise SystemExit(main(sys.argv[1:2]))"
)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Signalled:
    """The run's process died of ``signum``. (Not a NamedTuple: no typing import here.)"""

    __slots__ = ("signum",)

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __repr__(self) -> str:
        return f"Signalled({self.signum})"


def wanted(argv: list[str]) -> bool:
    """Whether this call goes through the daemon: asked for, and a `run`."""
    return os.environ.get(wire.ENABLE_ENV) == "1" and bool(argv) and argv[0] == "run"


def _connect(path: str) -> _socket.socket | None:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        wire.at_path(sock, path, bind=False)
        pid, uid = wire.peer_creds(sock)
        if uid != os.geteuid():
            raise PermissionError("the daemon runs as another user")
        pidfd = wire.peer_pidfd(sock)  # pinned: the listener's pid reused meanwhile fails
        try:
            if not wire.unconfined_peer(pid, pidfd):
                raise PermissionError("the socket's listener is a confined command")
        finally:
            if pidfd is not None:
                os.close(pidfd)
    except OSError:
        sock.close()
        return None
    return sock


def _start_daemon(path: str) -> int | None:
    """A detached daemon (its own session, stdio on /dev/null, reparented to init); a
    pidfd of it (None: none could be opened, or it is gone already)."""
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.setsid()
            daemon = os.fork()
            if daemon:
                os.write(ready_w, daemon.to_bytes(4, "little"))
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            log = os.open(
                f"{path}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600
            )
            for fd, to in ((null, 0), (null, 1), (log, 2)):  # its stderr: what went wrong
                os.dup2(fd, to)
            # Nothing of the caller's: an inherited pipe held by a daemon that outlives
            # the call would keep its reader waiting for an end of file.
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            argv = [sys.executable, "-I", "-c", _BOOT, path, _ROOT]
            os.execv(sys.executable, argv)  # noqa: S606 (our own interpreter, no shell)
        finally:
            os._exit(127)
    os.close(ready_w)
    os.waitpid(pid, 0)
    try:
        raw = os.read(ready_r, 4)
    finally:
        os.close(ready_r)
    if len(raw) != 4:
        return None
    try:
        # Opened after it was forked: if it died and was reaped meanwhile, this fails (or,
        # its pid reused within that instant, watches another process: a wait, no harm).
        return os.pidfd_open(int.from_bytes(raw, "little"))
    except OSError:
        return None


def _failed_lately(path: str) -> bool:
    try:
        return time.time() - os.stat(f"{path}.failed").st_mtime < _RETRY_AFTER_S
    except OSError:
        return False


def _note_failure(path: str) -> None:
    try:
        os.close(os.open(f"{path}.failed", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        os.utime(f"{path}.failed")
    except OSError:
        pass  # the next call tries again: slower, not wrong


def _connect_or_start(key: str | None) -> _socket.socket | None:
    directory = wire.private_dir()
    if directory is None:
        return None
    path = os.path.join(directory, wire.socket_name(key))
    sock = _connect(path)
    if sock is not None:
        return sock
    if _failed_lately(path):
        return None
    pidfd = _start_daemon(path)
    deadline = time.monotonic() + _START_WAIT_S
    delay = 0.002
    try:
        while time.monotonic() < deadline:
            sock = _connect(path)
            if sock is not None:
                return sock
            if pidfd is not None and _exited(pidfd):
                # It died starting (an install it cannot import from, say; its log says):
                # this call runs fresh at once, and the next minute's calls do not wait.
                sock = _connect(path)  # another caller's daemon may have won the lock
                if sock is None:
                    _note_failure(path)
                return sock
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return None


def _exited(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has exited (readable once it has)."""
    import select  # built-in; only on the slow path of a daemon start

    return bool(select.select([pidfd], [], [], 0)[0])


def run(argv: list[str], key: str | None = None) -> int | Signalled | None:
    """The run's exit status (or its signal), or None: run fresh instead (nothing ran).
    ``key``: the daemon's name, when the native client handed the call over (`wire.KEY_ENV`)."""
    sock = _connect_or_start(key)
    if sock is None:
        return None
    cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    umask = os.umask(0)
    os.umask(umask)
    request = {"argv": argv, "env": dict(os.environ), "umask": umask}
    try:
        wire.send_frame(sock, request, [0, 1, 2, cwd])
    except OSError:
        sock.close()
        return None
    finally:
        os.close(cwd)

    def forward(signum: int, _frame: object) -> None:
        # Not contextlib.suppress: contextlib is not on this path.
        try:  # noqa: SIM105
            wire.send_frame(sock, {"signal": signum})
        except OSError:
            pass  # the daemon is gone: the answer below says so

    for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT):
        if _signal.getsignal(sig) is not _signal.SIG_IGN:
            _signal.signal(sig, forward)
    try:
        reply = wire.recv_answer(sock)
    except OSError:
        reply = None
    finally:
        sock.close()
    answer = reply or {}
    if "stale" in answer:
        return None  # refused before anything ran
    if "signal" in answer:
        return Signalled(int(answer["signal"]))
    if "exit" in answer:
        return int(answer["exit"])
    # The daemon died under the run (killed), or answered what no daemon sends: the run is
    # gone with it, and running it again could run it twice.
    sys.stderr.write("bash-sandbox: the warm daemon went away during the run\n")
    return 70
