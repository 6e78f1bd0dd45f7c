"""`JsonlSessionLog`: a durable session kept as append-only JSON lines, replayed when reopened.

The mechanics of the file live here (locking, torn-tail repair, fsync); what the events mean
is `policies.session`'s business.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

from pydantic import BaseModel

logger = logging.getLogger("policies")


@contextlib.contextmanager
def _flocked(fd: int) -> Iterator[None]:
    # flock is per open file description, so it also serialises two logs in one process.
    # Advisory, and not reliable on some network filesystems.
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _fsync_dir(path: str) -> None:
    # A new file's directory entry is only durable once its directory is synced.
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _open_log(path: str) -> int:
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
    for _ in range(3):
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                return os.open(path, flags)
            except FileNotFoundError:
                continue  # removed between the two opens; try creating it again
        try:
            # The umask can only narrow 0600; set it exactly so the log is never group-readable
            # and never unwritable by its owner.
            os.fchmod(fd, 0o600)
            _fsync_dir(os.path.dirname(path))
        except BaseException:
            os.close(fd)
            raise
        return fd
    # Still racing a remover, or a dangling symlink: let open() report it.
    return os.open(path, flags)


def _read_all(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, min(1 << 20, size - offset), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _drop_torn_tail(fd: int, path: str) -> None:
    """Truncate bytes after the last newline: a line a writer did not finish (crash, kill).

    Call with the lock held. Without this, the next append would glue onto the torn bytes
    and both lines would be lost to the parser.
    """
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    end = size
    keep = 0
    while end > 0:
        start = max(0, end - (1 << 16))
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        end = start
    torn = os.pread(fd, min(size - keep, 80), keep)
    os.ftruncate(fd, keep)
    os.fsync(fd)
    logger.warning(
        "session log %s: dropped a torn last line (%d bytes, starting %r); "
        "its append never completed",
        path,
        size - keep,
        torn,
    )


def _replay(fd: int, path: str) -> list[Any]:
    """The log's events, oldest first; unparseable lines are reported and skipped."""
    _drop_torn_tail(fd, path)
    data = _read_all(fd, os.fstat(fd).st_size)
    events: list[Any] = []
    # After _drop_torn_tail the data ends with "\n" (or is empty), so the last piece is b"".
    for lineno, line in enumerate(data.split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            logger.warning("session log %s: skipping line %d, not JSON (%s)", path, lineno, exc)
            continue
        if not isinstance(value, dict):
            logger.warning(
                "session log %s: skipping line %d, not a JSON object (%s)",
                path,
                lineno,
                type(value).__name__,
            )
            continue
        events.append(value)
    return events


def _encode_event(event: object) -> bytes:
    """One event as one JSON line; raises before anything is written when it cannot be."""
    if isinstance(event, BaseModel):
        record: object = event.model_dump(mode="json")
    elif isinstance(event, Mapping):
        record = dict(event)
    else:
        raise TypeError(
            f"session log events are JSON objects (a mapping or a pydantic model), "
            f"got {type(event).__name__}"
        )
    # json.dumps escapes newlines inside strings, so the record is always exactly one line.
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8") + b"\n"


class JsonlSessionLog:
    """A durable, append-only session: one JSON object per line, replayed when reopened.

    Each append is one ``os.write`` of a complete line on an ``O_APPEND`` descriptor, under
    an exclusive ``flock`` and followed by ``fsync``; an append that returns is on disk.
    A crash can leave at most a torn last line; it is dropped (with a warning) on the next
    open or append, so the file always stays parseable. Unparseable lines elsewhere are
    reported and skipped. The file is created with mode 0600.

    ``events`` holds this log's replayed events plus the ones appended through this
    object; appends by another process show up when the log is reopened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.path.abspath(os.fspath(path))
        self._mutex = threading.Lock()
        self._fd = _open_log(self._path)
        try:
            # Exclusive: replay may truncate a torn tail, which must not race another writer.
            with _flocked(self._fd):
                self._events = _replay(self._fd, self._path)
        except BaseException:
            os.close(self._fd)
            raise

    @property
    def path(self) -> str:
        return self._path

    @property
    def closed(self) -> bool:
        return self._fd < 0

    @property
    def events(self) -> tuple[Any, ...]:
        """A snapshot of the events, oldest first (JSON-decoded dicts)."""
        with self._mutex:
            return tuple(self._events)

    def append(self, event: Any, /) -> None:
        """Durably append ``event`` (a mapping or a pydantic model, JSON-serialisable)."""
        line = _encode_event(event)
        # Keep what a replay would produce, so live and reopened logs look the same.
        stored = json.loads(line)
        with self._mutex:
            if self._fd < 0:
                raise ValueError(f"session log {self._path} is closed")
            fd = self._fd
            with _flocked(fd):
                # Another process may have died mid-line since we last looked.
                _drop_torn_tail(fd, self._path)
                start = os.fstat(fd).st_size
                try:
                    written = os.write(fd, line)
                    # A short write only happens on a full disk or similar; finish it while
                    # we still hold the lock, so no other writer can interleave.
                    while written < len(line):
                        written += os.write(fd, line[written:])
                    # os.write is unbuffered: nothing to flush, fsync makes it durable.
                    os.fsync(fd)
                except BaseException:
                    # Leave no half line behind for the next writer to find.
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, start)
                    raise
            self._events.append(stored)

    def close(self) -> None:
        """Close the file; idempotent. Appending afterwards raises `ValueError`."""
        with self._mutex:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> JsonlSessionLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._events)} events"
        return f"JsonlSessionLog({self._path!r}, {state})"
