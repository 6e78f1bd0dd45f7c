"""Steps run in the child between fork and exec, built completely in the parent.

Other threads of the executor may hold locks (malloc, logging, import) when we fork, so the
child must not import, log or build anything: `ChildSetup` pre-binds every libc function
and pre-encodes every argument in the parent, and `__call__` only issues those syscalls.
The first failing step raises `OSError`, which `subprocess` reports as a spawn failure and
the command never runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from dataclasses import dataclass

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MS_REMOUNT = 32
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_SET_SECUREBITS = 28
# SECBIT_NOROOT | _LOCKED, SECBIT_NO_SETUID_FIXUP | _LOCKED, SECBIT_KEEP_CAPS_LOCKED,
# SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED: uid 0 regains nothing on exec.
SECUREBITS_LOCKED_DOWN = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}.get(os.uname().machine, -1)
_SYS_LANDLOCK_RESTRICT_SELF = 446


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class _Rlimit(ctypes.Structure):
    _fields_ = [("soft", ctypes.c_uint64), ("hard", ctypes.c_uint64)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """libc with errno capture, loaded once in the parent."""
    global _libc  # noqa: PLW0603 - loaded once, before any fork
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        for name in (
            "syscall",
            "prctl",
            "setns",
            "unshare",
            "mount",
            "write",
            "open",
            "close",
            "symlink",
            "mkdir",
            "chdir",
        ):
            getattr(lib, name).restype = ctypes.c_long if name == "syscall" else ctypes.c_int
        _libc = lib
    return _libc


def last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            return int(fh.read().strip())
    except OSError:
        return 40


@dataclass(frozen=True)
class _Step:
    """One pre-bound call; `ok_errnos` are tolerated (e.g. EINVAL for an unknown cap)."""

    what: bytes
    fn: Callable[..., int]
    args: tuple[object, ...]
    ok_errnos: tuple[int, ...] = ()


class ChildSetup:
    """An ordered list of syscalls for the child, with every argument already built.

    Keep references to every ctypes buffer here: the child reads them after fork.
    """

    def __init__(self) -> None:
        self._lib = libc()
        self._steps: list[_Step] = []
        self._keep: list[object] = []
        self._report_fd = -1

    def report_failures_to(self, fd: int) -> None:
        """The child writes the failing step's name here (subprocess only says "preexec")."""
        self._report_fd = fd

    def __bool__(self) -> bool:
        return bool(self._steps)

    def _add(
        self, what: str, fn: Callable[..., int], *args: object, ok: tuple[int, ...] = ()
    ) -> None:
        self._steps.append(_Step(what.encode(), fn, args, ok))

    def _buf(self, data: bytes) -> ctypes.Array[ctypes.c_char]:
        buf = ctypes.create_string_buffer(data)
        self._keep.append(buf)
        return buf

    # -- namespaces ---------------------------------------------------------------
    def join_userns(self, userns_fd: int) -> None:
        """Only a single-threaded process may join a user namespace: the forked child is."""
        self._add("setns(user)", self._lib.setns, userns_fd, CLONE_NEWUSER)

    def join_netns(self, netns_fd: int) -> None:
        self._add("setns(net)", self._lib.setns, netns_fd, CLONE_NEWNET)

    def unshare(self, flags: int) -> None:
        self._add("unshare", self._lib.unshare, flags)

    def write_file(self, path: str, data: bytes) -> None:
        """open/write/close, e.g. for /proc/self/uid_map after a user-namespace unshare."""
        self._add(
            "write " + path,
            _WriteFile(self._lib, self._buf(path.encode()), self._buf(data), len(data)),
        )

    def make_mounts_private(self) -> None:
        self._add(
            "mount(private)",
            self._lib.mount,
            None,
            self._buf(b"/"),
            None,
            MS_REC | MS_PRIVATE,
            None,
        )

    def bind_read_only(self, source: str, target: str) -> None:
        src, dst = self._buf(source.encode()), self._buf(target.encode())
        self._add("bind " + target, self._lib.mount, src, dst, None, MS_BIND | MS_REC, None)
        self._add(
            "remount-ro " + target,
            self._lib.mount,
            None,
            dst,
            None,
            MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
            None,
        )

    def bind(self, source: str, target: str) -> None:
        """A writable bind; onto itself it pins a directory (mount points cannot be renamed)."""
        src, dst = self._buf(source.encode()), self._buf(target.encode())
        self._add("bind " + target, self._lib.mount, src, dst, None, MS_BIND, None)

    def remount(self, target: str, flags: int) -> None:
        """Change one mount's per-mount flags (MS_REMOUNT|MS_BIND keeps the filesystem's)."""
        self._add(
            "remount " + target,
            self._lib.mount,
            None,
            self._buf(target.encode()),
            None,
            MS_REMOUNT | MS_BIND | flags,
            None,
        )

    def chdir(self, path: str) -> None:
        """Re-enter ``path``: a cwd taken before the mounts still points below them."""
        self._add("chdir " + path, self._lib.chdir, self._buf(path.encode()))

    def move_mount(self, source: str, target: str) -> None:
        self._add(
            "move " + source,
            self._lib.mount,
            self._buf(source.encode()),
            self._buf(target.encode()),
            None,
            MS_MOVE,
            None,
        )

    def mount_fs(self, fstype: str, target: str, flags: int, data: str) -> None:
        self._add(
            f"mount {fstype} {target}",
            self._lib.mount,
            self._buf(fstype.encode()),
            self._buf(target.encode()),
            self._buf(fstype.encode()),
            flags,
            self._buf(data.encode()),
        )

    def create_file(self, path: str, mode: int = 0o666) -> None:
        self._add("create " + path, _CreateFile(self._lib, self._buf(path.encode()), mode))

    def symlink(self, target: str, path: str) -> None:
        self._add(
            "symlink " + path,
            self._lib.symlink,
            self._buf(target.encode()),
            self._buf(path.encode()),
        )

    def make_dir(self, path: str) -> None:
        """mkdir a placeholder mount point; EEXIST is fine (a concurrent run made it)."""
        self._add("mkdir " + path, self._lib.mkdir, self._buf(path.encode()), 0o755, ok=(17,))

    # -- privilege ----------------------------------------------------------------
    def die_with_parent(self) -> None:
        # The parent is the executor's spawning thread: if it dies, so does the command tree.
        self._add("pdeathsig", self._lib.prctl, PR_SET_PDEATHSIG, 9, 0, 0, 0)

    def drop_all_capabilities(self) -> None:
        """Empty the bounding and ambient sets, lock securebits, then clear the cap sets.

        With an empty bounding set and locked securebits, exec as uid 0 (or of a setuid or
        file-capability binary) cannot regain anything.
        """
        self._add(
            "securebits",
            self._lib.prctl,
            PR_SET_SECUREBITS,
            SECUREBITS_LOCKED_DOWN,
            0,
            0,
            0,
            ok=(1,),
        )  # EPERM without CAP_SETPCAP (unprivileged): bounding set still empty
        for cap in range(last_cap() + 1):
            self._add("capbset", self._lib.prctl, PR_CAPBSET_DROP, cap, 0, 0, 0, ok=(1, 22))
        self._add(
            "ambient", self._lib.prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, ok=(22,)
        )
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        self._keep += [header, data]
        self._add(
            "capset", self._lib.syscall, _SYS_CAPSET, ctypes.byref(header), ctypes.byref(data)
        )

    def no_new_privs(self) -> None:
        self._add("no_new_privs", self._lib.prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

    def landlock_restrict(self, ruleset_fd: int) -> None:
        self._add(
            "landlock_restrict_self", self._lib.syscall, _SYS_LANDLOCK_RESTRICT_SELF, ruleset_fd, 0
        )

    def seccomp(self, bpf: bytes) -> None:
        """Install a classic-BPF program (as exported by libseccomp) on this thread."""
        buf = self._buf(bpf)
        prog = _SockFprog(len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
        self._keep.append(prog)
        self._add(
            "seccomp",
            self._lib.prctl,
            PR_SET_SECCOMP,
            SECCOMP_MODE_FILTER,
            ctypes.byref(prog),
            0,
            0,
        )

    # -- resource limits ---------------------------------------------------------------
    def set_rlimit(self, resource: int, soft: int, hard: int) -> None:
        """setrlimit(2); see linux/rlimits.py for where in the step list each belongs."""
        value = _Rlimit(soft, hard)
        self._keep.append(value)
        self._add(f"setrlimit {resource}", self._lib.setrlimit, resource, ctypes.byref(value))

    # -- in the child ---------------------------------------------------------------
    def __call__(self) -> None:
        for step in self._steps:
            if step.fn(*step.args) == -1:
                err = ctypes.get_errno()
                if err not in step.ok_errnos:
                    if self._report_fd >= 0:
                        msg = step.what + b": " + os.strerror(err).encode()
                        self._lib.write(self._report_fd, msg, len(msg))
                    raise OSError(err, "sandbox child setup failed")


class _CreateFile:
    """open(O_CREAT|O_EXCL)+close as one pre-bound step: a mount point for a device."""

    def __init__(self, lib: ctypes.CDLL, path: ctypes.Array[ctypes.c_char], mode: int) -> None:
        self._lib, self._path, self._mode = lib, path, mode

    def __call__(self) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        fd = int(self._lib.open(self._path, flags, self._mode))
        if fd < 0:
            return -1
        self._lib.close(fd)
        return 0


class _WriteFile:
    """open(O_WRONLY)+write+close as one pre-bound step."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        path: ctypes.Array[ctypes.c_char],
        data: ctypes.Array[ctypes.c_char],
        size: int,
    ) -> None:
        self._lib, self._path, self._data, self._size = lib, path, data, size

    def __call__(self) -> int:
        fd = int(self._lib.open(self._path, os.O_WRONLY | os.O_CLOEXEC))
        if fd < 0:
            return -1
        n = int(self._lib.write(fd, self._data, self._size))
        self._lib.close(fd)
        return 0 if n == self._size else -1
