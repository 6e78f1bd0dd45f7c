"""What a running workspace-write command must have settled, kept where a dead executor's
successor finds it.

`settle_git` resets the repositories a command created and puts back the `.git` links and
files it re-pointed, once the command is over, in the executor's own process. An executor
killed outright (SIGKILL, the OOM killer) never got there: its command's planted
repository, `core.fsmonitor` and hooks included, stayed for host git, and the next survey
took it for the user's (a red team's). So each such spawn writes, before its command starts,
the `.git` entries its survey found and its roots into the executor's private state
directory (`<state>/git-settle/<token>`, hidden from every command), and removes it once
settled. The sweep of a dead executor's state (`state.STALE_STATE_HOOKS`, at the next
executor's start) settles each record left there with the same rules
(`git_spawn.recover_git`): a repository made in those roots since is reset as the dead
command's, and the warnings go to the log.

Which repositories are the dead command's: those made before it died. While records are
in it, the executor touches the record directory every `HEARTBEAT_S` (`Heartbeat`), so its
mtime tells when the executor was last alive; a `.git` entry born after that (statx's birth
time, `birth_time.py`) is one the user made since, left as it is (a red team's: the user's
own repository, made between the kill and the next executor's start, lost its hooks).
Where no birth time is recorded, every new entry counts as the command's.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
import time

from bash_sandbox.git_discovery import DotGit, GitDiscovery

logger = logging.getLogger(__name__)

SETTLE_DIR = "git-settle"
HEARTBEAT_S = 0.5
_MAX_RECORD = 64 << 20  # a record never holds more (entries are a few hundred bytes each)


def write(state: str, token: int, discovery: GitDiscovery, roots: tuple[str, ...]) -> str | None:
    """Record what the spawn of ``token`` must settle; its path (None: not written, a full
    disk: the spawn goes on, settled in this process as before)."""
    record = {
        "roots": list(roots),
        "gitdirs": list(discovery.gitdirs),
        "entries": [_entry(e) for e in discovery.entries],
    }
    directory = os.path.join(state, SETTLE_DIR)
    path = os.path.join(directory, str(token))
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        try:
            os.write(fd, json.dumps(record).encode())
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    return path


def drop(path: str | None) -> None:
    """The spawn settled in this process: nothing left for a successor."""
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


class Heartbeat:
    """Touches a record directory every `HEARTBEAT_S` while it holds a record of ours."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}  # directory -> records held there
        self._thread: threading.Thread | None = None

    def hold(self, path: str) -> None:
        with self._lock:
            directory = os.path.dirname(path)
            self._held[directory] = self._held.get(directory, 0) + 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._beat, name="bash-sandbox-settle-heartbeat", daemon=True
                )
                self._thread.start()

    def release(self, path: str) -> None:
        with self._lock:
            directory = os.path.dirname(path)
            count = self._held.get(directory, 0) - 1
            if count > 0:
                self._held[directory] = count
            else:
                self._held.pop(directory, None)

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            with self._lock:
                if not self._held:
                    self._thread = None
                    return
                held = list(self._held)
            for directory in held:
                with contextlib.suppress(OSError):
                    os.utime(directory)


def alive_until_ns(state: str) -> int | None:
    """The latest a dead executor with records in ``state`` can have been alive (its last
    heartbeat, a beat's length and a quarter second of slack after); None: no record directory."""
    try:
        beat = os.stat(os.path.join(state, SETTLE_DIR)).st_mtime_ns
    except OSError:
        return None
    return beat + int((HEARTBEAT_S + 0.25) * 1_000_000_000)


def started_ns(record: str) -> int | None:
    """When the spawn of ``record`` started (the record is written then, once)."""
    try:
        return os.stat(record).st_mtime_ns
    except OSError:
        return None


def left(state: str) -> list[tuple[str, GitDiscovery, tuple[str, ...]]]:
    """Each record a dead executor left in ``state``: (its path, the survey's entries, its
    roots). An unreadable one (a write cut short by the kill) is logged and skipped: it
    goes with the state dir."""
    directory = os.path.join(state, SETTLE_DIR)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as fh:
                record = json.loads(fh.read(_MAX_RECORD))
            roots = tuple(str(r) for r in record["roots"])
            discovery = GitDiscovery(
                gitdirs=tuple(str(g) for g in record["gitdirs"]),
                entries=tuple(_dotgit(e) for e in record["entries"]),
                roots=roots,
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("git settle record %s unreadable: %s", path, exc)
            continue
        found.append((path, discovery, roots))
    return found


def _entry(entry: DotGit) -> dict[str, str | None]:
    content = entry.content
    return {
        "path": entry.path,
        "kind": entry.kind,
        "content": base64.b64encode(content).decode() if content is not None else None,
        "target": entry.target,
    }


def _dotgit(raw: dict[str, str | None]) -> DotGit:
    content = raw["content"]
    return DotGit(
        path=str(raw["path"]),
        kind=str(raw["kind"]),
        content=base64.b64decode(content) if content is not None else None,
        target=raw["target"],
    )
