"""The executor's own namespaces: private scratch space, loopback, ptys, held by descriptors.

One base set per executor, made once (off the event loop):

- a mount namespace, a slave of the host's (host mounts still appear; nothing made here
  reaches the host), holding two size-capped tmpfs instances mounted over the executor's
  empty `tmp` and `shm` state directories (the commands' private `/tmp` and `/dev/shm`:
  one directory per trust domain in each, `state.scratch_for`; thrown away with the
  executor, never on the host's disk) and a devpts instance (`pts`);
- a network namespace with only `lo`, up, and a TCP listening socket bound to 127.0.0.1
  inside it (the egress proxy's port number);
- for an unprivileged executor, a user namespace owning both (the executor's uid is root in
  it), joined first.

Commands never join the base's network namespace or use its devpts. Each trust domain
(`trust_domain.py`) gets its own, made lazily the first time it spawns and kept until
`close()`: a copy of the base mount namespace (the same tmpfs instances) with a devpts
instance of its own mounted over `pts`, a network namespace of its own (`lo`, up) and a
listener on the base's proxy port. A loopback server, an abstract unix socket or a pty of
one domain is thus out of reach of every other: a narrow call can neither drive a wider
call's debugger port nor read the password typed into its terminal, while calls of the
same domain keep sharing them (a server one call starts, the next one reaches).

A short-lived holder child makes each set: it unshares (a domain's first joins the base's
user and mount namespaces), mounts, opens every descriptor, sends them over a socket
(SCM_RIGHTS) and exits. Nothing is bound under `/run/netns` and no helper binary runs: the
descriptors are the only references, so `close()` (or the executor's death) frees all of
it. The holder's steps are pre-bound like `child_setup`'s.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
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
# A trust domain's own: the rest (tmp, shm, user) are the base's.
_DOMAIN_FD_NAMES = ("mnt", "net", "pts", "listener")


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
    """The holder child's whole job, pre-bound: unshare, mount, open, send, exit. With
    ``base``, a trust domain's set: it joins the base's user and mount namespaces first, then
    makes its own mount (a copy: the same tmpfs) and network namespaces and devpts."""

    def __init__(
        self,
        paths: ScratchPaths,
        sock_fd: int,
        *,
        tmp_bytes: int,
        shm_bytes: int,
        base: NamespaceFds | None = None,
        port: int = 0,
    ) -> None:
        self._lib = libc()
        self._sock = sock_fd
        self._uid, self._gid = os.geteuid(), os.getegid()
        self._root = self._uid == 0
        self._base = base
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
            struct.pack("!HH4s", 0, port, bytes([127, 0, 0, 1])).ljust(16, b"\0"), 16
        )
        # sin_family is host order, sin_port network order.
        ctypes.c_ushort.from_buffer(self._sockaddr, 0).value = socket.AF_INET
        if base is not None:
            self._names: tuple[str, ...] = _DOMAIN_FD_NAMES
        else:
            self._names = _FD_NAMES if not self._root else _FD_NAMES[:-1]
        count = len(self._names)
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
        if self._base is None:
            self._new_base()
        else:
            self._new_domain(self._base)
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
        opened = {
            "mnt": lib.open(self._ns_paths[0], os.O_RDONLY | os.O_CLOEXEC),
            "net": lib.open(self._ns_paths[1], os.O_RDONLY | os.O_CLOEXEC),
            "pts": lib.open(self._pts, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
            "listener": listener,
        }
        if self._base is None:
            opened["tmp"] = lib.open(self._tmp, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            opened["shm"] = lib.open(self._shm, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            if not self._root:
                opened["user"] = lib.open(self._user_ns, os.O_RDONLY | os.O_CLOEXEC)
        for index, name in enumerate(self._names):
            fd = opened[name]
            if fd < 0:
                self._fail(b"open " + name.encode())
            self._slots[index].value = fd
        if lib.sendmsg(self._sock, self._msg, 0) != 1:
            self._fail(b"sendmsg")
        lib._exit(0)

    def _new_base(self) -> None:
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

    def _new_domain(self, base: NamespaceFds) -> None:
        # The user namespace first: it grants the right to join the mount namespace. The copy
        # keeps the base's mounts (slaves of the host's, the same tmpfs); the devpts mounted
        # over `pts` next is this domain's alone.
        lib = self._lib
        if base.user is not None and lib.setns(base.user, CLONE_NEWUSER) != 0:
            self._fail(b"setns(user)")
        if lib.setns(base.mnt, CLONE_NEWNS) != 0:
            self._fail(b"setns(mnt)")
        if lib.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
            self._fail(b"unshare")


def _hold(
    paths: ScratchPaths,
    *,
    tmp_bytes: int,
    shm_bytes: int,
    base: NamespaceFds | None,
    port: int,
    timeout_s: float,
) -> dict[str, int]:
    """Run one holder child; its descriptors by name. Raises `NamespaceError`."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    holder = _Holder(
        paths, theirs.fileno(), tmp_bytes=tmp_bytes, shm_bytes=shm_bytes, base=base, port=port
    )
    holder.report_fd = report_w
    # A domain's holder joins the base's namespaces by these (kept open across the fork).
    joined = () if base is None else tuple(fd for fd in (base.mnt, base.user) if fd is not None)
    try:
        # argv is never executed: the holder exits at the end of its pre-exec step.
        proc = subprocess.Popen(
            ["/bin/true"],
            preexec_fn=holder,  # noqa: PLW1509 - pre-bound syscalls only
            pass_fds=(theirs.fileno(), report_w, *joined),
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
    names = holder._names
    try:
        # poll, not select: an executor of a process with over 1,024 descriptors open
        # (a busy harness) has its own numbered past what select() takes.
        poller = select.poll()
        for fd in (ours.fileno(), report_r):
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(timeout_s * 1000)}
        fds: list[int] = []
        if ours.fileno() in ready:
            _, fds, _, _ = socket.recv_fds(ours, 1, len(names))
        if len(fds) != len(names):
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
    return dict(zip(names, fds, strict=True))


def create_namespaces(
    paths: ScratchPaths, *, tmp_bytes: int, shm_bytes: int, timeout_s: float = 10.0
) -> NamespaceFds:
    """Make the executor's base namespaces through a holder child; raises `NamespaceError`."""
    named = _hold(
        paths, tmp_bytes=tmp_bytes, shm_bytes=shm_bytes, base=None, port=0, timeout_s=timeout_s
    )
    return NamespaceFds(
        mnt=named["mnt"],
        net=named["net"],
        tmp=named["tmp"],
        shm=named["shm"],
        pts=named["pts"],
        listener=named["listener"],
        user=named.get("user"),
    )


def create_domain_namespaces(
    base: NamespaceFds, paths: ScratchPaths, *, timeout_s: float = 10.0
) -> NamespaceFds:
    """Make one trust domain's mount and network namespaces and devpts, from ``base``; the
    result's `tmp`, `shm` and `user` are the base's descriptors (not its own to close).
    Its listener takes the base's port, so the egress proxy's address is every domain's."""
    port = socket.socket(fileno=os.dup(base.listener))
    try:
        number = port.getsockname()[1]
    finally:
        port.close()
    named = _hold(paths, tmp_bytes=0, shm_bytes=0, base=base, port=number, timeout_s=timeout_s)
    return dataclasses.replace(
        base, mnt=named["mnt"], net=named["net"], pts=named["pts"], listener=named["listener"]
    )


def _close_all(fds: tuple[int | None, ...]) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


class ExecutorNamespaces:
    """Lazily made, thread-safe holder of one executor's namespace descriptors: the base set,
    and one set per trust domain that spawned (by its `domain_key`)."""

    def __init__(self, paths: ScratchPaths, *, tmp_bytes: int, shm_bytes: int) -> None:
        self.paths = paths
        self._sizes = (tmp_bytes, shm_bytes)
        self._lock = threading.Lock()
        self._fds: NamespaceFds | None = None
        self._domains: dict[str, NamespaceFds] = {}
        self._error: NamespaceError | None = None
        self._closed = False

    def fds(self) -> NamespaceFds:
        """The base descriptors, made on first use (blocking: call it off the event loop)."""
        with self._lock:
            return self._base_locked()

    def _base_locked(self) -> NamespaceFds:
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

    def for_domain(self, key: str) -> NamespaceFds:
        """Trust domain ``key``'s descriptors, made the first time it asks (blocking: off the
        event loop when `domain_ready` says none yet), kept until `close()`. A failure is
        not kept: the next spawn of the domain tries again."""
        with self._lock:
            made = self._domains.get(key)
            if made is None:
                made = create_domain_namespaces(self._base_locked(), self.paths)
                self._domains[key] = made
            return made

    def domain_ready(self, key: str) -> NamespaceFds | None:
        return self._domains.get(key)

    @property
    def ready(self) -> NamespaceFds | None:
        """The base set (its tmpfs descriptors are every domain's), None before it is made."""
        return self._fds

    def close(self) -> None:
        with self._lock:
            self._closed = True
            fds, self._fds = self._fds, None
            domains, self._domains = list(self._domains.values()), {}
        for ns in domains:
            _close_all((ns.mnt, ns.net, ns.pts, ns.listener))
        if fds is not None:
            _close_all((fds.mnt, fds.net, fds.tmp, fds.shm, fds.pts, fds.listener, fds.user))

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
