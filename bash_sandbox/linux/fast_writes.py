"""The write watch's fast path in C (`native/fast_writes.c`): loaded and fed its rules.

Every write-intent open and tree change of a confined command traps to the supervisor so a
refused one can be reported (`write_watch.py`). Nearly all of them land inside a writable
root, where judging finds nothing; in Python each still costs a wake-up of the harness's
supervisor thread and the GIL: 95 us a trap against 12 us here (`scripts/bench-writes`; a
C build +6-10% against within 5%). The C thread answers those, and only those, with
CONTINUE; it also answers a connect to a unix socket path that does not exist with ENOENT,
as the supervisor would (glibc's nscd probes: two per first user lookup). Every other
notification reaches the Python supervisor unchanged over a socket pair (`supervisor.py`),
so what is decided and what is recorded do not change.

The package's build compiles it (`setup.py`, an optional extension: the install goes on
without a C compiler), next to this module, as trusted as the Python beside it; nothing is
compiled at run time. A build whose compiled-in source hash is not this source's (an
editable install whose C file changed since) is not loaded. Without one, `library()` is
None and the Python path serves every call.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Mapping
from pathlib import Path

from bash_sandbox.linux.file_calls import FileCall
from bash_sandbox.linux.native_build import checked_build
from bash_sandbox.linux.write_watch import WritePolicy

SOURCE = Path(__file__).with_name("native") / "fast_writes.c"
# Entries per list the C side holds (`BSF_MAX_RULES`); a longer list: no fast path.
MAX_RULES = 256
# Tests turn the fast path off to exercise the Python one (never needed in production).
ENABLED = True


class Call(ctypes.Structure):
    """`struct bsf_call`: one `FileCall`'s argument layout, -1 for none."""

    _fields_ = [
        ("nr", ctypes.c_int32),
        ("path", ctypes.c_int8),
        ("dirfd", ctypes.c_int8),
        ("path2", ctypes.c_int8),
        ("dirfd2", ctypes.c_int8),
        ("mode", ctypes.c_int8),
        ("flags", ctypes.c_int8),
        ("xattr", ctypes.c_int8),
        ("write", ctypes.c_int8),
    ]


def call_table(calls: Mapping[int, FileCall]) -> ctypes.Array[Call]:
    """The supervisor's dispatch table in the C layout."""

    def index(value: int | None) -> int:
        return -1 if value is None else value

    table = (Call * len(calls))()
    for slot, (nr, c) in zip(table, sorted(calls.items()), strict=True):
        slot.nr = nr
        slot.path, slot.dirfd = index(c.path), index(c.dirfd)
        slot.path2, slot.dirfd2 = index(c.path2), index(c.dirfd2)
        slot.mode, slot.flags, slot.xattr = index(c.mode), index(c.flags), index(c.xattr)
        slot.write = 1 if c.write is not None else 0
    return table


def rules_blob(policy: WritePolicy) -> bytes | None:
    """``policy``'s fast rules as the C side reads them (six lists of NUL-ended strings, each
    list ended by an empty one; the helpers' identities as "device:inode"), or None when a
    rule cannot be written so or a list is longer than the C side holds."""
    lists = (
        policy.roots,
        policy.hidden,
        tuple(path for path, _ in policy.guarded),
        policy.protected,
        policy.scratch,
        tuple(f"{dev}:{ino}" for dev, ino in sorted(policy.helpers)),
    )
    out = bytearray()
    for entries in lists:
        if len(entries) > MAX_RULES:
            return None
        for entry in entries:
            raw = os.fsencode(entry)
            if not raw or b"\0" in raw:
                return None
            out += raw + b"\0"
        out += b"\0"
    return bytes(out)


@functools.cache
def _load() -> ctypes.CDLL | None:
    found = checked_build("_fast_writes", SOURCE, "bsf_source_sha256")
    if found is None:
        return None
    lib = found[1]
    _declare(lib)
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled fast path (loaded once per process); None where the build left none."""
    return _load() if ENABLED else None


def _declare(lib: ctypes.CDLL) -> None:
    lib.bsf_start.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(Call),
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.bsf_start.restype = ctypes.c_void_p
    lib.bsf_join.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.bsf_join.restype = ctypes.c_int
    lib.bsf_rules_answer.argtypes = [
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_char_p,
    ]
    lib.bsf_rules_answer.restype = ctypes.c_int
    lib.bsf_leads_elsewhere.argtypes = [ctypes.c_char_p]
    lib.bsf_leads_elsewhere.restype = ctypes.c_int
    lib.bsf_helper_answer.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
    lib.bsf_helper_answer.restype = ctypes.c_int


def answer(lib: ctypes.CDLL, policy: WritePolicy, path: str) -> bool | None:
    """The C rules' `surely_writable` for ``path`` (for the tests); None: no fast rules."""
    blob = rules_blob(policy)
    if blob is None:
        return None
    got = lib.bsf_rules_answer(
        blob, len(blob), int(policy.read_only), int(policy.view_mounts), os.fsencode(path)
    )
    return None if got < 0 else bool(got)


def is_helper(lib: ctypes.CDLL, policy: WritePolicy, pid: int) -> bool | None:
    """The C side's `write_watch._is_helper` for ``pid`` (for the tests); None: no rules."""
    blob = rules_blob(policy)
    if blob is None:
        return None
    got = lib.bsf_helper_answer(blob, len(blob), pid)
    return None if got < 0 else bool(got)


def leads_elsewhere(lib: ctypes.CDLL, path: str) -> bool:
    """The C side's `write_watch.leads_elsewhere` for ``path`` (for the tests)."""
    return bool(lib.bsf_leads_elsewhere(os.fsencode(path)))
