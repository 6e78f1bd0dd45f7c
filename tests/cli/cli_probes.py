"""Outside views for the CLI tests: run the CLI as a process, find and watch host pids.

Named apart from conftest so test modules import it unambiguously next to other suites.
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import time
import tty
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path


class CliRunner:
    """Starts `bash-sandbox` processes and remembers their pids for teardown."""

    def __init__(self, argv0: Sequence[str], env: dict[str, str]) -> None:
        self.argv0 = list(argv0)
        self.env = env
        self.pids: list[int] = []

    def start(
        self,
        *args: str,
        cwd: Path | None = None,
        wrapper: Sequence[str] = (),
        stdout: int = subprocess.PIPE,
        stderr: int = subprocess.PIPE,
    ) -> subprocess.Popen[bytes]:
        """Start the CLI (behind ``wrapper``, an argv prefix that execs the rest); ``stdout``
        and ``stderr`` may be descriptors (a pty) or `subprocess.STDOUT`."""
        proc = subprocess.Popen(
            [*wrapper, *self.argv0, *args],
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=cwd,
        )
        self.pids.append(proc.pid)
        return proc

    def run(
        self, *args: str, cwd: Path | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[bytes]:
        proc = self.start(*args, cwd=cwd)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def kill_all(self) -> None:
        for pid in [*self.pids]:
            kill_if_alive(pid)


def is_alive(pid: int) -> bool:
    """Seen from outside: does ``pid`` still run? A zombie counts as dead (init may not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: fall back to a null signal
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


def kill_if_alive(pid: int) -> None:
    if is_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_until(
    predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Poll something another process produces (a file, a pid); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(0.01)


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's), read from /proc."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as fh:
            found += [int(p) for p in fh.read().split()]
    return found


def host_pids_with_argv(argv: Sequence[str]) -> list[int]:
    """Host pids whose command line is exactly ``argv``.

    A confined command runs in its own PID namespace: the `$!` it prints is a namespace pid,
    so the tests find the host pid by a unique argv instead.
    """
    wanted = b"\0".join(a.encode() for a in argv) + b"\0"
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read() == wanted:
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _has_bwrap() -> bool:
    from bash_sandbox.backends.bwrap import find_bwrap

    return find_bwrap() is not None


def _landlock_abi() -> int:
    from bash_sandbox.backends.landlock import landlock_abi

    return landlock_abi()


HAS_BWRAP = _has_bwrap()
HAS_LANDLOCK = _landlock_abi() > 0


def read_until(fd: int, needle: bytes, seen: bytearray, timeout: float = 20.0) -> bytes:
    """Read ``fd`` into ``seen`` until ``needle`` appears in it; fail after ``timeout``.

    Returns everything seen so far. An end of file before the needle fails at once.
    """
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{needle!r} not read within {timeout} s; got {bytes(seen)!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # a pty master reads EIO once the slave side is closed
            chunk = b""
        if not chunk:
            raise AssertionError(f"end of output before {needle!r}; got {bytes(seen)!r}")
        seen.extend(chunk)
    return bytes(seen)


def read_to_end(fd: int, seen: bytearray, timeout: float = 20.0) -> bytes:
    """Read ``fd`` into ``seen`` until end of file (EIO on a pty master)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no end of output within {timeout} s; got {bytes(seen)!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            return bytes(seen)
        seen.extend(chunk)


@contextlib.contextmanager
def raw_pty() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal in raw mode (no `\\n` -> `\\r\\n`, no echo): (master, slave)."""
    master, slave = pty.openpty()
    try:
        tty.setraw(slave)
        yield master, slave
    finally:
        for fd in (master, slave):
            with contextlib.suppress(OSError):
                os.close(fd)


def write_user_config(config_home: Path, body: str) -> Path:
    """The user config file (`$XDG_CONFIG_HOME/bash-sandbox/config.toml`) holding ``body``."""
    directory = config_home / "bash-sandbox"
    directory.mkdir(exist_ok=True)
    path = directory / "config.toml"
    path.write_text(body)
    return path


def warm_daemon_pids(private: Path) -> list[int]:
    """The warm daemons whose locks are in the private directory ``private``."""
    pids = []
    for lock in private.glob("warm-*.sock.lock"):
        with contextlib.suppress(ValueError, OSError):
            pids.append(int(lock.read_text().split()[0]))
    return pids


def stop_warm_daemons(private: Path) -> None:
    """Kill the daemons of ``private`` by pid; their spares close their executors and exit
    once the daemon is gone (any left are killed)."""
    daemons = warm_daemon_pids(private)
    spares = [pid for daemon in daemons if is_alive(daemon) for pid in children(daemon)]
    for pid in daemons:
        kill_if_alive(pid)
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not any(map(is_alive, spares)), timeout=10, what="spares gone")
    for pid in spares:
        kill_if_alive(pid)


def warm_setup(private_tempdir: Path, config_home: Path) -> tuple[Path, dict[str, str]]:
    """A test's own private directory for warm daemons, and the environment of calls that
    use it (the daemon wanted, an idle exit within the suite's time)."""
    from bash_sandbox.warm import wire

    private = private_tempdir / f"bash-sandbox-{os.geteuid()}"
    private.mkdir(mode=0o700)
    env = dict(
        os.environ,
        TMPDIR=str(private_tempdir),
        XDG_CONFIG_HOME=str(config_home),
        **{wire.ENABLE_ENV: "1", wire.IDLE_ENV: "60"},
    )
    return private, env
