"""`JsonlSessionLog`: a durable session kept as append-only JSON lines, replayed when reopened.

The mechanics of the file live here (locking, torn-tail repair, fsync, and the checks that the
file is this user's own log and not something planted in its place); what the events mean
is `policies.session`'s business.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import stat
import threading
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

from pydantic import BaseModel

from policies.errors import SessionLogError

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


def _refusal(path: str, st: os.stat_result) -> SessionLogError | None:
    """Why the open file ``st`` must not be trusted as this user's session log, if it must not."""
    if not stat.S_ISREG(st.st_mode):
        return SessionLogError(
            path,
            "is not a regular file",
            code="SESSION_LOG_NOT_REGULAR",
            hint="point --session at a regular file, or at a name that does not exist yet",
        )
    if st.st_uid != os.geteuid():
        return SessionLogError(
            path,
            f"is owned by uid {st.st_uid}, not by this process (uid {os.geteuid()})",
            code="SESSION_LOG_FOREIGN_OWNER",
            hint="use a log this user created; another user's file is never trusted",
        )
    if st.st_mode & 0o022:
        return SessionLogError(
            path,
            f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})",
            code="SESSION_LOG_WRITABLE_BY_OTHERS",
            hint=f"run chmod 600 {path} if you trust its content, or start a new log",
        )
    if st.st_nlink == 0:
        return SessionLogError(
            path,
            "was deleted while open",
            code="SESSION_LOG_REPLACED",
            hint="reopen the log; appends to a deleted file would be lost",
        )
    if st.st_nlink != 1:
        # A second name may sit in a writable root: writing one writes the other.
        return SessionLogError(
            path,
            f"has {st.st_nlink} hard links",
            code="SESSION_LOG_HARDLINKED",
            hint="remove the other links, or start a new log",
        )
    return None


def _checked(fd: int, path: str) -> None:
    refusal = _refusal(path, os.fstat(fd))
    if refusal is not None:
        raise refusal


def _open_in(dir_fd: int, name: str, path: str) -> int:
    """Open (or create, 0600) ``name`` under ``dir_fd`` without following a symlink there."""
    # O_NONBLOCK and O_NOCTTY: opening a planted FIFO or tty must neither hang nor grab it.
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK
    for _ in range(3):
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            try:
                return os.open(name, flags, dir_fd=dir_fd)
            except FileNotFoundError:
                continue  # removed between the two opens; try creating it again
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise SessionLogError(
                        path,
                        "is a symbolic link",
                        code="SESSION_LOG_SYMLINK",
                        hint="a session log is never followed through a link; "
                        "remove the link or use another name",
                    ) from None
                raise
        try:
            # The umask can only narrow 0600; set it exactly so the log is never group-readable
            # and never unwritable by its owner.
            os.fchmod(fd, 0o600)
            # A new file's directory entry is only durable once its directory is synced.
            os.fsync(dir_fd)
        except BaseException:
            os.close(fd)
            raise
        return fd
    raise SessionLogError(
        path,
        "keeps disappearing while it is opened",
        code="SESSION_LOG_RACE",
        hint="something else is removing the log; stop it or use another name",
    )


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


def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return False


def _drop_torn_tail(fd: int, path: str) -> None:
    """Truncate bytes after the last newline: a line a writer did not finish (crash, kill).

    Call with the lock held. Without this, the next append would glue onto the torn bytes
    and both lines would be lost to the parser. Only a file that is visibly a log is ever
    cut: the tail starts like one of our lines (``{``) and every complete line before it is
    a JSON object. Anything else raises `SessionLogError` and the file is left untouched.
    """
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    data = _read_all(fd, size)
    keep = data.rfind(b"\n") + 1
    complete = data[:keep].split(b"\n")[:-1]
    if not data[keep:].startswith(b"{") or not all(map(_is_json_object, complete)):
        raise SessionLogError(
            path,
            "does not end with a newline and is not a JSON-lines log",
            code="SESSION_LOG_NOT_A_LOG",
            hint="it was left untouched; point the session at a log, or at a new name",
        )
    os.ftruncate(fd, keep)
    os.fsync(fd)
    logger.warning(
        "session log %s: dropped a torn last line (%d bytes, starting %r); "
        "its append never completed",
        path,
        size - keep,
        data[keep : keep + 80],
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

    What the harness trusts must not be swappable by a command, so the file is opened
    without following links: the parent directory is resolved once, the last name is
    opened relative to it with ``O_NOFOLLOW``. It must be a regular file owned by this
    user, not writable by group or others, with exactly one link; this is checked at open
    and again before every append, and the name must still be this file. A failed check
    raises `SessionLogError` (with a ``code``) and leaves the file untouched. Where the log
    may live is `policies.log_location`'s business.

    ``events`` holds this log's replayed events plus the ones appended through this
    object; appends by another process show up when the log is reopened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        parent, self._name = os.path.split(os.path.abspath(os.fspath(path)))
        parent = os.path.realpath(parent)
        self._path = os.path.join(parent, self._name)
        self._mutex = threading.Lock()
        self._dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._fd = _open_in(self._dir_fd, self._name, self._path)
        except BaseException:
            os.close(self._dir_fd)
            raise
        try:
            _checked(self._fd, self._path)
            # Exclusive: replay may truncate a torn tail, which must not race another writer.
            with _flocked(self._fd):
                self._events = _replay(self._fd, self._path)
        except BaseException:
            os.close(self._fd)
            os.close(self._dir_fd)
            raise

    @property
    def path(self) -> str:
        """The log's absolute name: its parent directory resolved, the last name as opened."""
        return self._path

    @property
    def closed(self) -> bool:
        return self._fd < 0

    @property
    def events(self) -> tuple[Any, ...]:
        """A snapshot of the events, oldest first (JSON-decoded dicts)."""
        with self._mutex:
            return tuple(self._events)

    def _still_named(self, fd: int) -> None:
        """Raise when the log's name now points elsewhere (replaced, or a symlink planted)."""
        try:
            named = os.stat(self._name, dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            named = None
        opened = os.fstat(fd)
        if named is None or (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino):
            raise SessionLogError(
                self._path,
                "was replaced or removed since it was opened",
                code="SESSION_LOG_REPLACED",
                hint="nothing was appended; check who changed it, then reopen the log",
            )

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
                # The file may have been linked, chmod-ed or swapped since the last append.
                _checked(fd, self._path)
                self._still_named(fd)
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
                os.close(self._dir_fd)
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
