"""The spawn helper's compiled child (`native/spawn_child.c`): found, checked and fed.

A child forked from the helper in Python is a copy of an interpreter: each object it
touches (the steps, the request, the modules) is a copy-on-write fault, and so is every
page the PID-namespace waiter it forks touches. The compiled child runs the very same
steps (`ChildSetup.native_steps`: built by `ChildSetup` in the helper, every argument a
number or a pointer into the helper's memory, which the fork copies) with the same
tolerated errnos and failure reports, and places the descriptors as `spawn_helper._child`
does. Nothing about what is confined, or how, is decided here. Measured (`scripts/bench
--only spawn_helper`): `run("true")` 0.95-0.98x the Python child, throughput 1.04-1.09x;
the rest of the children's cost is the kernel's namespace and mount work.

Like the write watch's fast path (`fast_writes.py`): built by the package's build (an
optional extension), never at run time; a build whose compiled-in source hash is not this
source's is not used. The executor checks the build (`built`) and hands its path to the
helper, which loads this file by path (`load`, `spawn`): it imports standard modules only.
Without a build the helper forks in Python, as before.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:  # never imported in the helper at run time: it stays lean
    from collections.abc import Sequence
    from pathlib import Path

# The C side's operations, in its enum's order (`spawn_child.c`).
OPS = (
    "prctl",
    "setns",
    "unshare",
    "mount",
    "umount2",
    "symlink",
    "mkdir",
    "chdir",
    "prlimit",
    "close",
    "syscall",
    "create_file",
    "write_file",
    "parent_is",
    "landlock_allow",
    "hold",
    "fork_waiter",
    "seccomp_listener",
)
_OP_NUMBER = {name: number for number, name in enumerate(OPS)}
# `BSC_MAX_OK` and `BSC_MAX_ARGS` in `spawn_child.c`.
_MAX_OK = 4
_MAX_ARGS = 6
_MASK = (1 << 64) - 1
# One step: its name, (operation, arguments) and tolerated errnos (`ChildSetup.native_steps`).
NativeStep = tuple[bytes, tuple[str, tuple[object, ...]], tuple[int, ...]]
# Tests turn the compiled child off to exercise the Python one (never needed otherwise).
ENABLED = True


class Step(ctypes.Structure):
    """`struct bsc_step`."""

    _fields_ = [
        ("op", ctypes.c_int32),
        ("n_ok", ctypes.c_int32),
        ("ok", ctypes.c_int32 * _MAX_OK),
        ("what", ctypes.c_char_p),
        ("what_len", ctypes.c_uint64),
        ("a", ctypes.c_uint64 * _MAX_ARGS),
    ]


# `Step` packed in one call: the same layout, no padding (every field is naturally aligned).
_STEP = struct.Struct(f"=ii{_MAX_OK}iQQ{_MAX_ARGS}Q")
assert _STEP.size == ctypes.sizeof(Step)


class Request(ctypes.Structure):
    """`struct bsc_request`."""

    _fields_ = [
        ("fds", ctypes.POINTER(ctypes.c_int32)),
        ("targets", ctypes.POINTER(ctypes.c_int32)),
        ("inheritable", ctypes.POINTER(ctypes.c_int32)),
        ("ntargets", ctypes.c_int32),
        ("err_w", ctypes.c_int32),
        ("report_fd", ctypes.c_int32),
        ("nsteps", ctypes.c_int32),
        ("steps", ctypes.POINTER(Step)),
        ("cwd", ctypes.c_char_p),
        ("argv", ctypes.POINTER(ctypes.c_char_p)),
        ("envp", ctypes.POINTER(ctypes.c_char_p)),
    ]


def _word(arg: object) -> int:
    """One argument as the C side takes it: a number, or the address of what it names."""
    if arg is None:
        return 0
    if isinstance(arg, int):
        return arg & _MASK
    if isinstance(arg, (ctypes.Array, ctypes.Structure)):
        return ctypes.addressof(arg)
    if isinstance(arg, ctypes._Pointer):
        return ctypes.cast(arg, ctypes.c_void_p).value or 0
    raise TypeError(f"no compiled form for a step argument of type {type(arg).__name__}")


def pack_steps(native: Sequence[NativeStep]) -> bytes:
    """The steps in C form, packed at once (a field-by-field ctypes fill cost the helper
    2 us a step). Each names itself by the address of its own name's bytes: the step that
    holds them must outlive the spawn (the helper keeps both, and reuses a packed step with
    its step: `ReplayCache`)."""
    packed = bytearray(_STEP.size * len(native))
    for index, (what, (operation, args), ok) in enumerate(native):
        if len(args) > _MAX_ARGS or len(ok) > _MAX_OK:
            raise TypeError(f"step {what!r} does not fit the compiled child")
        words = [_word(arg) for arg in args]
        _STEP.pack_into(
            packed,
            index * _STEP.size,
            _OP_NUMBER[operation],
            len(ok),
            *ok,
            *(0,) * (_MAX_OK - len(ok)),
            _address(what),
            len(what),
            *words,
            *(0,) * (_MAX_ARGS - len(words)),
        )
    return bytes(packed)


def _address(data: bytes) -> int:
    # A c_char_p made from bytes points into the bytes object itself (no copy).
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


def _strings(values: Sequence[bytes]) -> ctypes.Array[ctypes.c_char_p]:
    array = (ctypes.c_char_p * (len(values) + 1))()
    array[: len(values)] = list(values)
    return array


def _ints(values: Sequence[int]) -> ctypes.Array[ctypes.c_int32]:
    return (ctypes.c_int32 * max(len(values), 1))(*values)


class Spawn:
    """One request in C form: everything the child reads is memory this object holds, but
    the steps' names and buffers (``steps``: `pack_steps`), which their `ChildSetup` holds.
    The child reads it only until it execs, which `spawn` waits for (or a fork copied it),
    so it need live only until `spawn` has returned."""

    def __init__(
        self,
        *,
        argv: Sequence[str | bytes],
        env: dict[str, str] | dict[bytes, bytes],
        cwd: str | bytes,
        fds: Sequence[int],
        targets: Sequence[int],
        inheritable: Sequence[int],
        err_w: int,
        report_fd: int,
        steps: bytes,
    ) -> None:
        encoded_argv = [os.fsencode(a) for a in argv]
        encoded_env = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
        encoded_cwd = os.fsencode(cwd)
        if any(b"\0" in s for s in (*encoded_argv, *encoded_env, encoded_cwd)) or not argv:
            raise ValueError("embedded null byte")  # os.execve's own refusal
        # Held here for as long as this object lives (the structure's pointers do not).
        self._steps = (Step * (len(steps) // _STEP.size)).from_buffer_copy(steps)
        self._argv = _strings(encoded_argv)
        self._env = _strings(encoded_env)
        self._fds = _ints(fds)
        self._targets = _ints(targets)
        self._inheritable = _ints([int(t in inheritable) for t in targets])
        self._cwd = encoded_cwd
        self.request = Request(
            fds=self._fds,
            targets=self._targets,
            inheritable=self._inheritable,
            ntargets=len(targets),
            err_w=err_w,
            report_fd=report_fd,
            nsteps=len(self._steps),
            steps=self._steps,
            cwd=self._cwd,
            argv=self._argv,
            envp=self._env,
        )


def load(path: str) -> ctypes.CDLL:
    """The build at ``path`` (already checked by the executor: `built`)."""
    lib = ctypes.CDLL(path, use_errno=True)
    lib.bsc_spawn.argtypes = [ctypes.POINTER(Request)]
    lib.bsc_spawn.restype = ctypes.c_int
    return lib


def spawn(lib: ctypes.CDLL, prepared: Spawn) -> int:
    """Start the compiled child for ``prepared``; its pid, once it has exec'd or failed
    (the calling thread waits: `spawn_child.c`)."""
    pid = int(lib.bsc_spawn(ctypes.byref(prepared.request)))
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return pid


def built() -> Path | None:
    """The build the package left next to this module, if it was built from this source
    (and `ENABLED`); checked in the executor, which has the package at hand."""
    return _checked() if ENABLED else None


@functools.cache
def _checked() -> Path | None:
    from bash_sandbox.linux.native_build import HERE, checked_build

    found = checked_build("_spawn_child", HERE / "native" / "spawn_child.c", "bsc_source_sha256")
    return found[0] if found is not None else None
