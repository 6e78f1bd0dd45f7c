"""Steps run in the child between fork and exec, built completely in the parent.

Other threads of the executor may hold locks (malloc, logging, import) when we fork, so the
child must not import, log or build anything: `ChildSetup` pre-binds every libc function
and pre-encodes every argument in the parent, and `__call__` only issues those syscalls.
The first failing step raises `OSError`, which `subprocess` reports as a spawn failure and
the command never runs; the step's name goes to the report pipe first, so the parent can
say which step failed (subprocess itself only says "exception in preexec_fn").

Two steps change the shape of the child: `fork_waiter()` forks, and the forking process
becomes a waiter that never returns (it holds no descriptor but a liveness pipe and exits
with the child's status), while the child continues the remaining steps as PID 1 of the
new PID namespace; `seccomp_listener()` installs a filter whose user-notification listener
descriptor is sent to the executor over a socket, so the executor's supervisor answers the
syscalls that filter hands it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
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
MS_SLAVE = 1 << 19
MNT_DETACH = 2

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

SIGKILL = 9
ENOENT = 2
EINTR = 4
EEXIST = 17
EINVAL = 22
EPERM = 1

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_MACHINE = os.uname().machine
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}.get(_MACHINE, -1)
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}.get(_MACHINE, -1)
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_SYS_CLOSE_RANGE = 436
_SYS_MOUNT_SETATTR = 442  # the same number on every architecture (new-style syscall table)
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
ENOSYS = 38
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
_SOL_SOCKET = 1
_SCM_RIGHTS = 1
_POLLIN = 1
_UINT_MAX = 0xFFFFFFFF
_F_SETFD = 2
_SIG_DFL = 0


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class _Rlimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_uint64), ("max", ctypes.c_uint64)]


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.POINTER(_Iovec)),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class _Pollfd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


_libc: ctypes.CDLL | None = None

_INT_FUNCTIONS = (
    "prctl",
    "setns",
    "unshare",
    "mount",
    "umount2",
    "write",
    "open",
    "close",
    "symlink",
    "mkdir",
    "chdir",
    "fork",
    "waitpid",
    "pipe2",
    "poll",
    "prlimit",
    "dup3",
    "getppid",
)


def libc() -> ctypes.CDLL:
    """libc with errno capture, loaded once in the parent."""
    global _libc  # noqa: PLW0603 - loaded once, before any fork
    if _libc is None:
        # The glibc soname first: find_library runs `ldconfig -p` (milliseconds per process).
        try:
            lib = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            lib = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        for name in _INT_FUNCTIONS:
            getattr(lib, name).restype = ctypes.c_int
        lib.syscall.restype = ctypes.c_long
        lib.sendmsg.restype = ctypes.c_ssize_t
        _libc = lib
    return _libc


@functools.cache
def mount_setattr_available() -> bool:
    """Whether this kernel has mount_setattr(2) (5.12+) and lets us call it. Unknown flags
    make it fail with EINVAL before any permission check (so this works unprivileged);
    ENOSYS means no such call, EPERM a container's seccomp policy refusing it."""
    lib = libc()
    attr = _MountAttr(0, 0, 0, 0)
    rc = lib.syscall(
        _SYS_MOUNT_SETATTR, -1, b"", _UINT_MAX, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    return rc == -1 and ctypes.get_errno() == EINVAL


def last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            return int(fh.read().strip())
    except OSError:
        return 40


# One step method's call as data: (method name, positional args, keyword args), every
# argument a str, bytes, int, bool or None. Replayed on a fresh `ChildSetup` by the spawn
# helper (`spawn_helper.py`), which thus runs exactly these steps, bound in its own memory.
StepCall = tuple[str, tuple[object, ...], dict[str, object]]
# A step as the compiled child runs it (`compiled_child.py`): its operation's name and its
# arguments (numbers, ctypes buffers and structures, pointers), in the C function's order.
NativeStep = tuple[str, tuple[object, ...]]
# The same with the step's name and tolerated errnos (`compiled_child.pack_steps`).
NativeStepWithName = tuple[bytes, NativeStep, tuple[int, ...]]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _recorded(
    method: Callable[Concatenate[ChildSetup, _P], _R],
) -> Callable[Concatenate[ChildSetup, _P], _R]:
    """Record the outermost step-method call (a method calling another records once)."""

    @functools.wraps(method)
    def record(self: ChildSetup, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if self._record_only:
            # Recorded only: the steps are built where they run (the spawn helper).
            self._calls.append((method.__name__, args, dict(kwargs)))
            return None  # type: ignore[return-value]  # every step method returns None
        outer, self._recording = self._recording, False
        if outer:
            self._calls.append((method.__name__, args, dict(kwargs)))
        try:
            return method(self, *args, **kwargs)
        finally:
            self._recording = outer

    return record  # type: ignore[return-value]


class ReplayCache:
    """`ChildSetup.replay` for the spawn helper, reusing what the last replay built.

    Consecutive spawns of an executor record nearly the same ~150 calls in the same order
    (only their cgroup paths and a few descriptor numbers differ), and building each step's
    ctypes buffers again was 0.38 ms of every spawn in the helper. A step is a pre-bound
    call whose arguments only say what to do: neither the compiled child (it reads them)
    nor a forked Python child (it has its own copy) writes them, so one built step serves
    any number of spawns, at once too. A call equal to the last replay's call at the same
    place reuses its steps (a step method uses its arguments' values only); any other is
    built. One replay's worth is kept.

    With ``pack`` (`compiled_child.pack_steps`), each call's steps are also kept packed
    for the compiled child (a pure function of the steps: packing every step again was
    another 0.25 ms a spawn); a step it has no form for leaves the replay without one."""

    def __init__(self, pack: Callable[[Sequence[NativeStepWithName]], bytes] | None = None) -> None:
        self._pack = pack
        self._calls: tuple[StepCall, ...] = ()
        self._built: list[_Built] = []

    def replay(
        self, calls: tuple[StepCall, ...], report_fd: int
    ) -> tuple[ChildSetup, bytes | None]:
        """The setup, and its steps packed (None: no ``pack``, or a step has no form)."""
        setup = ChildSetup()
        last, previous = self._calls, self._built
        built: list[_Built] = []
        for index, call in enumerate(calls):
            if index < len(last) and last[index] == call:
                steps, keep, packed = previous[index]
                setup._steps += steps
                setup._keep += keep
                setup._calls.append(call)
            else:
                steps, keep = setup._replayed(call)
                packed = self._packed(steps)
            built.append((steps, keep, packed))
        setup.report_failures_to(report_fd)
        self._calls, self._built = calls, built
        parts = [packed for _, _, packed in built if packed is not None]
        whole = b"".join(parts) if self._pack is not None and len(parts) == len(built) else None
        return setup, whole

    def _packed(self, steps: tuple[_Step, ...]) -> bytes | None:
        if self._pack is None:
            return None
        try:
            return self._pack([(step.what, _native(step), step.ok_errnos) for step in steps])
        except (TypeError, ValueError, KeyError):
            return None  # the Python child runs this replay


@dataclass(frozen=True)
class _Step:
    """One pre-bound call; `ok_errnos` are tolerated (e.g. EINVAL for an unknown cap)."""

    what: bytes
    fn: Callable[..., int]
    args: tuple[object, ...]
    ok_errnos: tuple[int, ...] = ()


def _native(step: _Step) -> NativeStep:
    """A step as the compiled child runs it; a libc call is named by its function."""
    native = getattr(step.fn, "native", None)
    return native() if native is not None else (step.fn.__name__, step.args)


# One replayed call: its steps, the buffers they point into, and their packed form.
_Built = tuple[tuple["_Step", ...], tuple[object, ...], bytes | None]


class ChildSetup:
    """An ordered list of syscalls for the child, with every argument already built.

    Keep references to every ctypes buffer here: the child reads them after fork.
    ``record_only``: the step methods are recorded (`calls`) but no step is built, for a
    setup the spawn helper replays; `materialized` builds them where this process forks.
    """

    def __init__(self, *, record_only: bool = False) -> None:
        self._lib = libc()
        self._steps: list[_Step] = []
        self._keep: list[object] = []
        self._report_fd = -1
        self._calls: list[StepCall] = []
        self._recording = True
        self._record_only = record_only

    @classmethod
    def replay(cls, calls: tuple[StepCall, ...], report_fd: int) -> ChildSetup:
        """A setup with its steps built from recorded ``calls`` (and its failure report)."""
        setup = cls()
        for name, args, kwargs in calls:
            getattr(setup, name)(*args, **kwargs)
        setup.report_failures_to(report_fd)
        return setup

    def _replayed(self, call: StepCall) -> tuple[tuple[_Step, ...], tuple[object, ...]]:
        """Replay one recorded call here; the steps and buffers it added."""
        steps, keep = len(self._steps), len(self._keep)
        name, args, kwargs = call
        getattr(self, name)(*args, **kwargs)
        return tuple(self._steps[steps:]), tuple(self._keep[keep:])

    def materialized(self) -> ChildSetup:
        """This setup, its steps built (a record-only one replayed here)."""
        if not self._record_only:
            return self
        return ChildSetup.replay(self.calls(), self._report_fd)

    def calls(self) -> tuple[StepCall, ...]:
        """The step methods called, in order, as data (what the spawn helper replays)."""
        return tuple(self._calls)

    @property
    def report_fd(self) -> int:
        return self._report_fd

    def report_failures_to(self, fd: int) -> None:
        """The child writes the failing step here as (errno, name): subprocess only says
        "preexec", and text would have to be parsed back."""
        self._report_fd = fd

    def step_names(self) -> tuple[str, ...]:
        """The steps in order, as the report pipe would name them (exact-output tests)."""
        return tuple(step.what.decode() for step in self._steps)

    def native_steps(self) -> tuple[NativeStepWithName, ...]:
        """Every step as the compiled child runs it (`compiled_child.py`): its name, its
        operation and the errnos it tolerates. A libc call is named by its function."""
        return tuple((step.what, _native(step), step.ok_errnos) for step in self._steps)

    def __bool__(self) -> bool:
        return bool(self._steps or self._calls)

    def _add(
        self, what: str, fn: Callable[..., int], *args: object, ok: tuple[int, ...] = ()
    ) -> None:
        self._steps.append(_Step(os.fsencode(what), fn, args, ok))

    def _buf(self, data: bytes) -> ctypes.Array[ctypes.c_char]:
        buf = ctypes.create_string_buffer(data)
        self._keep.append(buf)
        return buf

    # -- namespaces ---------------------------------------------------------------
    @_recorded
    def join_ns(self, fd: int, nstype: int, name: str) -> None:
        """`setns`; joining a user namespace needs a single-threaded process: the child is."""
        self._add(f"setns({name})", self._lib.setns, fd, nstype)

    @_recorded
    def unshare(self, flags: int) -> None:
        self._add("unshare", self._lib.unshare, flags)

    @_recorded
    def write_file(self, path: str, data: bytes) -> None:
        """open/write/close, e.g. for /proc/self/uid_map after a user-namespace unshare."""
        self._add(
            "write " + path,
            _WriteFile(self._lib, self._buf(os.fsencode(path)), self._buf(data), len(data)),
        )

    @_recorded
    def map_ids(self, uid: int, gid: int) -> None:
        """Map ``uid``/``gid`` onto themselves in a user namespace this child just made."""
        self.write_file("/proc/self/setgroups", b"deny")
        self.write_file("/proc/self/uid_map", f"{uid} {uid} 1".encode())
        self.write_file("/proc/self/gid_map", f"{gid} {gid} 1".encode())

    # -- mounts -------------------------------------------------------------------
    @_recorded
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

    @_recorded
    def make_mounts_slave(self) -> None:
        """Host mount events still propagate in; nothing mounted here propagates out."""
        self._add(
            "mount(slave)", self._lib.mount, None, self._buf(b"/"), None, MS_REC | MS_SLAVE, None
        )

    @_recorded
    def bind_read_only(self, source: str, target: str, *, optional: bool = False) -> None:
        """A read-only bind; ``optional``: a source or target that vanished is skipped (and
        so is the remount, which then finds no mount of its own at ``target``, or nothing)."""
        src, dst = self._buf(os.fsencode(source)), self._buf(os.fsencode(target))
        missing = (ENOENT,) if optional else ()
        flags = MS_BIND | MS_REC
        self._add("bind " + target, self._lib.mount, src, dst, None, flags, None, ok=missing)
        remount = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
        self._add(
            "remount-ro " + target,
            self._lib.mount,
            None,
            dst,
            None,
            remount,
            None,
            ok=(EINVAL, ENOENT) if optional else (),
        )

    @_recorded
    def bind(
        self, source: str, target: str, *, recursive: bool = False, optional: bool = False
    ) -> None:
        """A bind with the source mount's flags; onto itself it pins a directory (mount
        points cannot be renamed). ``optional``: a source or target that vanished is
        skipped."""
        src, dst = self._buf(os.fsencode(source)), self._buf(os.fsencode(target))
        flags = MS_BIND | (MS_REC if recursive else 0)
        missing = (ENOENT,) if optional else ()
        self._add("bind " + target, self._lib.mount, src, dst, None, flags, None, ok=missing)

    @_recorded
    def remount(self, target: str, flags: int) -> None:
        """Change one mount's per-mount flags (MS_REMOUNT|MS_BIND keeps the filesystem's)."""
        self._add(
            "remount " + target,
            self._lib.mount,
            None,
            self._buf(os.fsencode(target)),
            None,
            MS_REMOUNT | MS_BIND | flags,
            None,
        )

    @_recorded
    def set_mount_attrs(
        self,
        target: str,
        *,
        add: int = 0,
        clear: int = 0,
        recursive: bool = False,
        optional: bool = False,
    ) -> None:
        """mount_setattr(2): add or clear per-mount flags (MOUNT_ATTR_*) of the mount at
        ``target``, or of its whole subtree in one atomic step; ``optional``: no mount there
        (it vanished) is fine."""
        attr = _MountAttr(add, clear, 0, 0)
        self._keep.append(attr)
        self._add(
            f"setattr {target}",
            self._lib.syscall,
            _SYS_MOUNT_SETATTR,
            _AT_FDCWD,
            self._buf(os.fsencode(target)),
            _AT_RECURSIVE if recursive else 0,
            ctypes.pointer(attr),
            ctypes.sizeof(attr),
            ok=(ENOENT,) if optional else (),
        )

    @_recorded
    def move_mount(self, source: str, target: str) -> None:
        self._add(
            "move " + source,
            self._lib.mount,
            self._buf(os.fsencode(source)),
            self._buf(os.fsencode(target)),
            None,
            MS_MOVE,
            None,
        )

    @_recorded
    def mount_fs(self, fstype: str, target: str, flags: int, data: str) -> None:
        self._add(
            f"mount {fstype} {target}",
            self._lib.mount,
            self._buf(fstype.encode()),
            self._buf(os.fsencode(target)),
            self._buf(fstype.encode()),
            flags,
            self._buf(os.fsencode(data)),
        )

    @_recorded
    def unmount(self, target: str) -> None:
        """Detach a staging mount (lazily: binds taken from it stay)."""
        self._add("umount " + target, self._lib.umount2, self._buf(os.fsencode(target)), MNT_DETACH)

    @_recorded
    def create_file(self, path: str, mode: int = 0o666) -> None:
        self._add("create " + path, _CreateFile(self._lib, self._buf(os.fsencode(path)), mode))

    @_recorded
    def symlink(self, target: str, path: str) -> None:
        self._add(
            "symlink " + path,
            self._lib.symlink,
            self._buf(os.fsencode(target)),
            self._buf(os.fsencode(path)),
        )

    @_recorded
    def make_dir(self, path: str, mode: int = 0o755) -> None:
        """mkdir a mount point; EEXIST is fine (it may be there already)."""
        self._add(
            "mkdir " + path, self._lib.mkdir, self._buf(os.fsencode(path)), mode, ok=(EEXIST,)
        )

    @_recorded
    def chdir(self, path: str) -> None:
        """Re-enter ``path``: a cwd taken before the mounts still points below them."""
        self._add("chdir " + path, self._lib.chdir, self._buf(os.fsencode(path)))

    # -- processes ----------------------------------------------------------------
    @_recorded
    def die_with_parent(self) -> None:
        """PR_SET_PDEATHSIG, then make sure the parent had not already died before it was
        armed (the child would have been reparented and never get the signal)."""
        # The parent is the executor's spawning thread: if it dies, so does the command tree.
        self._add("pdeathsig", self._lib.prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        self._add("parent alive", _ParentIs(self._lib, os.getpid()))

    @_recorded
    def fork_waiter(self, init_fd: int = -1) -> None:
        """Fork: the parent waits and exits with the child's status (128+n for signal n);
        the child, PID 1 of a PID namespace unshared before, runs the remaining steps.
        ``init_fd``: the compiled init held there (`sandbox_init`), which the waiter execs
        to wait in, sharing none of the forking process's memory."""
        self._add("fork", _ForkWaiter(self._lib, init_fd))

    @_recorded
    def set_rlimit(self, resource: int, soft: int, hard: int, why: str = "") -> None:
        """setrlimit(``resource``); ``why`` names the step in a failure report."""
        limit = _Rlimit(soft, hard)
        self._keep.append(limit)
        name = why or f"rlimit {resource}"
        self._add(name, self._lib.prlimit, 0, resource, ctypes.pointer(limit), None)

    @_recorded
    def hold_dir(self, path: str, fd: int) -> None:
        """Open ``path`` and keep it at descriptor ``fd`` (close-on-exec): later steps reach
        it as `/proc/self/fd/<fd>` even after its path has been mounted over."""
        flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
        self._add(f"hold {path}", _Hold(self._lib, self._buf(os.fsencode(path)), fd, flags))

    @_recorded
    def hold_file(self, path: str, fd: int) -> None:
        """`hold_dir` for a file: the exec of `/proc/self/fd/<fd>` runs it wherever the
        view puts (or hides) its path; close-on-exec, so what it runs does not hold it."""
        flags = os.O_PATH | os.O_CLOEXEC
        self._add(f"hold {path}", _Hold(self._lib, self._buf(os.fsencode(path)), fd, flags))

    @_recorded
    def close_fd(self, fd: int) -> None:
        self._add(f"close {fd}", self._lib.close, fd)

    # -- privilege ----------------------------------------------------------------
    @_recorded
    def drop_all_capabilities(self) -> None:
        """Empty the bounding and ambient sets, lock securebits, then clear the cap sets.

        With an empty bounding set and locked securebits, exec as uid 0 (or of a setuid or
        file-capability binary) cannot regain anything.
        """
        # EPERM without CAP_SETPCAP (unprivileged): the bounding set is still emptied.
        self._add(
            "securebits",
            self._lib.prctl,
            PR_SET_SECUREBITS,
            SECUREBITS_LOCKED_DOWN,
            0,
            0,
            0,
            ok=(EPERM,),
        )
        for cap in range(last_cap() + 1):
            self._add("capbset", self._lib.prctl, PR_CAPBSET_DROP, cap, 0, 0, 0, ok=(EPERM, EINVAL))
        self._add(
            "ambient",
            self._lib.prctl,
            PR_CAP_AMBIENT,
            PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
            ok=(EINVAL,),
        )
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        self._keep += [header, data]
        self._add(
            "capset", self._lib.syscall, _SYS_CAPSET, ctypes.pointer(header), ctypes.pointer(data)
        )

    @_recorded
    def no_new_privs(self) -> None:
        self._add("no_new_privs", self._lib.prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

    @_recorded
    def landlock_allow(self, ruleset_fd: int, path: str, rights: int) -> None:
        """Add a path-beneath rule from inside the child: for what exists only in the
        child's own mount namespace (an overlay it mounted), the parent cannot open it."""
        self._add(
            f"landlock rule {path}",
            _LandlockAllow(self._lib, self._buf(os.fsencode(path)), ruleset_fd, rights),
        )

    @_recorded
    def landlock_restrict(self, ruleset_fd: int) -> None:
        self._add(
            "landlock_restrict_self", self._lib.syscall, _SYS_LANDLOCK_RESTRICT_SELF, ruleset_fd, 0
        )

    def _prog(self, bpf: bytes) -> SockFprog:
        buf = self._buf(bpf)
        prog = SockFprog(len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
        self._keep.append(prog)
        return prog

    @_recorded
    def seccomp(self, bpf: bytes) -> None:
        """Install a classic-BPF program (as exported by libseccomp) on this thread."""
        prog = self._prog(bpf)
        self._add(
            "seccomp",
            self._lib.prctl,
            PR_SET_SECCOMP,
            SECCOMP_MODE_FILTER,
            ctypes.pointer(prog),
            0,
            0,
        )

    @_recorded
    def seccomp_listener(self, bpf: bytes, sock_fd: int) -> None:
        """Install ``bpf`` with a user-notification listener and send the listener over
        ``sock_fd`` (SCM_RIGHTS), then close both: the command never holds either."""
        self._add("seccomp(listener)", _SeccompListener(self._lib, self._prog(bpf), sock_fd))

    # -- in the child ---------------------------------------------------------------
    def __call__(self) -> None:
        # A record-only setup is materialized before any fork (`ConfinedSpawn._wrap`); one
        # that reaches a fork anyway builds its steps here, in the child, before any runs.
        for step in self.materialized()._steps:
            if step.fn(*step.args) == -1:
                err = ctypes.get_errno()
                if err not in step.ok_errnos:
                    if self._report_fd >= 0:
                        # (errno, step): read back by `backends/child_failure.py`.
                        msg = err.to_bytes(4, "little") + step.what
                        self._lib.write(self._report_fd, msg, len(msg))
                    raise OSError(err, "sandbox child setup failed")


class _CreateFile:
    """open(O_CREAT|O_EXCL)+close as one pre-bound step: a mount point for a device."""

    def __init__(self, lib: ctypes.CDLL, path: ctypes.Array[ctypes.c_char], mode: int) -> None:
        self._lib, self._path, self._mode = lib, path, mode

    def native(self) -> NativeStep:
        return "create_file", (self._path, self._mode)

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

    def native(self) -> NativeStep:
        return "write_file", (self._path, self._data, self._size)

    def __call__(self) -> int:
        fd = int(self._lib.open(self._path, os.O_WRONLY | os.O_CLOEXEC))
        if fd < 0:
            return -1
        n = int(self._lib.write(fd, self._data, self._size))
        self._lib.close(fd)
        return 0 if n == self._size else -1


class _ParentIs:
    """Exit at once when the parent is no longer ``pid`` (it died: nothing may run)."""

    def __init__(self, lib: ctypes.CDLL, pid: int) -> None:
        self._lib, self._pid = lib, pid

    def native(self) -> NativeStep:
        return "parent_is", (self._pid,)

    def __call__(self) -> int:
        if self._lib.getppid() != self._pid:
            self._lib._exit(125)
        return 0


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _LandlockAllow:
    """open(O_PATH) + landlock_add_rule(PATH_BENEATH) + close, as one step."""

    def __init__(
        self, lib: ctypes.CDLL, path: ctypes.Array[ctypes.c_char], ruleset_fd: int, rights: int
    ) -> None:
        self._lib, self._path, self._ruleset = lib, path, ruleset_fd
        self._attr = _PathBeneath(rights, -1)

    def native(self) -> NativeStep:
        return "landlock_allow", (self._path, self._ruleset, self._attr.allowed_access)

    def __call__(self) -> int:
        fd = int(self._lib.open(self._path, os.O_PATH | os.O_CLOEXEC))
        if fd < 0:
            return -1
        self._attr.parent_fd = fd
        rc = int(
            self._lib.syscall(_SYS_LANDLOCK_ADD_RULE, self._ruleset, 1, ctypes.byref(self._attr), 0)
        )
        self._lib.close(fd)
        return 0 if rc == 0 else -1


class _Hold:
    """open(``flags``) + dup3 onto a fixed number (close-on-exec) + close, as one step."""

    def __init__(
        self, lib: ctypes.CDLL, path: ctypes.Array[ctypes.c_char], fd: int, flags: int
    ) -> None:
        self._lib, self._path, self._fd, self._flags = lib, path, fd, flags

    def native(self) -> NativeStep:
        return "hold", (self._path, self._fd, self._flags)

    def __call__(self) -> int:
        fd = int(self._lib.open(self._path, self._flags))
        if fd < 0:
            return -1
        ok = self._lib.dup3(fd, self._fd, os.O_CLOEXEC)
        self._lib.close(fd)
        return 0 if ok == self._fd else -1


class _ForkWaiter:
    """The fork step. The waiter keeps only the write end of a liveness pipe (so the child
    can tell, once its own PDEATHSIG is armed, that the waiter was still alive) and closes
    everything else at once: the executor's pipes reach EOF when the command ends, and
    subprocess's exec-status pipe closes as soon as the child execs."""

    def __init__(self, lib: ctypes.CDLL, init_fd: int = -1) -> None:
        self._lib = lib
        self._init_fd = init_fd
        self._pipe = (ctypes.c_int * 2)()
        self._status = ctypes.c_int(0)
        self._poll = _Pollfd(0, _POLLIN, 0)
        self._argv = (ctypes.c_char_p * 3)(b"sandbox-waiter", b"--wait", None)
        self._env = (ctypes.c_char_p * 1)(None)

    def native(self) -> NativeStep:
        return "fork_waiter", (self._init_fd,)

    def __call__(self) -> int:
        lib = self._lib
        if lib.pipe2(self._pipe, os.O_CLOEXEC) < 0:
            return -1
        read_end, write_end = self._pipe[0], self._pipe[1]
        pid = lib.fork()
        if pid < 0:
            return -1
        if pid == 0:
            lib.close(write_end)
            if lib.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0:
                return -1
            self._poll.fd = read_end
            # Readable (EOF) means the waiter died before our PDEATHSIG was armed.
            if lib.poll(ctypes.byref(self._poll), 1, 0) != 0:
                lib._exit(125)
            lib.close(read_end)
            return 0
        lib.close(read_end)
        # The executor's signal handlers (a CLI that handles SIGTERM) back to the defaults,
        # so a signal to the group ends the waiter; an exec would keep what is ignored.
        for signum in range(1, 65):
            lib.signal(signum, _SIG_DFL)
        keep = sorted({write_end, self._init_fd} - {-1})
        low = 0
        for fd in keep:
            if fd > low:
                lib.syscall(_SYS_CLOSE_RANGE, low, fd - 1, 0)
            low = fd + 1
        lib.syscall(_SYS_CLOSE_RANGE, low, _UINT_MAX, 0)
        # The liveness pipe stays open across the exec; the init's descriptor does not.
        if self._init_fd >= 0 and lib.fcntl(write_end, _F_SETFD, 0) == 0:
            lib.fexecve(self._init_fd, self._argv, self._env)
            lib.close(self._init_fd)  # not exec'd: wait here instead
        while lib.waitpid(pid, ctypes.byref(self._status), 0) != pid:
            if ctypes.get_errno() != EINTR:
                lib._exit(125)
        status = self._status.value
        signum = status & 0x7F
        lib._exit((status >> 8) & 0xFF if signum == 0 else 128 + signum)
        return -1  # not reached


class _SeccompListener:
    """seccomp(NEW_LISTENER), then sendmsg(SCM_RIGHTS) of the listener, then close both.
    The message and its control buffer are built in the parent; only the fd is filled in."""

    def __init__(self, lib: ctypes.CDLL, prog: SockFprog, sock_fd: int) -> None:
        self._lib = lib
        self._prog = prog
        self._sock = sock_fd
        self._byte = ctypes.create_string_buffer(b"L", 1)
        self._iov = _Iovec(ctypes.cast(self._byte, ctypes.c_void_p), 1)
        # struct cmsghdr {size_t len; int level; int type;} + one int, padded to 24 bytes.
        self._control = ctypes.create_string_buffer(24)
        header = ctypes.c_size_t.from_buffer(self._control, 0)
        header.value = 20
        ctypes.c_int.from_buffer(self._control, 8).value = _SOL_SOCKET
        ctypes.c_int.from_buffer(self._control, 12).value = _SCM_RIGHTS
        self._slot = ctypes.c_int.from_buffer(self._control, 16)
        self._msg = _Msghdr(
            None,
            0,
            ctypes.pointer(self._iov),
            1,
            ctypes.cast(self._control, ctypes.c_void_p),
            24,
            0,
        )

    def native(self) -> NativeStep:
        return "seccomp_listener", (self._prog, self._sock)

    def __call__(self) -> int:
        lib = self._lib
        fd = int(
            lib.syscall(
                _SYS_SECCOMP,
                SECCOMP_SET_MODE_FILTER,
                SECCOMP_FILTER_FLAG_NEW_LISTENER,
                ctypes.byref(self._prog),
            )
        )
        if fd < 0:
            return -1
        self._slot.value = fd
        sent = lib.sendmsg(self._sock, ctypes.byref(self._msg), 0)
        lib.close(fd)
        lib.close(self._sock)
        return 0 if sent == 1 else -1
