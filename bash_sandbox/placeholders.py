"""Host placeholders for protected names that do not exist yet, and who still needs them.

A protected name inside a writable root (say `deploy/secrets.env`) that is missing when a
command starts must stay uncreatable for as long as the command lives, and a cover mount
needs something to sit on. So the executor creates a placeholder of the right kind (an empty
file, or an empty directory for names written with a trailing `/` and for auto-run names),
covers it read-only, and removes it again once no running command of any executor of this
uid needs it, and only while it is still an untouched placeholder. The ledger (one JSON
file under this uid's base, locked with flock, rewritten in place so that a kill never
leaves it truncated) records who holds each placeholder: removing one that another
executor's command still sits on would detach that command's cover.

Nothing of a dead executor stays: holders are `pid:starttime` of the executor process, so a
holder that died (SIGKILL, a crash) is recognised, and every time the ledger is opened
(each executor's start included) a placeholder nobody alive holds is removed. Only what an
executor made is ever removed, and only as it made it: the intent is recorded *before* the
placeholder is created (a kill in between leaves an entry, never an unrecorded file), then
its device, inode and mtime (kept current when a placeholder inside a placeholder directory
comes or goes); a file or directory at that path with another identity or mtime (the user
wrote, touched or replaced it since: a new name may reuse the inode number), or with any
content, is left alone and forgotten.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterable, Iterator

from bash_local.userdir import user_base_dir
from bash_sandbox.placeholder_stash import Stash

_LEDGER = "placeholders.json"
# A ledger shrinks by padding up to this much (or its new size), beyond it by a truncate: a
# ledger once grown large (many executors at once) is not read and rewritten whole ever after.
_PAD_MAX = 1 << 14
_LEDGER_MAX = 1 << 22


def process_id(pid: int) -> str:
    """``pid`` as `pid:starttime`: a pid reused by another process names another one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        # A zombie (a killed executor its parent has not reaped: a container's PID 1 may
        # never) holds nothing: it is not the holder that was recorded.
        start = fields[19].decode() if fields[0] not in (b"Z", b"X") else "gone"
    except (OSError, IndexError):
        start = "?"
    return f"{pid}:{start}"


def _alive(holder: str, seen: dict[str, bool]) -> bool:
    """Whether ``holder``'s process still runs; ``seen`` answers each holder once per
    ledger transaction (every entry lists the same few executors)."""
    known = seen.get(holder)
    if known is None:
        pid, _, _ = holder.partition(":")
        known = seen[holder] = pid.isdigit() and process_id(int(pid)) == holder
    return known


def _read(fd: int) -> tuple[dict[str, dict[str, object]], bytes]:
    """The ledger's entries, and its bytes as they are (what `_Ledger.flush` compares)."""
    content = os.pread(fd, min(os.fstat(fd).st_size, _LEDGER_MAX), 0)
    raw = content.decode(errors="replace").strip("\x00 \n")
    try:
        # The first JSON value only: a kill between writing and truncating leaves the old
        # ledger's tail after the new one (`_Ledger.flush`).
        data, _ = json.JSONDecoder().raw_decode(raw) if raw else ({}, 0)
    except ValueError:
        return {}, content
    if not isinstance(data, dict):
        return {}, content
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, dict)}, content


class _Ledger:
    """The ledger's entries while its lock is held; `flush` makes them durable now."""

    def __init__(self, fd: int, stash: str | None, me: str | None) -> None:
        self.fd = fd
        self.entries, self._written = _read(fd)
        # A holder's liveness, read once per transaction; the executor itself is alive.
        self.alive: dict[str, bool] = {me: True} if me is not None else {}
        self.stash = Stash(stash) if stash is not None else None

    def holders(self, entry: dict[str, object]) -> list[str]:
        """The entry's holders that are still alive."""
        raw = entry.get("holders")
        listed = raw if isinstance(raw, list) else []
        return [h for h in listed if isinstance(h, str) and _alive(h, self.alive)]

    def flush(self) -> None:
        """Write the entries unless the file already holds exactly them. In place, one write
        then a truncate: a kill between them leaves the new ledger followed by old bytes,
        which `_read` ignores; never a truncated one. (A new file and a rename per write
        cost two journalled metadata operations each, three times per spawn.)"""
        encoded = json.dumps(self.entries).encode() + b"\n"
        shorter = len(self._written) - len(encoded)
        if 0 < shorter <= max(_PAD_MAX, len(encoded)):
            # Padded to the size it has (`_read` ignores the spaces): a truncate is a
            # journalled metadata change, 0.4 ms of each release here.
            encoded += b" " * shorter
        if encoded == self._written:
            return
        os.pwrite(self.fd, encoded, 0)
        if len(encoded) < len(self._written):
            os.ftruncate(self.fd, len(encoded))
        self._written = encoded


@contextlib.contextmanager
def _ledger(
    base: str | None = None,
    *,
    create: bool = True,
    stash: str | None = None,
    me: str | None = None,
) -> Iterator[_Ledger]:
    """The ledger, locked, swept of dead holders' placeholders; written back at the end if
    its entries changed. ``me``: the calling executor's holder name (alive)."""
    base = base or user_base_dir()
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    fd = os.open(os.path.join(base, _LEDGER), flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        ledger = _Ledger(fd, stash, me)
        _sweep_dead(ledger)
        yield ledger
        ledger.flush()
    finally:
        os.close(fd)


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_mtime_ns]


def _untouched(path: str, entry: dict[str, object]) -> bool:
    """Whether ``path`` is still exactly the placeholder ``entry`` records."""
    is_dir = bool(entry.get("dir"))
    try:
        st = os.lstat(path)
        if is_dir:
            if not stat.S_ISDIR(st.st_mode) or os.listdir(path):
                return False
        elif not stat.S_ISREG(st.st_mode) or st.st_size != 0:
            return False
    except OSError:
        return False
    made = entry.get("made")
    if isinstance(made, list) and len(made) == 3:
        # The mtime too: a name removed and made again may get the same inode number.
        return made == _identity(st)
    # Recorded as intended but killed before its identity was: ours only if it was made
    # after the intent and never changed since (a fresh placeholder's mtime is its ctime),
    # or moved in from the stash, which stamps it with the intent's own time.
    intent = entry.get("intent_ns")
    if not isinstance(intent, int):
        return False
    if is_dir and st.st_mtime_ns == intent:
        return True
    return st.st_mtime_ns == st.st_ctime_ns and st.st_ctime_ns >= intent - 1_000_000_000


def _remove(path: str, entry: dict[str, object], ledger: _Ledger) -> None:
    if _untouched(path, entry):
        with contextlib.suppress(OSError):
            if not entry.get("dir"):
                os.unlink(path)
            elif ledger.stash is None or not ledger.stash.put(path):
                os.rmdir(path)
            _moved_parent(path, ledger.entries)


def _moved_parent(path: str, entries: dict[str, dict[str, object]]) -> None:
    """A placeholder made or removed inside another placeholder directory (`deploy/secrets.env`
    in `deploy/`) moved that directory's mtime: record the new one, it was our change."""
    parent = entries.get(os.path.dirname(path))
    made = parent.get("made") if parent is not None else None
    if parent is None or not isinstance(made, list) or len(made) != 3:
        return
    try:
        st = os.lstat(os.path.dirname(path))
    except OSError:
        return
    if made[:2] == [st.st_dev, st.st_ino]:
        parent["made"] = _identity(st)


def _sweep_dead(ledger: _Ledger) -> None:
    """Remove the placeholders no live executor holds (their executors were killed)."""
    entries = ledger.entries
    for path, entry in list(entries.items()):
        holders = ledger.holders(entry)
        if holders:
            entry["holders"] = holders
            continue
        del entries[path]
        _remove(path, entry, ledger)


def sweep(base: str | None = None) -> None:
    """Remove every placeholder whose holders are all dead (also run by each `Placeholders`)."""
    try:
        # No ledger yet: no executor of this uid ever made a placeholder, nothing to sweep.
        with _ledger(base, create=False):
            pass
    except FileNotFoundError:
        return


class Placeholders:
    """The placeholders one executor holds (released per spawn, all of them at close)."""

    def __init__(self, base: str | None = None, stash: str | None = None) -> None:
        """``stash``: a private directory (the executor's state) where released placeholder
        directories wait for the next spawn (`placeholder_stash.py`); None: made and removed."""
        self._me = process_id(os.getpid())
        self._base = base
        self._stash = stash
        # Whatever a killed executor left: removed before this one makes any of its own.
        with contextlib.suppress(OSError):
            sweep(base)

    def acquire(self, path: str, is_dir: bool) -> bool:
        """Make ``path`` exist as an empty placeholder (or find it made) and hold it.

        False when something else appeared there meanwhile (then it is not ours to cover
        as a placeholder: it is an ordinary existing name)."""
        return bool(self.acquire_all(((path, is_dir),)))

    def acquire_all(self, wanted: Iterable[tuple[str, bool]]) -> list[str]:
        """`acquire` for each (path, is_dir), in one ledger transaction; the paths held. An
        existing path is held only when it is a placeholder the ledger knows (another
        command's); any other existing name is not ours and is left out."""
        held: list[str] = []
        wanted = tuple(wanted)
        if not wanted:
            return held  # a read-only spawn: no ledger transaction (a lock, a read, a sweep)
        with _ledger(self._base, stash=self._stash, me=self._me) as ledger:
            new: list[tuple[str, bool, dict[str, object], int]] = []
            for path, is_dir in wanted:
                entry = ledger.entries.get(path)
                if entry is not None and not os.path.lexists(path):
                    # Recorded, but removed meanwhile (by the user, after its holder died):
                    # made again, for every holder (covering it would fail the spawn).
                    del ledger.entries[path]
                    entry = None
                if entry is not None:
                    holders = ledger.holders(entry)
                    holders.append(self._me)
                    entry["holders"] = holders
                    held.append(path)
                elif not os.path.lexists(path):
                    intent = time.time_ns()
                    entry = {"dir": is_dir, "holders": [self._me], "intent_ns": intent}
                    ledger.entries[path] = entry
                    new.append((path, is_dir, entry, intent))
            if not new:
                return held
            ledger.flush()  # the intents first: a kill after this leaves records
            failure: OSError | None = None
            parents: set[str] = set()  # made sure of once per call: a workspace's top
            for path, is_dir, entry, intent in new:
                try:
                    parent = os.path.dirname(path)
                    if parent not in parents:
                        os.makedirs(parent, exist_ok=True)
                        parents.add(parent)
                    stash = ledger.stash
                    if is_dir and (stash is None or not stash.take(path, intent)):
                        os.mkdir(path, 0o755)
                    elif not is_dir:
                        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW
                        os.close(os.open(path, flags, 0o644))
                    entry["made"] = _identity(os.lstat(path))
                    _moved_parent(path, ledger.entries)
                    held.append(path)
                except OSError as exc:
                    # Not made by us (created meanwhile, or refused): never ours to remove.
                    del ledger.entries[path]
                    if not isinstance(exc, FileExistsError) and failure is None:
                        failure = exc
            if failure is not None:
                # Give back what this call took before failing: the caller holds nothing.
                for path in held:
                    self._drop(ledger, path)
                ledger.flush()
                raise failure
        return held

    def release(self, path: str) -> None:
        """Stop holding ``path``; remove it when nobody does and it is still untouched."""
        self.release_all((path,))

    def release_all(self, paths: Iterable[str]) -> None:
        """`release` for each path, in one ledger transaction (none for no path)."""
        paths = tuple(paths)
        if not paths:
            return
        with _ledger(self._base, stash=self._stash, me=self._me) as ledger:
            for path in paths:
                self._drop(ledger, path)

    def _drop(self, ledger: _Ledger, path: str) -> None:
        entry = ledger.entries.get(path)
        if entry is None:
            return
        holders = ledger.holders(entry)
        if self._me in holders:
            holders.remove(self._me)
        entry["holders"] = holders
        if holders:
            return
        del ledger.entries[path]
        _remove(path, entry, ledger)
