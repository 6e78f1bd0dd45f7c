"""The write watch's fast path in C (`native/fast_writes.c`): built, loaded, and fed its rules.

Every write-intent open and tree change of a confined command traps to the supervisor so a
refused one can be reported (`write_watch.py`). Nearly all of them land inside a writable
root, where judging finds nothing; in Python each still costs a wake-up of the harness's
supervisor thread and the GIL: 95 us a trap against 12 us here (`scripts/bench-writes`; a
C build +6-10% against within 5%). The C thread answers those, and only those, with
CONTINUE; every other notification reaches the
Python supervisor unchanged over a socket pair (`supervisor.py`), so what is decided and what
is recorded do not change.

Built once per source and user with the system C compiler (root-owned, as `bwrap` is) into
the user's private base directory (0700, hidden from every confined command), by an atomic
rename, and loaded only while that file is this uid's and closed to others. Without a
compiler, or when the build fails, `library()` is None and the Python path serves every
call, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import stat
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

from bash_local.userdir import user_base_dir
from bash_sandbox.linux.binaries import SYSTEM_DIRS, system_binary
from bash_sandbox.linux.file_calls import FileCall
from bash_sandbox.linux.write_watch import WritePolicy

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "fast_writes.c"
_BUILD_TIMEOUT_S = 60
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
    """``policy``'s fast rules as the C side reads them (five lists of NUL-ended strings, each
        list ended by an empty one), or None when a rule cannot be written so or a list is longer
    than the C side holds."""
    lists = (
        policy.roots,
        policy.hidden,
        tuple(path for path, _ in policy.guarded),
        policy.protected,
        policy.scratch,
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


def _owned_file(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _build(source: bytes, target: str) -> bool:
    # Only a root-owned system compiler: a `cc` on the harness's PATH may be one a command
    # planted in a workspace venv, and it would run with the harness's rights.
    compiler = system_binary("cc") or system_binary("gcc")
    if compiler is None:
        return False
    directory = os.path.dirname(target)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", "-x", "c", "-", "-o", temporary],
            input=source,
            capture_output=True,
            timeout=_BUILD_TIMEOUT_S,
            check=False,
            env={"PATH": ":".join(SYSTEM_DIRS), "LC_ALL": "C"},
        )
        if done.returncode != 0:
            logger.warning("write watch fast path not built: %s", done.stderr.decode()[-500:])
            return False
        os.chmod(temporary, 0o600)
        os.replace(temporary, target)
        _remove_older(target)
        return True
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("write watch fast path not built: %s", exc)
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _remove_older(target: str) -> None:
    """Builds of other sources (a package upgrade) go; one loaded elsewhere stays mapped."""
    directory, name = os.path.split(target)
    for entry in os.listdir(directory):
        if entry.startswith("fast_writes-") and entry.endswith(".so") and entry != name:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, entry))


_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
_building: set[str] = set()


@functools.cache
def _source() -> tuple[bytes, str]:
    source = SOURCE.read_bytes()
    return source, hashlib.sha256(source + os.uname().machine.encode()).hexdigest()[:16]


def _target(key: str) -> str | None:
    """Where the build for ``key`` lives: the user's private directory, or None if unsafe."""
    directory = os.path.join(user_base_dir(), "native")
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    st = os.lstat(directory)
    if not (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077):
        return None
    return os.path.join(directory, f"fast_writes-{key}.so")


def _load(target: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(target)
    _declare(lib)
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled fast path, built on first use (blocking); None where it cannot be."""
    if not ENABLED:
        return None
    source, key = _source()
    with _lock:
        if key in _loaded:
            return _loaded[key]
        lib = None
        try:
            target = _target(key)
            if target is not None and (
                _owned_file(target) or (_build(source, target) and _owned_file(target))
            ):
                lib = _load(target)
        except OSError as exc:
            logger.warning("write watch fast path unavailable: %s", exc)
        _loaded[key] = lib
        return lib


def ready() -> ctypes.CDLL | None:
    """The fast path if it is built already (loaded now: a millisecond, once per process);
    otherwise None, and a build starts in the background for the commands after this one."""
    if not ENABLED:
        return None
    _, key = _source()
    with _lock:
        if key in _loaded:
            return _loaded[key]
        try:
            target = _target(key)
            if target is not None and _owned_file(target):
                _loaded[key] = _load(target)
                return _loaded[key]
        except OSError as exc:
            logger.warning("write watch fast path unavailable: %s", exc)
            _loaded[key] = None
            return None
        if key in _building:
            return None
        _building.add(key)
    threading.Thread(target=_build_quietly, name="bash-sandbox-build", daemon=True).start()
    return None


def _build_quietly() -> None:
    try:
        library()
    except Exception:  # a fast path that cannot be built is no fast path
        logger.exception("write watch fast path unavailable")


def _declare(lib: ctypes.CDLL) -> None:
    lib.bsf_serve.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(Call),
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.bsf_serve.restype = ctypes.c_int
    lib.bsf_rules_answer.argtypes = [
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_char_p,
    ]
    lib.bsf_rules_answer.restype = ctypes.c_int


def answer(lib: ctypes.CDLL, policy: WritePolicy, path: str) -> bool | None:
    """The C rules' `surely_writable` for ``path`` (for the tests); None: no fast rules."""
    blob = rules_blob(policy)
    if blob is None:
        return None
    got = lib.bsf_rules_answer(
        blob, len(blob), int(policy.read_only), int(policy.view_mounts), os.fsencode(path)
    )
    return None if got < 0 else bool(got)
