"""Live output of `bash-sandbox run`: the command's chunks written as they arrive.

`LiveOutput.listener` is the executor's `OutputListener`: it is called on the event loop
thread with ("stdout" | "stderr", chunk) in the order the two pipes delivered them, and
writes each chunk at once to the CLI's own stream of the same name, so the command's output
interleaves as far as two pipes allow and what was printed before a Ctrl-C or a timeout
stays on the screen. A stream that is a terminal gets `TerminalRenderer` text; a pipe or a
file gets the exact bytes.

The writes happen on a thread of their own: a reader that is slow (`| less` waiting for a
key) holds that thread, never the event loop, which also runs the timeout and the cover
watch that stops a command whose covered name the host replaced (a red team wrote a
protected file while the CLI's stdout was stalled). Past a bound of queued bytes the
listener is `held` (`bash_local.PacedListener`): the command's pipe is not read, so the
command waits on its full pipe, as in any shell pipeline. A reader that goes away on stdout
(`| head`) stops the run: the `on_stdout_closed` callback cancels it, and the CLI exits like
a process killed by SIGPIPE.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import TextIO

from bash_sandbox.cli.render import (
    OwnWordGuard,
    TerminalRenderer,
    one_line,
    render_visible,
    utf8_terminal,
)


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):  # closed or detached
        return False


def _file_identity(stream: TextIO) -> tuple[int, int] | None:
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):  # no real descriptor (an in-memory stream)
        return None
    return st.st_dev, st.st_ino


class StreamSink:
    """One of the CLI's output streams, fed the command's chunks of the same name."""

    def __init__(self, stream: TextIO, *, render: bool, guard: bool = False) -> None:
        self._stream = stream
        # The CLI's own lines go to stderr: the command's text never holds their words.
        self._guard = OwnWordGuard() if guard else None
        self._binary = getattr(stream, "buffer", None)
        self._ascii_only = render and not utf8_terminal()
        self._renderer = TerminalRenderer(ascii_only=self._ascii_only) if render else None
        # A text-only stream (no .buffer) gets the bytes decoded, a split character joined.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.ends_line = True  # the last thing written ended a line (or nothing was written)
        self.closed = False  # the reader went away; nothing more is written

    def write_chunk(self, data: bytes) -> None:
        """Write one chunk of the command's output; raises `BrokenPipeError` once."""
        if self.closed or not data:
            return
        if self._guard is not None:
            data = self._guard.feed(data)
            if not data:
                return  # a line start held back until it can be told apart
        self._emit(data)

    def _emit(self, data: bytes) -> None:
        if self._renderer is not None:
            self._write_text(self._renderer.feed(data))
        elif self._binary is not None:
            self._write_bytes(data)
        else:
            self._write_text(self._decoder.decode(data))
        self.ends_line = data.endswith(b"\n")

    def finish(self) -> None:
        """The command's stream ended: write what a renderer or decoder held back."""
        if self.closed:
            return
        held = self._guard.finish() if self._guard is not None else b""
        if held:
            self._emit(held)  # never a whole line start of ours: as it is
        tail = self._renderer.finish() if self._renderer else self._decoder.decode(b"", True)
        if tail:
            self._write_text(tail)
            self.ends_line = tail.endswith("\n")

    def write_note(self, text: str) -> None:
        """The CLI's own lines (markers, notes, warnings), always after the output. They
        name paths the command chose (a refused file, a repository it made): on a terminal
        they are rendered like the output, so a name cannot carry an escape sequence."""
        if not self.closed:
            shown = render_visible(text, ascii_only=self._ascii_only)
            self._write_text(shown if self._renderer is not None else text)
            self.ends_line = text.endswith("\n")

    def _write_text(self, text: str) -> None:
        if not text:
            return
        if self._binary is not None:
            # As UTF-8 whatever the locale says: rendered text is never unencodable.
            self._write_bytes(text.encode("utf-8", errors="replace"))
            return
        try:
            self._stream.write(text)
            self._stream.flush()
        except BrokenPipeError:
            self.closed = True
            raise

    def _write_bytes(self, data: bytes) -> None:
        assert self._binary is not None
        try:
            self._stream.flush()  # anything written as text goes first
            self._binary.write(data)
            self._binary.flush()
        except BrokenPipeError:
            self.closed = True
            raise


# Bytes queued for the writer thread beyond which the command's pipes wait, and the level
# at which they are read again.
HELD_BYTES = 1 << 18
RESUME_BYTES = 1 << 16


class LiveOutput:
    """The command's stdout and stderr, written live to the CLI's (see the module docstring)."""

    def __init__(self, stdout: TextIO, stderr: TextIO) -> None:
        identity = _file_identity(stdout)
        # `2>&1` or one terminal: a note must not continue a line stdout left open.
        self._shared = identity is not None and identity == _file_identity(stderr)
        # Where the CLI's own lines can be read among stdout's (a terminal, `2>&1`), stdout's
        # text is guarded too; a stdout of its own stays byte-exact.
        guard_stdout = self._shared or is_terminal(stdout)
        self.stdout = StreamSink(stdout, render=is_terminal(stdout), guard=guard_stdout)
        self.stderr = StreamSink(stderr, render=is_terminal(stderr), guard=True)
        self._last = self.stderr
        self.on_stdout_closed: Callable[[], None] | None = None
        self._queue: queue.SimpleQueue[tuple[StreamSink, bytes] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._queued = 0  # bytes put and not yet written
        self._resume: list[Callable[[], None]] = []
        self._writer: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.was_held = False  # the command waited for this stream's reader at some point

    def __call__(self, stream: str, data: bytes) -> None:
        self.listener(stream, data)

    def listener(self, stream: str, data: bytes) -> None:
        """Queue a chunk for the writer thread (on a running loop), else write it now."""
        sink = self.stdout if stream == "stdout" else self.stderr
        if sink.closed or not data:
            return
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write(sink, data)  # no loop to keep free: the result printed afterwards
            return
        with self._lock:
            self._queued += len(data)
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_queued, name="bash-sandbox-cli-output", daemon=True
            )
            self._writer.start()
        self._queue.put((sink, data))

    def held(self) -> bool:
        with self._lock:
            held = self._queued > HELD_BYTES
        self.was_held = self.was_held or held
        return held

    def on_drained(self, resume: Callable[[], None]) -> None:
        with self._lock:
            if self._queued > RESUME_BYTES:
                self._resume.append(resume)
                return
        resume()

    def _write_queued(self) -> None:
        while (item := self._queue.get()) is not None:
            sink, data = item
            self._write(sink, data)
            with self._lock:
                self._queued -= len(data)
                ready = self._resume if self._queued <= RESUME_BYTES else []
                if ready:
                    self._resume = []
            for resume in ready:
                resume()

    def _write(self, sink: StreamSink, data: bytes) -> None:
        try:
            sink.write_chunk(data)
        except BrokenPipeError:
            sink.closed = True
            if sink is self.stdout and self.on_stdout_closed is not None:
                self._on_loop(self.on_stdout_closed)
            # A dead stderr only loses the command's stderr; the run goes on.
        except OSError:
            sink.closed = True  # e.g. EIO from a hung-up terminal: stop writing there
        else:
            self._last = sink

    def _on_loop(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None or threading.current_thread() is threading.main_thread():
            callback()
            return
        with contextlib.suppress(RuntimeError):  # the loop may be closed already
            loop.call_soon_threadsafe(callback)

    def drain(self) -> None:
        """Wait until the writer thread wrote everything queued (the reader's pace)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            self._queue.put(None)
            writer.join()

    def finish(self) -> None:
        """Both streams ended: flush what renderers held back (a cut character, a `\\r`)."""
        self.drain()
        for sink in (self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                sink.finish()

    def write_notes(self, lines: list[str]) -> None:
        """The CLI's markers and notes on stderr, on a line of their own."""
        if not lines:
            return
        open_line = not self.stderr.ends_line or (self._shared and not self._last.ends_line)
        with contextlib.suppress(OSError):
            # One line each: a note may name a path the command chose, line breaks and all.
            text = "\n".join(one_line(line) for line in lines)
            self.stderr.write_note(("\n" if open_line else "") + text + "\n")
