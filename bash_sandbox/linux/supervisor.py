"""The seccomp supervisor: answers the calls the supervised filter hands to the executor.

Every confined command carries a filter (`seccomp.render_notify_rules`) whose user
notifications arrive here, on one thread per executor (epoll over every command's listener).
The supervisor never lets the kernel continue a call it checked (`SECCOMP_USER_NOTIF_FLAG_
CONTINUE` would re-read the arguments after the check, and another thread of the command could
change them in between). Instead it *performs* the allowed call itself on a duplicate of the
command's socket (`pidfd_getfd`) with the address it copied and checked, and returns the
result:

- `connect()` to AF_INET/AF_INET6: under an isolated network only loopback (the namespace's
  own) is reachable; other destinations are refused with ENETUNREACH and recorded as network
  denials (port 53 of a resolver: a name resolution). Under the host network all are allowed.
- `connect()` to a pathname unix socket: the path is resolved in the command's own view
  (`/proc/<pid>/root`, `RESOLVE_IN_ROOT`, its cwd for relative paths), the socket is found by
  inode, and the connect happens through `/proc/self/fd/N` of that very inode, so what was
  checked is what is reached. Allowed: sockets inside a writable root or the private /tmp and
  /dev/shm (the command's own servers), and the policy's `allow_unix_sockets`. Everything else
  (docker.sock, an ssh agent, journald) is refused with EACCES and recorded.
- `connect()` to an abstract unix socket: allowed in a private network namespace (abstract
  names are per namespace), refused under the host network unless the policy names it.
- `socket()`/`socketpair()` of a family or type outside the list: refused and recorded.
- a call that would leave a set-id bit on a file (the filter traps only those): refused
  with EPERM and recorded (`setid.py`); every xattr write: refused with ENOTSUP (as a
  filesystem without xattrs answers: `install -m` and `cp -p` fall back to chmod) and
  recorded.

Every connect runs on a small pool of its command's own (threads made on demand; never inline: a
non-blocking socket can turn blocking under us, its flags shared with the command's), so one
slow destination never stalls the others, and a command that keeps its connects blocked (a
full listen backlog of its own, a destination that drops SYNs) never stalls another command's.
The peer of an emulated unix connect sees the executor's credentials (`SO_PEERCRED`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import errno
import functools
import ipaddress
import itertools
import logging
import os
import resource
import select
import signal
import socket
import stat
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bash_sandbox.linux.child_setup import libc
from bash_sandbox.linux.fast_writes import call_table, rules_blob
from bash_sandbox.linux.fast_writes import library as fast_library
from bash_sandbox.linux.file_calls import FileCall, by_number
from bash_sandbox.linux.proc_paths import MemoryReader
from bash_sandbox.linux.setid import CONTINUE, setid_call
from bash_sandbox.linux.write_watch import WritePolicy, capture, held_placeholder, judge
from bash_seam import DenialEvidence, DenialKind, SandboxDenial

logger = logging.getLogger("bash_sandbox")

_MACHINE = os.uname().machine
_SYSCALLS = {
    "x86_64": {"connect": 42, "socket": 41, "socketpair": 53, "bind": 49},
    "aarch64": {"connect": 203, "socket": 198, "socketpair": 199, "bind": 200},
}.get(_MACHINE, {})
_SYS_PIDFD_OPEN = 434
_SYS_PIDFD_GETFD = 438
_SYS_OPENAT2 = 437
_PIDFD_THREAD = os.O_EXCL
_NOTIF_RECV = 0xC0502100
_NOTIF_SEND = 0xC0182101
_NOTIF_ID_VALID = 0x40082102
_FLAG_CONTINUE = 1
_FILE_CALLS = by_number(_MACHINE)
# A unix socket bound to a path makes a file there: the write watch judges it as a create
# (its path argument points at `sun_path`, two bytes into the address).
_BIND = FileCall("bind", path=1, write="create")
_SUN_LEN = 110  # sizeof(struct sockaddr_un)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_MAX_SYMLINKS = 40
MAX_DENIALS = 16
_READ_MAX = 4096
# Blocking connects one command may have in flight at once (each holds a thread).
CONNECT_WORKERS = 16
# Connects one command may have taken and not yet answered, and all commands together: each
# holds one or two of the executor's descriptors (a command's thousand blocked connects
# took the harness to EMFILE: a red team's). Beyond, a connect waits, its socket not taken,
# until one of them is answered, as a blocking connect waits for a full backlog (answered
# EAGAIN, a burst of a hundred clients failed a fifth: a red team's).
CONNECT_PENDING_MAX = 64
CONNECT_PENDING_TOTAL = 64  # the least; an eighth of the descriptor limit (`_total_cap`)
# A command's first connects never wait for the others' (commands filling every slot with
# connects to listeners that never accept held up every other command's loopback), within
# a second share of the same size (forty commands' four each took the harness to EMFILE).
CONNECT_GUARANTEED = 4
# Connects one command may have waiting: a signal storm on a caller that restarts its
# connect (SA_RESTART) made a new notification each time, a hundred thousand queued in the
# executor's memory (a red team's). Past it the stale ones go, then the new one is EAGAIN.
CONNECT_WAITING_MAX = 256
# How often the supervisor looks for connects whose caller is gone, to interrupt them.
CONNECT_CHECK_S = 0.5
# Refused writes are recorded from the kernel's view (`write_watch.py`), not from output.
WITNESSES_FILE_WRITES = True

_FAMILY_NAMES = {
    getattr(socket, name): name
    for name in dir(socket)
    if name.startswith("AF_") and isinstance(getattr(socket, name), int)
}


class _Data(ctypes.Structure):
    _fields_ = [
        ("nr", ctypes.c_int),
        ("arch", ctypes.c_uint32),
        ("ip", ctypes.c_uint64),
        ("args", ctypes.c_uint64 * 6),
    ]


class _Notif(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("data", _Data),
    ]


class _Resp(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("val", ctypes.c_int64),
        ("error", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
    ]


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@dataclass(frozen=True)
class _ViaInode:
    """A checked unix socket, held by an O_PATH descriptor and reached through it."""

    fd: int

    def address(self) -> bytes:
        return struct.pack("H", socket.AF_UNIX) + f"/proc/self/fd/{self.fd}".encode() + b"\0"


@dataclass(frozen=True)
class ConnectPolicy:
    """What one command's connects may reach, with host paths already turned into inodes.

    ``socket_dirs`` are directories (device, inode) whose sockets the command may reach: its
    writable roots. ``socket_devices`` are filesystems private to the executor (its /tmp and
    /dev/shm tmpfs): every socket there is the executor's commands' own. (An ancestry walk
    would be wrong for those: host directories are bound back inside the private /tmp.)
    ``private_loopback``: the command has a network
    namespace of its own, so loopback and abstract names are its own.
    """

    isolated: bool
    private_loopback: bool
    socket_dirs: frozenset[tuple[int, int]] = frozenset()
    socket_devices: frozenset[int] = frozenset()
    sockets: frozenset[tuple[int, int]] = frozenset()
    abstract_names: frozenset[bytes] = frozenset()
    nameservers: frozenset[str] = frozenset()
    # The write watch's judge (`write_watch.py`); None: writes are not watched.
    writes: WritePolicy | None = None


@dataclass
class SupervisedCommand:
    """One command's registration: its listener and the denials seen for it. Refusals of
    the supervisor's own come first; writes its view refused are kept apart (each list
    bounded), so a run full of refused cache writes never hides a refused connect."""

    listener: int
    policy: ConnectPolicy
    denials: list[SandboxDenial] = field(default_factory=list)
    writes: list[SandboxDenial] = field(default_factory=list)
    refused_loopback: list[str] = field(default_factory=list)
    total: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # This command's blocking connects (made on first use): a pool per command, so one that
    # keeps all its workers blocked delays only its own calls.
    connects: concurrent.futures.ThreadPoolExecutor | None = None
    pending_connects: int = 0  # taken and not yet answered (`CONNECT_PENDING_MAX`)
    # Connects past the bound, waiting for a slot (their sockets not taken yet).
    waiting: collections.deque[_Notif] = field(default_factory=collections.deque)
    unregistered: bool = False
    # Held by the supervisor's thread while it handles one of this command's calls, judge
    # and record included: the call is answered before it is judged, so the command may end
    # first, and `unregister` waits on this before anyone reads the record.
    handling: threading.Lock = field(default_factory=threading.Lock)
    # With the C fast path (`fast_writes.py`): the supervisor's end of the socket pair its
    # thread forwards every other notification over, and that thread. None: Python reads
    # the listener itself.
    forward: socket.socket | None = None
    # The C side's thread (`fast_writes.c`, bsf_start) and the library that started it.
    native: int | None = None
    native_lib: ctypes.CDLL | None = None
    # The descriptor the supervisor's loop waits on: the listener, or ``forward``'s.
    source: int = -1

    def connect_pool(self) -> concurrent.futures.ThreadPoolExecutor | None:
        """The pool for this command's blocking connects; None once it is unregistered."""
        with self.lock:
            if self.unregistered:
                return None
            if self.connects is None:
                self.connects = concurrent.futures.ThreadPoolExecutor(
                    max_workers=CONNECT_WORKERS, thread_name_prefix="bash-sandbox-connect"
                )
            return self.connects

    def close_connect_pool(self) -> None:
        """Queued connects never run; blocked ones are interrupted by the supervisor's check
        (`_interrupt_abandoned`), their caller being gone."""
        with self.lock:
            self.unregistered = True
            pool = self.connects
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def record(self, denial: SandboxDenial, *, write: bool = False) -> None:
        kept = self.writes if write else self.denials
        with self.lock:
            self.total += 1
            if len(kept) < MAX_DENIALS and denial not in kept:
                kept.append(denial)

    def record_refused_loopback(self, destination: str) -> None:
        with self.lock:
            if (
                len(self.refused_loopback) < MAX_DENIALS
                and destination not in self.refused_loopback
            ):
                self.refused_loopback.append(destination)

    def loopback_connects(self) -> tuple[str, ...]:
        """Loopback destinations ("127.0.0.1:5432", "[::1]:8080") of the command's private
        network namespace that refused its connect: a host service on that port is not it."""
        with self.lock:
            return tuple(self.refused_loopback)

    def snapshot(self) -> tuple[tuple[SandboxDenial, ...], int]:
        with self.lock:
            return (*self.denials, *self.writes), self.total


def identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of ``path`` (following symlinks), None when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# Commands of one executor served by the write watch's C fast path at once. Each costs a
# thread and two descriptors: a hundred background servers must not take 200 more of a
# 1024-descriptor limit. The commands past it are answered in Python, as without the path.
MAX_FAST_COMMANDS = 16
# How long `unregister` waits for a fast-path thread to end (it wakes on our end's close).
_JOIN_TIMEOUT_MS = 5000


class SeccompSupervisor:
    """One thread answering every confined command's notifications for one executor."""

    def __init__(self) -> None:
        self._lib = libc()
        self._buffer = ctypes.create_string_buffer(_READ_MAX)
        self._liov = _Iovec(ctypes.cast(self._buffer, ctypes.c_void_p), _READ_MAX)
        self._riov = _Iovec(0, 0)
        self._liov_ref = ctypes.byref(self._liov)
        self._riov_ref = ctypes.byref(self._riov)
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        # A worker that frees a connect slot while others wait wakes the loop to go on.
        self._freed_r, self._freed_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._epoll.register(self._freed_r, select.EPOLLIN)
        self._waiting = 0  # connects waiting in every command's `waiting`
        self._total_cap = _total_cap()
        self._commands: dict[int, SupervisedCommand] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._fast = 0  # commands served by a fast-path thread now
        # Connects handed to a worker: key -> (command, notification id, worker thread or 0).
        self._inflight: dict[int, list[Any]] = {}
        self._inflight_keys = itertools.count()
        # Held to mark a worker in or out of its connect and to signal it: a signal goes
        # only to a worker still inside the connect it was meant for (a thread id is reused).
        self._inflight_lock = threading.Lock()
        self._interrupt = _interrupt_signal()
        self._thread = threading.Thread(
            target=self._loop, name="bash-sandbox-supervisor", daemon=True
        )
        self._thread.start()
        self._call_table = call_table(_FILE_CALLS)

    def register(self, listener: int, policy: ConnectPolicy) -> SupervisedCommand:
        """Answer ``listener``'s notifications from now on (the supervisor owns the fd)."""
        command = SupervisedCommand(listener, policy, source=listener)
        with self._lock:
            if self._closed:
                os.close(listener)
                raise RuntimeError("the supervisor is closed")
            self._start_native(command)
            self._commands[command.source] = command
            self._epoll.register(command.source, select.EPOLLIN)
        return command

    def _start_native(self, command: SupervisedCommand) -> None:
        """Hand ``command``'s listener to a C thread answering the calls the write watch
        would let through unjudged; the rest come back over a socket pair."""
        watch = command.policy.writes
        lib = fast_library()
        if lib is None or watch is None or self._fast >= MAX_FAST_COMMANDS:
            return
        blob = rules_blob(watch)
        if blob is None:
            return
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError:
            return  # out of descriptors: Python reads the listener, as without a fast path
        # Ours never blocks the loop: an event for a number since reused finds nothing.
        ours.setblocking(False)
        # A thread of the C side's own: a Python thread's start waits until the new thread
        # runs, 0.5 ms and more of the loop's time per command on a loaded machine.
        handle = lib.bsf_start(
            command.listener,
            theirs.fileno(),
            self._call_table,
            len(self._call_table),
            _SYSCALLS.get("connect", -1),
            blob,
            len(blob),
            int(watch.read_only),
            int(watch.view_mounts),
        )
        if not handle:
            logger.warning("write watch fast path not started (no thread): Python serves")
            ours.close()
            theirs.close()
            return
        theirs.detach()  # the C thread closes it when it ends: our end then reads EOF
        self._fast += 1
        command.forward, command.source = ours, ours.fileno()
        command.native, command.native_lib = handle, lib

    def unregister(self, command: SupervisedCommand) -> None:
        """Stop answering and close the listener: any call still pending gets ENOSYS."""
        with self._lock:
            if self._commands.pop(command.source, None) is None:
                return
            self._waiting -= len(command.waiting)  # their callers are gone with it
            command.waiting.clear()
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(command.source)
            if command.forward is not None and command.native_lib is not None:
                # Its thread stops when our end closes; the listener is closed only after,
                # so its number is never reused under a thread still reading it.
                command.forward.close()
                rc = command.native_lib.bsf_join(command.native, _JOIN_TIMEOUT_MS)
                self._fast -= 1
                if rc == 1:
                    logger.error("write watch fast path did not stop; its listener is leaked")
                else:
                    if rc < 0:
                        logger.warning("write watch fast path stopped: %s", os.strerror(-rc))
                    os.close(command.listener)
            else:
                os.close(command.listener)
        with command.handling:
            pass  # a call being judged is recorded before the caller reads the record
        command.close_connect_pool()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            commands = list(self._commands.values())
        for command in commands:
            self.unregister(command)
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        os.close(self._freed_r)
        os.close(self._freed_w)

    # -- the loop ----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            try:
                events = self._epoll.poll(CONNECT_CHECK_S if self._inflight else -1)
            except InterruptedError:
                continue
            except (OSError, ValueError):
                return
            if self._inflight:
                self._interrupt_abandoned()
            if self._waiting:
                self._resume_waiting()
            for fd, mask in events:
                if fd == self._wake_r:
                    return
                if fd == self._freed_r:
                    with contextlib.suppress(OSError):
                        os.read(self._freed_r, 4096)
                    self._resume_waiting()
                    continue
                with self._lock:
                    command = self._commands.get(fd)
                if command is None:
                    continue
                if mask & select.EPOLLIN:
                    with command.handling:
                        self._receive(command)
                elif mask & (select.EPOLLHUP | select.EPOLLERR):
                    # Every process of the filter is gone; the executor unregisters it.
                    with self._lock, contextlib.suppress(OSError, ValueError):
                        self._epoll.unregister(fd)

    def _receive(self, command: SupervisedCommand) -> None:
        notif = _Notif()
        if command.forward is not None:
            try:
                raw = command.forward.recv(ctypes.sizeof(_Notif))
            except (BlockingIOError, InterruptedError):
                return  # a stale event: nothing was forwarded
            except OSError:
                raw = b""
            if len(raw) != ctypes.sizeof(_Notif):
                # The fast path's thread ended: every process of the filter is gone.
                with self._lock, contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(command.source)
                return
            ctypes.memmove(ctypes.byref(notif), raw, len(raw))
        elif self._lib.ioctl(command.listener, _NOTIF_RECV, ctypes.byref(notif)) < 0:
            return  # the caller died or was interrupted before we read it
        try:
            self._dispatch(command, notif)
        except Exception:
            logger.exception("seccomp supervisor failed on syscall %d", notif.data.nr)
            self._respond(command, notif.id, -1, errno.EPERM)

    def _respond(
        self, command: SupervisedCommand, notif_id: int, val: int, err: int, flags: int = 0
    ) -> None:
        resp = _Resp(notif_id, val, -err if err else 0, flags)
        # ENOENT: the caller was interrupted or died meanwhile; nothing to answer.
        self._lib.ioctl(command.listener, _NOTIF_SEND, ctypes.byref(resp))

    def _dispatch(self, command: SupervisedCommand, notif: _Notif) -> None:
        nr = notif.data.nr
        args = notif.data.args
        if nr == _SYSCALLS.get("connect"):
            self._connect(command, notif)
            return
        if nr == _SYSCALLS.get("bind"):
            self._bind(command, notif)
            return
        call = _FILE_CALLS.get(nr)
        if call is not None:
            self._file_call(command, notif, call)
            return
        family, kind, proto = int(args[0]) & 0xFFFFFFFF, int(args[1]) & 0xF, int(args[2])
        name = _FAMILY_NAMES.get(family, f"family {family}")
        what = "socketpair" if nr == _SYSCALLS.get("socketpair") else "socket"
        target = f"{name} type {kind}" + (f" protocol {proto}" if proto else "")
        command.record(
            SandboxDenial(
                kind=DenialKind.SOCKET,
                target=target,
                operation=what,
                reason="socket family or type outside the sandbox's list",
                evidence=DenialEvidence.SUPERVISOR,
            )
        )
        self._respond(command, notif.id, -1, errno.EAFNOSUPPORT)

    # -- files --------------------------------------------------------------------------

    def _bind(self, command: SupervisedCommand, notif: _Notif) -> None:
        """A bind to a unix socket path, judged as the file it creates (a refused one was
        no fact at all: a red team's); any other bind goes on unlooked at."""
        address, length = int(notif.data.args[1]), int(notif.data.args[2]) & 0xFFFFFFFF
        size = min(length, _SUN_LEN)  # the kernel reads no more than the length says
        raw = self._read_memory(notif.pid, address, size) if size > 2 else None
        if raw is None or len(raw) < 3 or struct.unpack_from("H", raw)[0] != socket.AF_UNIX:
            self._respond(command, notif.id, 0, 0, _FLAG_CONTINUE)
            return
        if raw[2] == 0:  # abstract: no file
            self._respond(command, notif.id, 0, 0, _FLAG_CONTINUE)
            return
        path = raw[2:].split(b"\0", 1)[0] + b"\0"  # what the kernel takes as the path

        def read(pid: int, at: int, count: int) -> bytes | None:
            start = at - (address + 2)
            return path[start : start + count] if 0 <= start < len(path) else None

        args = list(notif.data.args)
        args[1] = address + 2
        self._file_call(command, notif, _BIND, tuple(args), read)

    def _file_call(
        self,
        command: SupervisedCommand,
        notif: _Notif,
        call: FileCall,
        args: tuple[int, ...] | None = None,
        read: MemoryReader | None = None,
    ) -> None:
        valid = self._still_valid(command, notif)
        args = tuple(notif.data.args) if args is None else args
        verdict = CONTINUE
        if call.mode is not None or call.xattr is not None:
            verdict = setid_call(call, notif.pid, args, self._read_memory, valid)
        if verdict.refuse:
            if verdict.denial is not None:
                command.record(verdict.denial)
            self._respond(command, notif.id, -1, verdict.errno)
            return
        watch = command.policy.writes
        captured = None
        if call.write is not None and watch is not None:
            try:
                captured = capture(
                    call,
                    notif.pid,
                    args,
                    read or self._read_memory,
                    still_valid=valid,
                    policy=watch,
                )
            except Exception:
                # Observing must never turn into refusing: the call continues regardless.
                logger.exception("seccomp supervisor: write watch capture failed")
        try:
            held = (
                captured is not None
                and watch is not None
                and held_placeholder(captured, args, watch)
            )
        except BaseException:
            if captured is not None:
                captured.close()  # never left open: two descriptors of each call (a red team's)
            raise
        if held:
            assert captured is not None
            captured.close()
            self._respond(command, notif.id, 0, 0)  # done as far as the command can tell
            return
        # The kernel decides every call that reaches here (`write_watch.py`). An xattr name
        # other than security.capability too: a thread rewriting the name after the check
        # gains nothing, since writing that xattr needs CAP_SETFCAP, which no confined
        # command holds (the bounding set is empty on both backends).
        self._respond(command, notif.id, 0, 0, _FLAG_CONTINUE)
        if captured is not None and watch is not None:
            denial = judge(captured, watch)  # after the answer: a failure refuses nothing
            if denial is not None:
                command.record(denial, write=True)

    # -- connect ------------------------------------------------------------------------

    def _slot_free(self, command: SupervisedCommand) -> bool:
        pending = command.pending_connects
        if pending >= CONNECT_PENDING_MAX:
            return False
        if len(self._inflight) < self._total_cap:
            return True
        return pending < CONNECT_GUARANTEED and len(self._inflight) < 2 * self._total_cap

    def _connect(self, command: SupervisedCommand, notif: _Notif) -> None:
        if not self._slot_free(command):
            if len(command.waiting) >= CONNECT_WAITING_MAX:
                self._drop_stale_waiting(command)
            if len(command.waiting) >= CONNECT_WAITING_MAX:
                self._respond(command, notif.id, -1, errno.EAGAIN)
                return
            waiting = _Notif()
            ctypes.memmove(ctypes.byref(waiting), ctypes.byref(notif), ctypes.sizeof(_Notif))
            with self._lock:
                command.waiting.append(waiting)
                self._waiting += 1
            return
        fd_number, address, length = (int(a) for a in notif.data.args[:3])
        length = min(length, 128)
        raw = self._read_memory(notif.pid, address, length)
        if raw is None or len(raw) < 2:
            self._respond(command, notif.id, -1, errno.EFAULT)
            return
        sock = self._take_socket(command, notif, fd_number)
        if sock is None:
            return
        try:
            family = struct.unpack_from("H", raw)[0]
            if family == socket.AF_UNIX:
                target = self._unix_target(command, notif.pid, raw)
            elif family in (socket.AF_INET, socket.AF_INET6):
                target = self._inet_target(command, family, raw)
            else:
                target = raw  # AF_UNSPEC (disconnect) and netlink: as asked
            if isinstance(target, int):
                os.close(sock)
                self._respond(command, notif.id, -1, target)
                return
            loopback = (
                _loopback_label(family, raw)
                if command.policy.private_loopback and family in (socket.AF_INET, socket.AF_INET6)
                else None
            )
            # Always on the command's own pool, never on this thread: the socket shares its
            # flags with the command's, so one found non-blocking here can be made blocking
            # by another of its threads before the connect (a red team's race parked this
            # thread on a full backlog, and with it every command's calls and the loop).
            pool = command.connect_pool()
            key = next(self._inflight_keys)
            try:
                if pool is None:
                    raise RuntimeError("unregistered")
                with self._inflight_lock:
                    self._inflight[key] = [command, notif.id, 0]
                with command.lock:
                    command.pending_connects += 1
                future = pool.submit(
                    self._finish_connect, command, notif.id, sock, target, loopback,
                    pid=notif.pid, key=key,
                )  # fmt: skip
            except RuntimeError:
                # Unregistered meanwhile (nobody waits), or no thread could start: a work
                # item `submit` queued anyway finds its entry gone and touches nothing (its
                # descriptors, closed here, may be reused by then).
                self._connect_done(command, key)
                _close_taken(sock, target)
                if pool is not None and not command.unregistered:
                    self._respond(command, notif.id, -1, errno.EAGAIN)
            else:
                # A connect still queued when its command goes is cancelled, never run:
                # its descriptors are closed here (held, they piled up in the executor).
                def cancelled(done: concurrent.futures.Future[None], key: int = key) -> None:
                    if done.cancelled():
                        self._connect_done(command, key)
                        _close_taken(sock, target)

                future.add_done_callback(cancelled)
        except BaseException:
            os.close(sock)
            raise

    def _finish_connect(
        self,
        command: SupervisedCommand,
        notif_id: int,
        sock: int,
        target: bytes | _ViaInode,
        loopback: str | None = None,
        *,
        pid: int = 0,
        key: int = -1,
    ) -> None:
        with self._inflight_lock:
            entry = self._inflight.get(key)
            if entry is None:
                return  # given up before it ran: its descriptors are closed already
            entry[2] = threading.get_ident()  # interruptible from here on
        try:
            addr = target.address() if isinstance(target, _ViaInode) else target
            buf = ctypes.create_string_buffer(addr, len(addr))
            # Blocking as the command's socket is: a connect the kernel keeps waiting (a
            # listener that never accepts) is interrupted once its caller is gone
            # (`_interrupt_abandoned`), whatever the command did to the socket meanwhile.
            rc = self._lib.connect(sock, buf, len(addr))
            err = ctypes.get_errno() if rc < 0 else 0
        finally:
            self._connect_done(command, key)
            os.close(sock)
            if isinstance(target, _ViaInode):
                os.close(target.fd)
        # A non-blocking connect learns of the refusal later (curl, node): then the kernel's
        # own table of the command's namespace says whether anything listens there.
        if loopback is not None and (
            err == errno.ECONNREFUSED
            or (err == errno.EINPROGRESS and not _loopback_listening(pid, loopback))
        ):
            command.record_refused_loopback(loopback)
        self._respond(command, notif_id, rc if rc < 0 else 0, err)

    def _connect_done(self, command: SupervisedCommand, key: int) -> None:
        with self._inflight_lock:
            done = self._inflight.pop(key, None)
        if done is not None:
            with command.lock:
                command.pending_connects -= 1
            if self._waiting:
                with contextlib.suppress(OSError):
                    os.write(self._freed_w, b"x")

    def _drop_stale_waiting(self, command: SupervisedCommand) -> None:
        """Forget the waiting connects whose caller no longer waits (interrupted, gone)."""
        live = [n for n in command.waiting if self._pending(command, n.id)]
        with self._lock:
            self._waiting -= len(command.waiting) - len(live)
            command.waiting.clear()
            command.waiting.extend(live)

    def _resume_waiting(self) -> None:
        """On the loop: the connects that waited for a slot, in turn across the commands
        (one command's full share never keeps another's waiting first), as slots allow.
        One whose caller is gone by now is dropped."""
        with self._lock:
            commands = [c for c in self._commands.values() if c.waiting]
        progressed = True
        while progressed and self._waiting:
            progressed = False
            for command in commands:
                if not command.waiting or not self._slot_free(command):
                    continue
                with self._lock:
                    if not command.waiting:
                        continue
                    notif = command.waiting.popleft()
                    self._waiting -= 1
                progressed = True
                if command.unregistered or not self._pending(command, notif.id):
                    continue
                with command.handling:
                    try:
                        self._connect(command, notif)
                    except Exception:
                        logger.exception("seccomp supervisor failed on a waiting connect")
                        self._respond(command, notif.id, -1, errno.EPERM)

    def _interrupt_abandoned(self) -> None:
        """Interrupt the connects whose caller no longer waits (its command exited or was
        killed): blocked on a listener that never accepts, each held a worker and the
        executor's descriptors until that listener died, 16 and 32 a finished command,
        until the harness ran out of them (a red team's)."""
        if self._interrupt is None:
            return  # no handler of ours: bounded by CONNECT_PENDING_TOTAL only
        with self._inflight_lock:
            for command, notif_id, thread in self._inflight.values():
                if thread and (command.unregistered or not self._pending(command, notif_id)):
                    with contextlib.suppress(OSError, ProcessLookupError):
                        signal.pthread_kill(thread, self._interrupt)

    def _pending(self, command: SupervisedCommand, notif_id: int) -> bool:
        """Whether the notification ``notif_id`` still waits for its answer."""
        number = ctypes.c_uint64(notif_id)
        return int(self._lib.ioctl(command.listener, _NOTIF_ID_VALID, ctypes.byref(number))) == 0

    def _take_socket(self, command: SupervisedCommand, notif: _Notif, fd_number: int) -> int | None:
        pidfd = self._lib.syscall(_SYS_PIDFD_OPEN, notif.pid, 0)
        if pidfd < 0:
            pidfd = self._lib.syscall(_SYS_PIDFD_OPEN, notif.pid, _PIDFD_THREAD)
        if pidfd < 0:
            self._respond(command, notif.id, -1, errno.ESRCH)
            return None
        try:
            sock = int(self._lib.syscall(_SYS_PIDFD_GETFD, pidfd, fd_number, 0))
        finally:
            os.close(pidfd)
        if sock < 0:
            self._respond(command, notif.id, -1, errno.EBADF)
            return None
        # The pid may have been recycled between the notification and pidfd_open.
        notif_id = ctypes.c_uint64(notif.id)
        if self._lib.ioctl(command.listener, _NOTIF_ID_VALID, ctypes.byref(notif_id)) < 0:
            os.close(sock)
            return None
        try:
            kind = os.fstat(sock).st_mode
        except OSError:
            kind = 0
        if not stat.S_ISSOCK(kind):
            os.close(sock)
            self._respond(command, notif.id, -1, errno.ENOTSOCK)
            return None
        return sock

    def _still_valid(self, command: SupervisedCommand, notif: _Notif) -> Callable[[], bool]:
        """Whether ``notif`` is still pending: what was read from its pid was its caller's."""

        def valid() -> bool:
            notif_id = ctypes.c_uint64(notif.id)
            rc: int = self._lib.ioctl(command.listener, _NOTIF_ID_VALID, ctypes.byref(notif_id))
            return rc == 0

        return valid

    def _read_memory(self, pid: int, address: int, length: int) -> bytes | None:
        # One buffer, reused: only the supervisor's loop thread reads the callers' memory,
        # once per trapped call, so this is on the path of every write-intent open.
        length = min(length, _READ_MAX)
        self._riov.base, self._riov.len, self._liov.len = address, length, length
        n = self._lib.process_vm_readv(pid, self._liov_ref, 1, self._riov_ref, 1, 0)
        return None if n < 0 else self._buffer.raw[:n]

    def _inet_target(self, command: SupervisedCommand, family: int, raw: bytes) -> bytes | int:
        policy = command.policy
        if family == socket.AF_INET:
            port = struct.unpack_from("!H", raw, 2)[0]
            host = ipaddress.ip_address(raw[4:8])
        else:
            if len(raw) < 24:
                return errno.EINVAL
            port = struct.unpack_from("!H", raw, 2)[0]
            host = ipaddress.ip_address(raw[8:24])
        if not policy.isolated:
            return raw
        address = host.ipv4_mapped if isinstance(host, ipaddress.IPv6Address) else None
        local = host.is_loopback or host.is_unspecified or bool(address and address.is_loopback)
        resolver = str(host) in policy.nameservers and port == 53
        if local and policy.private_loopback and not resolver:
            return raw
        shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        command.record(
            SandboxDenial(
                kind=DenialKind.NETWORK_RESOLVE if port == 53 else DenialKind.NETWORK_CONNECT,
                target=shown,
                operation="connect",
                reason="isolated network",
                evidence=DenialEvidence.SUPERVISOR,
            )
        )
        return errno.ENETUNREACH if not local else errno.ECONNREFUSED

    def _unix_target(
        self, command: SupervisedCommand, pid: int, raw: bytes
    ) -> _ViaInode | bytes | int:
        path = raw[2:]
        if not path:
            return raw  # autobind / unnamed: the kernel decides
        policy = command.policy
        if path[0] == 0:
            name = path[1:].rstrip(b"\0")
            if policy.private_loopback or name in policy.abstract_names:
                return raw
            return self._refuse_unix(command, "@" + name.decode(errors="replace"), "abstract")
        name = path.split(b"\0", 1)[0]
        try:
            found = self._resolve_in_view(pid, name)
        except OSError as exc:
            return exc.errno or errno.ENOENT
        sock_fd, directory, shown = found
        try:
            st = os.fstat(sock_fd)
            if not stat.S_ISSOCK(st.st_mode):
                os.close(sock_fd)
                return errno.ECONNREFUSED
            allowed = (
                (st.st_dev, st.st_ino) in policy.sockets
                or st.st_dev in policy.socket_devices
                or self._inside(directory, policy.socket_dirs)
            )
        finally:
            os.close(directory)
        if not allowed:
            os.close(sock_fd)
            return self._refuse_unix(command, shown, "pathname")
        return _ViaInode(sock_fd)

    def _refuse_unix(self, command: SupervisedCommand, shown: str, kind: str) -> int:
        reason = (
            "host abstract unix socket"
            if kind == "abstract"
            else "host unix socket outside the writable roots"
        )
        command.record(
            SandboxDenial(
                kind=DenialKind.SOCKET,
                target=shown,
                operation="connect",
                reason=reason,
                evidence=DenialEvidence.SUPERVISOR,
            )
        )
        return errno.EACCES

    def _openat2(self, dirfd: int, path: bytes, flags: int, resolve: int) -> int:
        how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
        fd = int(
            self._lib.syscall(_SYS_OPENAT2, dirfd, path, ctypes.byref(how), ctypes.sizeof(how))
        )
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return fd

    def _resolve_in_view(self, pid: int, name: bytes) -> tuple[int, int, str]:
        """(O_PATH fd of the socket, O_PATH fd of its directory, the path as the command
        sees it), resolving symlinks the way the command's own lookup would."""
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if not name.startswith(b"/"):
                cwd = os.readlink(f"/proc/{pid}/cwd").encode()
                if not cwd.startswith(b"/") or cwd.endswith(b" (deleted)"):
                    raise OSError(errno.ENOENT, "the caller's directory is gone")
                name = cwd.rstrip(b"/") + b"/" + name
            resolve = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS
            for _ in range(_MAX_SYMLINKS):
                parent, _, base = name.rpartition(b"/")
                directory = self._openat2(root, parent or b"/", os.O_PATH | os.O_DIRECTORY, resolve)
                try:
                    st = os.stat(base, dir_fd=directory, follow_symlinks=False)
                except OSError:
                    os.close(directory)
                    raise
                if not stat.S_ISLNK(st.st_mode):
                    fd = self._openat2(directory, base, os.O_PATH | os.O_NOFOLLOW, resolve)
                    return fd, directory, name.decode(errors="replace")
                link = os.readlink(base, dir_fd=directory)
                os.close(directory)
                target = os.fsencode(link)
                name = target if target.startswith(b"/") else (parent or b"") + b"/" + target
            raise OSError(errno.ELOOP, "too many symbolic links")
        finally:
            os.close(root)

    def _inside(self, directory: int, allowed: frozenset[tuple[int, int]]) -> bool:
        """Whether ``directory`` or one of its ancestors (in the command's view) is allowed."""
        if not allowed:
            return False
        current = os.dup(directory)
        try:
            for _ in range(256):
                st = os.fstat(current)
                if (st.st_dev, st.st_ino) in allowed:
                    return True
                parent = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=current)
                pst = os.fstat(parent)
                os.close(current)
                current = parent
                if (pst.st_dev, pst.st_ino) == (st.st_dev, st.st_ino):
                    return False  # the root of the command's view
            return False
        finally:
            os.close(current)


def _loopback_label(family: int, raw: bytes) -> str | None:
    """ "127.0.0.1:p" / "[::1]:p" for a loopback inet address, else None."""
    try:
        port = struct.unpack_from("!H", raw, 2)[0]
        if family == socket.AF_INET:
            host: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(raw[4:8])
        else:
            host = ipaddress.ip_address(raw[8:24])
    except (struct.error, ValueError):
        return None
    if not host.is_loopback:
        return None
    return f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"


def _loopback_listening(pid: int, label: str) -> bool:
    """Whether a TCP socket of ``pid``'s network namespace listens on ``label``'s port
    (`/proc/<pid>/net/tcp{,6}`, state 0A); True when that cannot be read (no record)."""
    port = f":{int(label.rsplit(':', 1)[1]):04X}"
    try:
        for name in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{name}") as fh:
                next(fh, None)
                for line in fh:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A" and fields[1].endswith(port):
                        return True
    except (OSError, ValueError):
        return True
    return False


def receive_listener(sock: socket.socket) -> int:
    """The listener fd a child sent over ``sock`` before exec (already there by then)."""
    # Never blocks: Python 3.11's recv_fds drops its flags argument (MSG_DONTWAIT), and a
    # child killed before it sent (e.g. by a tiny memory limit) would hang the caller.
    sock.setblocking(False)
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if not fds:
        raise OSError(errno.EPROTO, "the sandbox child sent no seccomp listener")
    return fds[0]


ListenerSink = Callable[[int], None]


def _close_taken(sock: int, target: object) -> None:
    """Close the descriptors a connect took from its command (the socket, an inode's path)."""
    os.close(sock)
    if isinstance(target, _ViaInode):
        os.close(target.fd)


def _total_cap() -> int:
    """Connect slots for all commands (and as many again for each command's first few):
    two descriptors each, within half of this process's descriptor limit, never fewer than
    `CONNECT_PENDING_TOTAL`."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return CONNECT_PENDING_TOTAL
    if soft == resource.RLIM_INFINITY:
        return 64 * CONNECT_PENDING_TOTAL
    return max(CONNECT_PENDING_TOTAL, soft // 8)


class _Sigaction(ctypes.Structure):
    # glibc's `struct sigaction` (the generic layout, x86-64 and aarch64 alike).
    _fields_ = (
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * (128 // ctypes.sizeof(ctypes.c_ulong))),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    )


@functools.cache
def _interrupt_signal() -> int | None:
    """A real-time signal whose handler does nothing (libc's `getpid`: async-signal-safe,
    no Python involved), installed without SA_RESTART: sent to a connect's worker, the
    connect returns EINTR. Only where nothing else handles that signal; None: not."""
    sig = int(signal.SIGRTMAX) - 3
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sigaction.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
        current = _Sigaction()
        if libc.sigaction(sig, None, ctypes.byref(current)) != 0 or current.handler:
            return None  # SIG_DFL is 0: anything else is someone's
        quiet = _Sigaction()
        quiet.handler = ctypes.cast(libc.getpid, ctypes.c_void_p).value
        if libc.sigaction(sig, ctypes.byref(quiet), None) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return sig
