"""Which executors of this uid have a workspace-write command running, over which roots.

A separate git dir's main checkout counts as inside the roots only through a `.git` entry
seen while no command could have planted it (`host_view._trusted_dotgits`). A command of
*another* executor can: a second harness on the workspace, the CLI beside a library, one
whose workspace is a sub-directory or a parent of this one, one with another `TMPDIR` (a red
team's, each). So every spawn is recorded while its command runs: in this process's table,
and as a file in this uid's fixed bases (`/tmp` and `/var/tmp`, hidden from every command,
the same for every `TMPDIR`), named after the process (`pid:starttime`, so a killed one's is
recognised as dead) and holding the spawn's roots.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import threading

from bash_local.userdir import fixed_bases
from bash_sandbox.placeholders import process_id
from policies.paths import within

_DIR = "running"
_GENERATION = "generation"  # a count of every record made or removed, in each fixed base
_lock = threading.Lock()
_changes = [0]  # this process's records made or removed
_here: dict[int, tuple[int, tuple[str, ...]]] = {}  # token -> (owner, roots)
_tokens = itertools.count(1)


_me: dict[int, str] = {}  # pid -> `pid:starttime` (a forked child is asked afresh)


def _process() -> str:
    """This process as `pid:starttime` (a reused pid is another process)."""
    pid = os.getpid()
    if pid not in _me:
        _me[pid] = process_id(pid)
    return _me[pid]


def _overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return any(within(x, y) or within(y, x) for x in a for y in b)


def generation() -> tuple[int, ...]:
    """A count that moves whenever any spawn of this uid starts or ends: a survey that read
    the host between two equal ones saw no command start or end meanwhile (one that planted
    and settled while the survey read, a red team's, changed it)."""
    counts = [_changes[0]]
    for base in fixed_bases():
        try:
            fd = os.open(os.path.join(base, _DIR, _GENERATION), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            counts.append(-1)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            counts.append(int(os.pread(fd, 32, 0) or b"0"))
        except (OSError, ValueError):
            counts.append(-1)
        finally:
            os.close(fd)
    return tuple(counts)


def _changed() -> None:
    """Count one record made or removed (`generation`)."""
    with _lock:
        _changes[0] += 1
    for base in fixed_bases():
        with contextlib.suppress(OSError, ValueError):
            directory = os.path.join(base, _DIR)
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(os.path.join(directory, _GENERATION), flags, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                count = int(os.pread(fd, 32, 0) or b"0") + 1
                data = str(count).encode()
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
            finally:
                os.close(fd)


def begin(owner: int, roots: tuple[str, ...]) -> int:
    """Record that ``owner`` (an executor's id) has a command running over ``roots``; the
    token to give `end`. A record that cannot be written (a full disk) is only this
    process's: the other processes then see less, as before this table."""
    token = next(_tokens)
    with _lock:
        _here[token] = (owner, roots)
    if roots:
        body = b"".join(os.fsencode(r) + b"\0" for r in roots)
        for base in fixed_bases():
            with contextlib.suppress(OSError):
                directory = os.path.join(base, _DIR)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(directory, 0o700)
                path = os.path.join(directory, f"{_process()}:{token}")
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(path, flags, 0o600)
                try:
                    os.write(fd, body)
                finally:
                    os.close(fd)
        _changed()
    return token


def end(token: int) -> None:
    with _lock:
        mine = _here.pop(token, None)
    for base in fixed_bases():
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(base, _DIR, f"{_process()}:{token}"))
    if mine is not None and mine[1]:
        _changed()


def others_over(owner: int, roots: tuple[str, ...]) -> bool:
    """Whether an executor other than ``owner`` has a command running over a root that
    holds one of ``roots`` or lies in one."""
    with _lock:
        here = [r for o, r in _here.values() if o != owner]
    if any(_overlap(roots, r) for r in here):
        return True
    me = _process()
    for base in fixed_bases():
        directory = os.path.join(base, _DIR)
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if name == _GENERATION:
                continue
            pid, _, rest = name.partition(":")
            start, _, _ = rest.partition(":")
            if f"{pid}:{start}" == me or not pid.isdigit():
                continue  # this process's own: in `_here`
            path = os.path.join(directory, name)
            if process_id(int(pid)) != f"{pid}:{start}":
                with contextlib.suppress(OSError):
                    os.unlink(path)  # its process died: nothing of it runs
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                data = os.read(fd, 1 << 20)
            finally:
                os.close(fd)
            theirs = tuple(os.fsdecode(p) for p in data.split(b"\0") if p)
            if _overlap(roots, theirs):
                return True
    return False
