"""Host-side targets of the audit and the outside view that checks them.

Everything here is created by the audit itself: victim processes it started (known by pid),
servers it bound on 127.0.0.1/::1 or under its own directory (counting what reaches them),
file trees under its own directory (compared before and after), and a scan of /proc for
processes carrying the run's random token. Nothing here touches anything the audit did not
create, and every process or socket is registered with a `Cleanup` that ends it by pid or
handle, also when the audit is interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import os
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bash_sandbox_audit.programs import program_text

log = logging.getLogger("bash_sandbox_audit")

# -- cleanup ------------------------------------------------------------------------------------


class Cleanup:
    """Undo steps of one attack run, run last-in first-out; each step runs even if one fails."""

    def __init__(self) -> None:
        self._steps: list[Callable[[], object]] = []

    def add(self, step: Callable[[], object]) -> None:
        self._steps.append(step)

    def kill_process(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL a process the audit started (by its pid) and reap it."""

        def kill() -> None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

        self.add(kill)

    async def run(self) -> None:
        while self._steps:
            step = self._steps.pop()
            try:
                result = step()
                if inspect.isawaitable(result):
                    await result
            except Exception:  # one failed undo step must not skip the others
                log.exception("audit cleanup step failed")


# -- files -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """What the outside view compares for one path (never atime: reads may change it)."""

    kind: str
    mode: int
    uid: int
    gid: int
    size: int
    ino: int
    nlink: int
    mtime_ns: int
    ctime_ns: int
    digest: str
    xattrs: tuple[str, ...]


def _entry(path: str) -> Entry:
    st = os.lstat(path)
    digest = ""
    if stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        digest = h.hexdigest()
    elif stat.S_ISLNK(st.st_mode):
        digest = "-> " + os.readlink(path)
    try:
        xattrs = tuple(sorted(os.listxattr(path, follow_symlinks=False)))
    except OSError:
        xattrs = ()
    kind = (
        "dir"
        if stat.S_ISDIR(st.st_mode)
        else "file"
        if stat.S_ISREG(st.st_mode)
        else "link"
        if stat.S_ISLNK(st.st_mode)
        else "other"
    )
    return Entry(
        kind,
        stat.S_IMODE(st.st_mode),
        st.st_uid,
        st.st_gid,
        st.st_size,
        st.st_ino,
        st.st_nlink,
        st.st_mtime_ns,
        st.st_ctime_ns,
        digest,
        xattrs,
    )


Snapshot = dict[str, Entry]


def snapshot(root: str) -> Snapshot:
    """Every path under ``root`` (not following links) with its content digest and metadata."""
    out: Snapshot = {}
    if not os.path.lexists(root):
        return out
    out["."] = _entry(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            with contextlib.suppress(FileNotFoundError):
                out[os.path.relpath(full, root)] = _entry(full)
    return out


def snapshot_diff(before: Snapshot, after: Snapshot, label: str) -> list[str]:
    """Human-readable differences, e.g. ``host/victim.txt: digest changed``."""
    changes: list[str] = []
    for rel in sorted(set(before) | set(after)):
        name = f"{label}/{rel}" if rel != "." else label
        old, new = before.get(rel), after.get(rel)
        if old is None:
            changes.append(f"{name}: created ({new.kind if new else '?'})")
        elif new is None:
            changes.append(f"{name}: removed")
        elif old != new:
            fields = [f for f in Entry.__dataclass_fields__ if getattr(old, f) != getattr(new, f)]
            changes.append(f"{name}: {', '.join(fields)} changed")
    return changes


# -- processes ---------------------------------------------------------------------------------


@dataclass
class Victim:
    """A process outside the sandbox, started by the audit, watched from outside."""

    proc: subprocess.Popen[bytes]
    status_path: str
    address: int = 0
    size: int = 0
    held_fd: int = -1
    memory: str = ""
    secret: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_lines(self) -> list[str]:
        try:
            with open(self.status_path) as fh:
                return fh.read().splitlines()
        except FileNotFoundError:
            return []

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            return False
        return proc_field(self.pid, "State", "?")[:1] not in ("Z", "X", "?")

    def state(self) -> str:
        return proc_field(self.pid, "State", "?")

    def tracer(self) -> int:
        return int(proc_field(self.pid, "TracerPid", "0"))

    def findings(self) -> list[str]:
        """Everything the victim reported besides being ready: signals, tracing, memory."""
        bad = [line for line in self.log_lines() if not line.startswith("READY")]
        if not self.alive():
            bad.append(f"victim {self.pid} is dead ({self.proc.returncode})")
        elif self.state().startswith("T"):
            bad.append(f"victim {self.pid} is stopped ({self.state()})")
        if self.alive() and self.tracer() != 0:
            bad.append(f"victim {self.pid} is traced by {self.tracer()}")
        return bad


def _spawn_victim(
    python: str, *, status_path: str, cwd: str, held_path: str, memory: str, secret: str
) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "VICTIM_MEMORY": memory,
        "VICTIM_SECRET": secret,
    }
    # Forked on the event-loop thread (fork+exec, no waiting): the victim's PDEATHSIG follows
    # the thread that forked it, and this one lives as long as the audit.
    return subprocess.Popen(
        [python, "-c", program_text("victim.py"), status_path, str(os.getpid()), held_path],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


async def start_victim(
    python: str,
    directory: str,
    cwd: str,
    held_path: str,
    cleanup: Cleanup,
    *,
    memory: str,
    secret: str,
) -> Victim:
    """Start a victim in its own session (so group signals reach only it) and wait for READY."""
    status_path = os.path.join(directory, f"victim-{os.urandom(4).hex()}.log")
    proc = _spawn_victim(
        python, status_path=status_path, cwd=cwd, held_path=held_path, memory=memory, secret=secret
    )
    cleanup.kill_process(proc)
    victim = Victim(proc, status_path, memory=memory, secret=secret)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in victim.log_lines():
            if line.startswith("READY"):
                _, _pid, addr, size, held = line.split()
                victim.address, victim.size, victim.held_fd = int(addr), int(size), int(held)
                return victim
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.01)
    raise RuntimeError(f"victim process did not become ready (exit {proc.poll()})")


def proc_field(pid: int, name: str, default: str = "") -> str:
    """A field of /proc/<pid>/status (e.g. ``TracerPid``), or ``default``."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key == name:
                    return value.strip()
    except OSError:
        pass
    return default


def proc_stat_fields(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (field 3 onwards)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return []


@dataclass(frozen=True)
class TaggedProcess:
    pid: int
    cmdline: str


def find_tagged(token: str) -> list[TaggedProcess]:
    """Live processes whose command line or environment carries ``token`` (zombies excluded)."""
    needle = token.encode()
    found: list[TaggedProcess] = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        hit = needle in cmdline
        if not hit:
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    hit = needle in fh.read()
            except OSError:
                hit = False
        if hit and proc_field(pid, "State", "Z")[:1] not in ("Z", "X"):
            text = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
            found.append(TaggedProcess(pid, text[:120]))
    return found


async def scan_tagged(token: str, interval_s: float) -> tuple[list[TaggedProcess], float]:
    """`find_tagged` in a thread, and how long to sleep before the next scan.

    A scan reads two files of every process on the host; on a loaded machine with thousands of
    processes it takes long, and a read of one process's cmdline waits on that process's memory
    lock. Off the event loop, the other cells' spawns go on meanwhile; sleeping at least as long
    as the scan took keeps concurrent cells from holding the machine in /proc.
    """
    start = time.monotonic()
    found = await asyncio.to_thread(find_tagged, token)
    return found, max(interval_s, time.monotonic() - start)


async def wait_tagged_gone(token: str, timeout_s: float) -> list[TaggedProcess]:
    """Poll until no process carries ``token``; returns the survivors at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive, pause = await scan_tagged(token, 0.05)
        if not alive or time.monotonic() >= deadline:
            return alive
        await asyncio.sleep(pause)


def kill_tagged(token: str) -> list[TaggedProcess]:
    """SIGKILL, by pid, every process carrying this run's token (the last line of defence)."""
    survivors = find_tagged(token)
    for p in survivors:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p.pid, signal.SIGKILL)
    return survivors


def remove_path(path: str) -> None:
    """Remove a file the audit made (or an attack may have made); absent is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return proc_field(pid, "State", "Z")[:1] not in ("Z", "X")


# -- servers -----------------------------------------------------------------------------------


@dataclass
class CountingServer:
    """A socket the audit listens on; it counts connections or datagrams that reach it."""

    sock: socket.socket
    kind: str
    address: str
    hits: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._serve, name=f"audit-{self.kind}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        # Connection-oriented sockets count accepted connections, the others datagrams.
        stream = self.sock.type in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET)
        while not self._stop.is_set():
            try:
                if stream:
                    conn, _ = self.sock.accept()
                    conn.close()
                else:
                    self.sock.recvfrom(65536)
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                return
            self.hits += 1

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.sock.close()


def start_server(
    family: socket.AddressFamily,
    kind: socket.SocketKind,
    address: str | tuple[str, int],
    label: str,
    cleanup: Cleanup,
) -> CountingServer:
    """Bind (and listen) on ``address``; raises OSError when this host cannot (e.g. no ::1)."""
    sock = socket.socket(family, kind)
    try:
        sock.bind(address)
        if kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET):
            sock.listen(16)
    except OSError:
        sock.close()
        raise
    server = CountingServer(sock, label, str(sock.getsockname()))
    server.start()
    cleanup.add(server.close)
    return server


# -- memory ------------------------------------------------------------------------------------


def status_kib(field_name: str, pid: int | str = "self") -> int:
    """A ``VmRSS``/``VmHWM``-style field of /proc/<pid>/status, in KiB (0 if absent)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


async def poll_until(
    check: Callable[[], bool | Awaitable[bool]], timeout_s: float, interval_s: float = 0.02
) -> bool:
    """Poll ``check`` until it is true or the deadline passes (an outside-view wait)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval_s)
