"""Which executors of this uid have a workspace-write command running, over which roots.

A separate git dir's main checkout counts as inside the roots only through a `.git` entry
seen while no command could have planted it (`host_view._trusted_dotgits`). A command of
*another* executor can: a second harness on the workspace, the CLI beside a library, one
whose workspace is a sub-directory or a parent of this one, one with another `TMPDIR` (a red
team's, each). So every spawn is recorded while its command runs: in this process's table,
and as a file in this uid's fixed bases (`/tmp` and `/var/tmp`, hidden from every command,
the same for every `TMPDIR`), named after the process (`pid:starttime`, so a killed one's is
recognised as dead) and holding the spawn's roots. An ended spawn's record is kept a minute
with its end time: a survey asks whether any command ran over its roots *since it began
reading* (a planter that settled between the reading and the question, plant and record
gone, let the stale reading stand: a red team's); a command over other roots never counts.
Only the latest end of a process's commands over the same roots is kept (an earlier one
answers nothing the latest does not): a harness's run of commands leaves one record, not the
minute's hundreds that every end listed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time

from bash_local.userdir import fixed_bases
from bash_sandbox.placeholders import process_id
from policies.paths import within

_DIR = "running"
_ENDED = "ended"  # an ended record's name: `ended:<end ns>:<the record's name>`
_KEEP_NS = 60_000_000_000  # how long an ended record answers
_lock = threading.Lock()
_here: dict[int, tuple[int, tuple[str, ...]]] = {}  # token -> (owner, roots)
_ended: dict[tuple[int, tuple[str, ...]], int] = {}  # (owner, roots) -> latest end ns, here
# (process, base, roots) -> its latest ended record (a forked child's are its own)
_last_file: dict[tuple[str, str, tuple[str, ...]], str] = {}
_swept: dict[str, int] = {}  # base -> when this process last swept it
_SWEEP_NS = 1_000_000_000
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
    return token


def end(token: int) -> None:
    """The spawn of ``token`` is over: its record is kept a minute as ended."""
    now = time.time_ns()
    with _lock:
        mine = _here.pop(token, None)
        if mine is not None:
            _ended[mine] = max(now, _ended.get(mine, now))
    if mine is None or not mine[1]:
        return
    roots = mine[1]
    name = f"{_process()}:{token}"
    for base in fixed_bases():
        with contextlib.suppress(OSError):
            directory = os.path.join(base, _DIR)
            ended = f"{_ENDED}:{now}:{name}"
            os.rename(os.path.join(directory, name), os.path.join(directory, ended))
            key = (_process(), base, roots)
            with _lock:
                earlier = _last_file.get(key)
                _last_file[key] = ended
            if earlier is not None:
                # Over the same roots and earlier: the new record answers all it did.
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, earlier))
            if now - _swept.get(base, 0) >= _SWEEP_NS:
                _swept[base] = now
                _sweep(directory, now)


def _sweep(directory: str, now: int) -> None:
    """Remove the ended records older than any survey asks about (at most once a second
    per process: the directory holds only the last minute's)."""
    for entry in os.listdir(directory):
        if not entry.startswith(f"{_ENDED}:"):
            continue
        ended = entry.split(":", 2)[1]
        if not ended.isdigit() or int(ended) < now - _KEEP_NS:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, entry))


def others_over(owner: int, roots: tuple[str, ...], since_ns: int) -> bool:
    """Whether an executor other than ``owner`` has had a command running over a root that
    holds one of ``roots`` or lies in one at any time since ``since_ns`` (now included)."""
    now = time.time_ns()
    with _lock:
        for key in [k for k, t in _ended.items() if t < now - _KEEP_NS]:
            del _ended[key]
        here = [r for o, r in _here.values() if o != owner]
        here += [r for (o, r), t in _ended.items() if o != owner and t >= since_ns]
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
            path = os.path.join(directory, name)
            if name.startswith(f"{_ENDED}:"):
                _, ended, record = name.split(":", 2)
                if not ended.isdigit() or int(ended) < now - _KEEP_NS:
                    with contextlib.suppress(OSError):
                        os.unlink(path)  # older than any survey asks about
                    continue
                if record.startswith(f"{me}:") or int(ended) < since_ns:
                    continue  # this process's own (in `_ended`), or over before the reading
            else:
                pid, _, rest = name.partition(":")
                start, _, _ = rest.partition(":")
                if f"{pid}:{start}" == me or not pid.isdigit():
                    continue  # this process's own: in `_here`
                if process_id(int(pid)) != f"{pid}:{start}":
                    with contextlib.suppress(OSError):
                        os.unlink(path)  # its process died: nothing of it runs
                    continue
            if _overlap(roots, _roots_of(path)):
                return True
    return False


def _roots_of(path: str) -> tuple[str, ...]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ()
    try:
        data = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    return tuple(os.fsdecode(p) for p in data.split(b"\0") if p)
