"""Bounded collection of one output stream, and the private spill files behind it.

`OutputCollector` keeps at most about ``cap`` bytes in memory: the whole stream while it
fits, then only its tail. Once the stream outgrows the cap, every byte from offset 0 goes
to a spill file in a `SpillDirectory` (0700 dir, 0600 file, unpredictable name), which is
deleted again if the stream outgrows ``max_spill_bytes`` or a write fails: a spill path is
only ever reported for a complete, intact copy of the stream.

Spill files outlive the executor on purpose (callers read them after `aclose()`); the
directory is the caller's to remove.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import secrets
import tempfile
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from bash_local.userdir import default_spill_parent, register_spill_parent
from bash_seam import CollectedOutput

logger = logging.getLogger("bash_local")

# Called with ("stdout" | "stderr", chunk) as the command writes, before the chunk is stored,
# on the event loop's thread: it must not block (the loop also runs the timeout, the abort
# and a sandbox's watches). A listener that writes somewhere slow is a `PacedListener`.
OutputListener = Callable[[str, bytes], None]


@runtime_checkable
class PacedListener(Protocol):
    """An `OutputListener` that writes elsewhere at its own pace (the CLI's stdout behind a
    slow reader). While it is `held`, the command's pipe is not read, so the command waits
    on a full pipe as in any shell pipeline, and the event loop never waits for the reader;
    `on_drained` calls ``resume`` (from any thread) once it has room again."""

    def __call__(self, stream: str, data: bytes) -> None: ...

    def held(self) -> bool: ...

    def on_drained(self, resume: Callable[[], None]) -> None: ...


_CHUNK_BYTES = 64 * 1024
_SPILL_FLAGS = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW


class SpillDirectory:
    """A private directory (mode 0700) for one executor's spill files, created on first use.

    Its parent is the per-user spill directory (`userdir.default_spill_parent`) unless
    ``parent`` names another, which is then registered so confining executors hide it.
    """

    def __init__(self, parent: str | None) -> None:
        self._parent = parent
        self._path: str | None = None
        if parent is not None:
            # Now, not at the first spill: a background command started before that would
            # see the parent unhidden, and read the spill files its later results name.
            with contextlib.suppress(OSError):
                register_spill_parent(parent)

    @property
    def path(self) -> str | None:
        """The directory, or None while no stream has spilled yet."""
        return self._path

    def ensure(self) -> str:
        """The directory, created now if no stream has spilled yet (e.g. to hide it)."""
        if self._path is None:
            parent = self._parent
            if parent is None:
                parent = default_spill_parent()
            else:
                register_spill_parent(parent)
            # mkdtemp creates the directory with an unpredictable name; 0300 (write and
            # search, no read) so nothing of this uid can list it: a spill file is reachable
            # only by the exact, unguessable path the result names.
            path = tempfile.mkdtemp(prefix="bash-local-spill-", dir=parent)
            os.chmod(path, 0o300)
            self._path = path
        return self._path

    def remove_if_empty(self) -> None:
        """Remove the directory when no spill file is left in it (the files stay callers')."""
        if self._path is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self._path)

    def create_file(self, stream: str) -> tuple[str, int]:
        """Create a new spill file exclusively; returns its path and a write-only fd."""
        path = os.path.join(self.ensure(), f"{secrets.token_hex(16)}.{stream}")
        # O_EXCL|O_NOFOLLOW: never write through a planted file or symlink.
        return path, os.open(path, _SPILL_FLAGS, 0o600)


def leading_continuation_bytes(data: bytes) -> int:
    """How many UTF-8 continuation bytes (at most 3) start ``data``: the rest of a cut char."""
    n = 0
    while n < min(3, len(data)) and data[n] & 0xC0 == 0x80:
        n += 1
    return n


def incomplete_utf8_suffix(data: bytes) -> int:
    """Length of a UTF-8 sequence at the end of ``data`` that more bytes could still complete."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: keep looking for the lead byte
        if byte >= 0xF0:
            need = 4
        elif byte >= 0xE0:
            need = 3
        elif byte >= 0xC0:
            need = 2
        else:
            return 0
        return back if back < need else 0
    return 0


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class OutputCollector:
    """One stream of one command: its tail in memory, all of it in a spill file when large.

    Memory holds the whole stream while it is at most ``cap`` bytes, then at least its
    last ``cap`` bytes and at most ``cap`` plus one chunk (small reads joined up to a quarter
    of the cap or 64 KiB, or one larger read).
    """

    def __init__(
        self,
        cap: int,
        *,
        stream: str,
        spill_dir: SpillDirectory,
        max_spill_bytes: int,
        listener: OutputListener | None = None,
    ) -> None:
        self._cap = cap
        self._listener = listener
        self._stream = stream
        self._spill_dir = spill_dir
        self._max_spill = max_spill_bytes
        # Small reads joined into chunks of up to `_CHUNK_BYTES` (one object per pipe read
        # cost 15x the cap for a command writing a byte at a time: a red team's measure).
        self._chunks: collections.deque[bytearray] = collections.deque()
        self._join = max(1, min(_CHUNK_BYTES, cap // 4))  # a joined chunk's most
        self._mem_bytes = 0
        self._mem_start = 0  # stream offset of the first byte still in memory
        self._total = 0
        self._spill_path: str | None = None
        self._spill_fd: int | None = None
        self._spill_state = "none"  # none | open | closed | failed | dropped
        self._closed = False

    @property
    def total(self) -> int:
        """Bytes the stream has produced so far."""
        return self._total

    @property
    def paced(self) -> PacedListener | None:
        """The listener, when it sets the pace at which the stream is read."""
        listener = self._listener
        return listener if isinstance(listener, PacedListener) else None

    @property
    def truncated(self) -> bool:
        return self._total > self._cap

    @property
    def spill_path(self) -> str | None:
        """The spill file while it holds the complete stream so far (never a broken one)."""
        return self._spill_path if self._spill_state in ("open", "closed") else None

    def feed(self, data: bytes) -> None:
        """Append bytes produced by the command. Never raises."""
        if not data or self._closed:
            return
        if self._listener is not None:
            try:
                self._listener(self._stream, data)
            except Exception:
                # A caller's display must never break collection: the bytes are still kept.
                logger.exception("output listener failed; it is not called again")
                self._listener = None
        new_total = self._total + len(data)
        if self._spill_state == "open":
            if new_total > self._max_spill:
                self._abandon_spill("dropped")
            else:
                self._spill_write(data)
        elif self._spill_state == "none" and new_total > self._cap:
            if new_total > self._max_spill:
                self._spill_state = "dropped"
            else:
                self._start_spill(data)
        last = self._chunks[-1] if self._chunks else None
        if last is not None and len(last) + len(data) <= self._join:
            last += data
        else:
            self._chunks.append(bytearray(data))
        self._mem_bytes += len(data)
        self._total = new_total
        # Drop whole chunks from the front while the rest still covers the cap: the tail.
        while self._mem_bytes - len(self._chunks[0]) >= self._cap:
            dropped = self._chunks.popleft()
            self._mem_bytes -= len(dropped)
            self._mem_start += len(dropped)

    def close(self) -> None:
        """The stream ended: finish the spill file (a failed close abandons it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._spill_state == "open" and self._spill_fd is not None:
            fd, self._spill_fd = self._spill_fd, None
            try:
                os.close(fd)
            except OSError as exc:
                logger.warning("closing spill file %s failed: %s", self._spill_path, exc)
                self._abandon_spill("failed")
            else:
                self._spill_state = "closed"

    def collected(self) -> CollectedOutput:
        """The stream as a result: the text (its tail when truncated) and the spill path."""
        data = b"".join(self._chunks)
        if not self.truncated:
            return CollectedOutput(text=decode(data))
        tail = data[-self._cap :]
        tail = tail[leading_continuation_bytes(tail) :]
        return CollectedOutput(text=decode(tail), truncated=True, spill_path=self.spill_path)

    def read_from(self, offset: int, *, final: bool) -> tuple[bytes, int, bool]:
        """Bytes from stream ``offset`` on: ``(data, next_offset, lossy)``.

        One read returns at most the cap, always from the in-memory tail: when more is
        unread, it skips to the last cap bytes and reports lossy (the spill file, when intact,
        still holds everything), so reading a huge backlog never costs more memory than the
        tail already does. Unless ``final``, an incomplete trailing UTF-8 character is left
        for the next read.
        """
        if offset >= self._total:
            return b"", offset, False
        lossy = False
        if self._total - offset > self._cap:
            offset, lossy = self._total - self._cap, True
        # The memory window always covers the last cap bytes, so the read stays bounded.
        data = b"".join(self._chunks)[offset - self._mem_start :]
        if lossy:
            skip = leading_continuation_bytes(data)
            data, offset = data[skip:], offset + skip
        if not final:
            keep = incomplete_utf8_suffix(data)
            if keep:
                data = data[:-keep]
        return data, offset + len(data), lossy

    def _start_spill(self, data: bytes) -> None:
        try:
            self._spill_path, self._spill_fd = self._spill_dir.create_file(self._stream)
        except OSError as exc:
            logger.warning("could not create a spill file for %s: %s", self._stream, exc)
            self._spill_state = "failed"
            return
        self._spill_state = "open"
        # Nothing was dropped yet, so memory is the stream from byte 0: write it first.
        for chunk in self._chunks:
            self._spill_write(chunk)
        self._spill_write(data)

    def _spill_write(self, data: bytes | bytearray) -> None:
        if self._spill_state != "open" or self._spill_fd is None:
            return
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._spill_fd, view)
                view = view[written:]
        except OSError as exc:
            logger.warning("writing spill file %s failed: %s", self._spill_path, exc)
            self._abandon_spill("failed")

    def _abandon_spill(self, state: str) -> None:
        """Delete a spill that can no longer hold the whole stream; its path is never reported."""
        self._spill_state = state
        fd, self._spill_fd = self._spill_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._spill_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._spill_path)
