"""Making a command's output safe to show on a terminal (threat-model row 18).

A terminal interprets what it is sent: escape sequences set the clipboard (OSC 52), the
title, clear the screen or move the cursor, and a bare `\\r` lets a command overwrite what
the CLI printed (a fake `[exit 0]`). `TerminalRenderer` turns one stream's bytes into text
where every control character is visible and inert: C0 controls as caret notation (`^[`,
`^M`), DEL as `^?`, C1 controls as `\\x9b`, invalid UTF-8 bytes as `\\xff`, and the
bidirectional controls that reorder what is displayed (and the Unicode line and paragraph
separators) as `\\u202e`. Newline, tab and a `\\r` directly before a newline (CRLF) are
kept. UTF-8 text stays intact, also when a character is split across two chunks.

Only for terminals: when the CLI's stream is a pipe or a file, the bytes go out exact. A
terminal whose locale is not UTF-8 gets every non-ASCII character as `\\u00dd` too: an
8-bit terminal reads the second byte of `Ý` (C3 9D) as the C1 control OSC, of `Û` as CSI (a
red team set the title and cleared the screen that way).
"""

from __future__ import annotations

import codecs
import locale

_KEPT = {ord("\n"), ord("\t")}
# Reorder the displayed text without being visible themselves ("Trojan Source"): the
# embeddings, overrides and isolates, and the implicit marks (LRM, RLM, ALM).
_BIDI_CONTROLS = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)
# Line and paragraph separators: a client that breaks lines at them shows text as lines of
# their own that the CLI never started (an indented command line left unindented).
_LINE_BREAKS = (0x2028, 0x2029)


def _visible_forms() -> dict[int, str]:
    table: dict[int, str] = {}
    for code in range(0x20):
        if code not in _KEPT:
            table[code] = "^" + chr(code + 0x40)
    table[0x7F] = "^?"
    for code in range(0x80, 0xA0):
        table[code] = f"\\x{code:02x}"
    for code in (*_BIDI_CONTROLS, *_LINE_BREAKS):
        table[code] = f"\\u{code:04x}"
    return table


VISIBLE_FORMS = _visible_forms()


def render_visible(text: str, *, ascii_only: bool = False) -> str:
    """``text`` with every control character shown as inert text (CRLF kept); with
    ``ascii_only``, every non-ASCII character too."""
    shown = "\r\n".join(part.translate(VISIBLE_FORMS) for part in text.split("\r\n"))
    return shown.encode("ascii", "backslashreplace").decode("ascii") if ascii_only else shown


def utf8_terminal() -> bool:
    """Whether the locale says the terminal reads UTF-8 (Python reads the C locale as
    C.UTF-8, PEP 538: only a locale naming another charset says no)."""
    return codecs.lookup(locale.getpreferredencoding(False)).name == "utf-8"


class TerminalRenderer:
    """One output stream, chunk by chunk, rendered for a terminal (see the module docstring)."""

    def __init__(self, *, ascii_only: bool = False) -> None:
        self._ascii_only = ascii_only
        # backslashreplace: an invalid byte becomes the visible text `\xff`, never U+FFFD
        # that hides what the command wrote; an incomplete character waits for its rest.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")
        self._held_cr = False  # a `\r` at a chunk's end: CRLF or not is known next chunk

    def feed(self, data: bytes) -> str:
        """The displayable text for ``data``; may hold back an incomplete tail."""
        return self._render(self._decoder.decode(data), final=False)

    def finish(self) -> str:
        """Whatever was held back, once the stream has ended."""
        return self._render(self._decoder.decode(b"", final=True), final=True)

    def _render(self, text: str, *, final: bool) -> str:
        if self._held_cr:
            text = "\r" + text
            self._held_cr = False
        if text.endswith("\r") and not final:
            text = text[:-1]
            self._held_cr = True
        return render_visible(text, ascii_only=self._ascii_only)


# What the CLI and the MCP server print as their own lines: a command's line that begins so
# could pass for one (a forged denial that makes a harness or a model ask to widen the mode,
# a fake exit status: a red team's).
OWN_LINE_STARTS = (
    "[sandbox",
    "[exit ",
    "[killed by ",
    "[timed out",
    "[no exit status]",
    "[stderr]",
    "[stdout truncated",
    "[stderr truncated",
)


class OwnLineGuard:
    """Escapes a command's lines that begin like the CLI's own (``starts``) with a
    backslash (`\\[sandbox: ...`), in a stream fed chunk by chunk: a line start split across
    two chunks is held back until it can be told apart. `\\n` and `\\r` both start a line
    (a reader's `splitlines` breaks at either)."""

    def __init__(self, starts: tuple[str, ...] = ("[sandbox",)) -> None:
        self._starts = tuple(s.encode() for s in starts)
        self._longest = max(len(s) for s in self._starts)
        self._at_start = True
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        data, self._held = self._held + data, b""
        out = bytearray()
        i = 0
        while i < len(data):
            if self._at_start:
                rest = data[i : i + self._longest]
                if len(rest) < self._longest and any(
                    s.startswith(rest) and len(rest) < len(s) for s in self._starts
                ):
                    self._held = data[i:]  # a start cut by the chunk's end: wait for more
                    return bytes(out)
                if data.startswith(self._starts, i):
                    out += b"\\"
                self._at_start = False
            ends = [j for j in (data.find(b"\n", i), data.find(b"\r", i)) if j >= 0]
            if not ends:
                out += data[i:]
                break
            end = min(ends) + 1
            out += data[i:end]
            i = end
            self._at_start = True
        return bytes(out)

    def finish(self) -> bytes:
        """What was held back at the end of the stream (never a whole marker: as it is)."""
        held, self._held = self._held, b""
        return held


def guard_own_lines(text: str) -> str:
    """``text`` (a whole output) with every line that begins like the CLI's or the MCP
    server's own lines escaped (`OwnLineGuard`)."""
    guard = OwnLineGuard(OWN_LINE_STARTS)
    data = text.encode("utf-8", "surrogateescape")
    return (guard.feed(data) + guard.finish()).decode("utf-8", "surrogateescape")
