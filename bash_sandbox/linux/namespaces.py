"""The executor's own namespaces: private scratch space, loopback, ptys, held by descriptors.

One set per executor, made once (off the event loop) and joined by every command it confines:

- a mount namespace, a slave of the host's (host mounts still appear; nothing made here
  reaches the host), holding two size-capped tmpfs instances mounted over the executor's
  empty `tmp` and `shm` state directories (the commands' private `/tmp` and `/dev/shm`:
  shared by the executor's commands, thrown away with the executor, never on the host's
  disk) and a private devpts instance (`pts`: the commands' ptys);
- a network namespace with only `lo`, up (joined under `network="isolated"`), and a TCP
  listening socket bound to 127.0.0.1 inside it for the egress proxy: reachable from the
  namespace only, with no veth and no route out;
- for an unprivileged executor, a user namespace owning both (the executor's uid is root in
  it), joined first.

A short-lived holder child makes them: it unshares, mounts, opens every descriptor, sends
them over a socket (SCM_RIGHTS) and exits. Nothing is bound under `/run/netns` and no helper
binary runs: the descriptors are the only references, so `close()` (or the executor's
death) frees all of it. The holder's steps are pre-bound like `child_setup`'s.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass

from bash_sandbox.linux.child_setup import (
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWUSER,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_REC,
    MS_SLAVE,
    libc,
)

_SIOCSIFFLAGS = 0x8914
_IFF_UP_LOOPBACK_RUNNING = 0x1 | 0x8 | 0x40
_SOL_SOCKET = 1
_SCM_RIGHTS = 1
# mnt, net, tmp, shm, pts, listener (+ user when unprivileged)
_FD_NAMES = ("mnt", "net", "tmp", "shm", "pts", "listener", "user")


class NamespaceError(OSError):
    """The namespaces could not be made; nothing was left behind."""


@dataclass(frozen=True)
class NamespaceFds:
    """Descriptors of one executor's namespaces and private filesystems (all O_CLOEXEC)."""

    mnt: int
    net: int
    tmp: int  # O_PATH of the private /tmp tmpfs root
    shm: int  # O_PATH of the private /dev/shm tmpfs root
    pts: int  # O_PATH of the private devpts root
    listener: int  # TCP socket listening on 127.0.0.1 inside the network namespace
    user: int | None = None  # unprivileged: the user namespace owning the others


@dataclass(frozen=True)
class ScratchPaths:
    """Where the holder mounted the private filesystems (empty directories on the host)."""

    tmp: str
    shm: str
    pts: str
    # The trust domain's directory inside both tmpfs (`state.scratch_for`), "" for the roots.
    domain: str = ""


# One inode per this many bytes of a private tmpfs's size. Without `nr_inodes` the kernel
# allows half the host's RAM pages, whatever `size` says: empty files cost no space, yet each
# pins about 1 KiB of kernel memory, so a command could hold gigabytes (more on a bigger host)
# in a "4 GiB" /tmp, and keep them there for the executor's next commands.
TMPFS_BYTES_PER_INODE = 4096
_MIN_TMPFS_INODES = 1024


def tmpfs_options(size: int) -> str:
    """The mount options of a private tmpfs of ``size`` bytes: its inodes bounded by it."""
    inodes = max(size // TMPFS_BYTES_PER_INODE, _MIN_TMPFS_INODES)
    return f"size={size},nr_inodes={inodes},mode=1777"


class _Holder:
    """The holder child's whole job, pre-bound: unshare, mount, open, send, exit."""

    def __init__(
        self, paths: ScratchPaths, sock_fd: int, *, tmp_bytes: int, shm_bytes: int
    ) -> None:
        self._lib = libc()
        self._sock = sock_fd
        self._uid, self._gid = os.geteuid(), os.getegid()
        self._root = self._uid == 0
        self._keep: list[object] = []

        def buf(data: bytes) -> ctypes.Array[ctypes.c_char]:
            b = ctypes.create_string_buffer(data)
            self._keep.append(b)
            return b

        self._b = buf
        self._tmp, self._shm, self._pts = (
            buf(os.fsencode(paths.tmp)),
            buf(os.fsencode(paths.shm)),
            buf(os.fsencode(paths.pts)),
        )
        self._tmpfs, self._devpts = buf(b"tmpfs"), buf(b"devpts")
        self._tmp_opts = buf(tmpfs_options(tmp_bytes).encode())
        self._shm_opts = buf(tmpfs_options(shm_bytes).encode())
        self._pts_opts = buf(b"newinstance,ptmxmode=0666,mode=0620")
        self._slash = buf(b"/")
        self._maps = [
            (buf(b"/proc/self/setgroups"), buf(b"deny")),
            (buf(b"/proc/self/uid_map"), buf(f"0 {self._uid} 1".encode())),
            (buf(b"/proc/self/gid_map"), buf(f"0 {self._gid} 1".encode())),
        ]
        self._ns_paths = [buf(b"/proc/self/ns/mnt"), buf(b"/proc/self/ns/net")]
        self._user_ns = buf(b"/proc/self/ns/user")
        self._ifreq = ctypes.create_string_buffer(40)
        self._ifreq.raw = b"lo".ljust(16, b"\0") + struct.pack("H", _IFF_UP_LOOPBACK_RUNNING).ljust(
            24, b"\0"
        )
        self._sockaddr = ctypes.create_string_buffer(
            struct.pack("HH4s", socket.AF_INET, 0, bytes([127, 0, 0, 1])).ljust(16, b"\0"), 16
        )
        count = len(_FD_NAMES) if not self._root else len(_FD_NAMES) - 1
        self._fds = (ctypes.c_int * count)()
        self._count = count
        space = 16 + 4 * count
        space += (-space) % 8
        self._control = ctypes.create_string_buffer(space)
        ctypes.c_size_t.from_buffer(self._control, 0).value = 16 + 4 * count
        ctypes.c_int.from_buffer(self._control, 8).value = _SOL_SOCKET
        ctypes.c_int.from_buffer(self._control, 12).value = _SCM_RIGHTS
        self._slots = [ctypes.c_int.from_buffer(self._control, 16 + 4 * i) for i in range(count)]
        self._byte = ctypes.create_string_buffer(b"N", 1)
        self._iov = (ctypes.c_void_p * 2)(ctypes.cast(self._byte, ctypes.c_void_p).value, 1)
        self._msg = (ctypes.c_uint64 * 7)(
            0, 0, ctypes.addressof(self._iov), 1, ctypes.addressof(self._control), space, 0
        )
        self.report_fd = -1

    def _fail(self, what: bytes) -> None:
        err = ctypes.get_errno()
        if self.report_fd >= 0:
            msg = what + b": " + os.strerror(err).encode()
            self._lib.write(self.report_fd, msg, len(msg))
        self._lib._exit(1)

    def __call__(self) -> None:
        lib = self._lib
        flags = CLONE_NEWNS | CLONE_NEWNET | (0 if self._root else CLONE_NEWUSER)
        if lib.unshare(flags) != 0:
            self._fail(b"unshare")
        if not self._root:
            for path, data in self._maps:
                fd = lib.open(path, os.O_WRONLY | os.O_CLOEXEC)
                if fd < 0 or lib.write(fd, data, len(data.value)) != len(data.value):
                    self._fail(b"id map")
                lib.close(fd)
        if lib.mount(None, self._slash, None, MS_REC | MS_SLAVE, None) != 0:
            self._fail(b"mount(slave)")
        tmpfs_flags = MS_NOSUID | MS_NODEV
        if lib.mount(self._tmpfs, self._tmp, self._tmpfs, tmpfs_flags, self._tmp_opts) != 0:
            self._fail(b"mount tmpfs tmp")
        if lib.mount(self._tmpfs, self._shm, self._tmpfs, tmpfs_flags, self._shm_opts) != 0:
            self._fail(b"mount tmpfs shm")
        pts_flags = MS_NOSUID | MS_NOEXEC
        if lib.mount(self._devpts, self._pts, self._devpts, pts_flags, self._pts_opts) != 0:
            self._fail(b"mount devpts")
        control = lib.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 0)
        if control < 0 or lib.ioctl(control, _SIOCSIFFLAGS, self._ifreq) != 0:
            self._fail(b"lo up")
        lib.close(control)
        listener = lib.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC, 0)
        if listener < 0 or lib.bind(listener, self._sockaddr, 16) != 0:
            self._fail(b"proxy socket")
        if lib.listen(listener, 128) != 0:
            self._fail(b"proxy listen")
        opened = [
            lib.open(self._ns_paths[0], os.O_RDONLY | os.O_CLOEXEC),
            lib.open(self._ns_paths[1], os.O_RDONLY | os.O_CLOEXEC),
            lib.open(self._tmp, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
            lib.open(self._shm, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
            lib.open(self._pts, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
            listener,
        ]
        if not self._root:
            opened.append(lib.open(self._user_ns, os.O_RDONLY | os.O_CLOEXEC))
        for index, fd in enumerate(opened):
            if fd < 0:
                self._fail(b"open " + _FD_NAMES[index].encode())
            self._slots[index].value = fd
        if lib.sendmsg(self._sock, self._msg, 0) != 1:
            self._fail(b"sendmsg")
        lib._exit(0)


def create_namespaces(
    paths: ScratchPaths, *, tmp_bytes: int, shm_bytes: int, timeout_s: float = 10.0
) -> NamespaceFds:
    """Make the executor's namespaces through a holder child; raises `NamespaceError`."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    holder = _Holder(paths, theirs.fileno(), tmp_bytes=tmp_bytes, shm_bytes=shm_bytes)
    holder.report_fd = report_w
    try:
        # argv is never executed: the holder exits at the end of its pre-exec step.
        proc = subprocess.Popen(
            ["/bin/true"],
            preexec_fn=holder,  # noqa: PLW1509 - pre-bound syscalls only
            pass_fds=(theirs.fileno(), report_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        ours.close()
        theirs.close()
        os.close(report_r)
        os.close(report_w)
        raise NamespaceError(getattr(exc, "errno", None) or 1, f"namespace holder: {exc}") from exc
    theirs.close()
    os.close(report_w)
    try:
        # poll, not select: an executor of a process with over 1,024 descriptors open
        # (a busy harness) has its own numbered past what select() takes.
        poller = select.poll()
        for fd in (ours.fileno(), report_r):
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(timeout_s * 1000)}
        fds: list[int] = []
        if ours.fileno() in ready:
            _, fds, _, _ = socket.recv_fds(ours, 1, len(_FD_NAMES))
        if len(fds) < len(_FD_NAMES) - 1:
            for fd in fds:
                os.close(fd)
            why = os.read(report_r, 4096).decode(errors="replace") if report_r in ready else ""
            raise NamespaceError(
                1, f"cannot create the executor's namespaces: {why or 'timed out'}"
            )
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        ours.close()
        os.close(report_r)
    named = dict(zip(_FD_NAMES, fds, strict=False))
    return NamespaceFds(
        mnt=named["mnt"],
        net=named["net"],
        tmp=named["tmp"],
        shm=named["shm"],
        pts=named["pts"],
        listener=named["listener"],
        user=named.get("user"),
    )


class ExecutorNamespaces:
    """Lazily made, thread-safe holder of one executor's namespace descriptors."""

    def __init__(self, paths: ScratchPaths, *, tmp_bytes: int, shm_bytes: int) -> None:
        self.paths = paths
        self._sizes = (tmp_bytes, shm_bytes)
        self._lock = threading.Lock()
        self._fds: NamespaceFds | None = None
        self._error: NamespaceError | None = None
        self._closed = False

    def fds(self) -> NamespaceFds:
        """The descriptors, made on first use (blocking: call it off the event loop)."""
        with self._lock:
            if self._closed:
                raise NamespaceError(9, "the executor's namespaces are closed")
            if self._fds is None:
                if self._error is not None:
                    raise self._error
                try:
                    self._fds = create_namespaces(
                        self.paths, tmp_bytes=self._sizes[0], shm_bytes=self._sizes[1]
                    )
                except NamespaceError as exc:
                    self._error = exc
                    raise
            return self._fds

    @property
    def ready(self) -> NamespaceFds | None:
        return self._fds

    def close(self) -> None:
        with self._lock:
            self._closed = True
            fds, self._fds = self._fds, None
        if fds is not None:
            for fd in (fds.mnt, fds.net, fds.tmp, fds.shm, fds.pts, fds.listener, fds.user):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
