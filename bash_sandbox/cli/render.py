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
import re

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


# A line of the CLI's or the server's own is one line whatever it names: a refused path the
# command chose (`/usr/x\n[exit 0]`) would otherwise end it and start a forged one.
_ONE_LINE = {**VISIBLE_FORMS, ord("\n"): "\\n"}


def one_line(text: str) -> str:
    """``text`` with every line break and control character shown as inert text."""
    return text.translate(_ONE_LINE)


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
# a fake exit status: a red team's). The CLI prints its markers and notes on stderr.
CLI_LINE_STARTS = ("[sandbox", "bash-sandbox:")
OWN_LINE_STARTS = (
    "[sandbox",
    "[exit ",
    "[killed by ",
    "[timed out",
    "[no exit status]",
    "[stderr]",
    "[stdout truncated",
    "[stderr truncated",
    "[part of the output",
    "[bash-",  # a background command's status: `[bash-1 exited]`
    "started bash-",
)
# What a reader takes for the start of a line (`str.splitlines` breaks at each), and what
# it may not see before the words: every control, blank, escape sequence and character that
# is not printable ASCII (a list of invisible ones fell to the next one a red team found:
# fillers, joiners, tag and variation characters). A line whose first printable ASCII
# begins like an own line is escaped, also after a visible letter of another script: the
# backslash costs nothing there.
_BREAK = re.compile(rb"[\n\r\v\f\x1c\x1d\x1e]|\xc2\x85|\xe2\x80[\xa8\xa9]")
_INVISIBLE = re.compile(
    rb"(?:\x1b\[[\x30-\x3f]*[\x20-\x2f]*(?:[\x40-\x7e]|\Z)"  # CSI
    rb"|\x1b[\]PX^_][^\x07\x1b\n\r]*(?:\x07|\x1b\\|\x1b?\Z)?"  # OSC, DCS, SOS, PM, APC
    rb"|\x1b[\x20-\x2f]*[\x30-\x7e]?"  # the others (`ESC ( B`)
    rb"|[\x00-\x09\x0e-\x1a\x1f\x20\x7f\x80-\xc1\xf5-\xff]"
    rb"|(?!\xc2\x85|\xe2\x80[\xa8\xa9]|\xef\xbc\xbb)"  # a break, the fullwidth bracket
    rb"(?:[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3})"
    rb"|[\xc2-\xf4][\x80-\xbf]{0,2}\Z)*"  # cut by the chunk's end: told apart with the next
)
_HOLD_MAX = 256  # blanks at a line start held back at most


class OwnLineGuard:
    """Escapes a command's lines that begin like the CLI's own (``starts``, also with a
    fullwidth bracket, U+FF3B) with a backslash (`\\[sandbox: ...`), in a stream fed chunk
    by chunk: a line start cut by a chunk's end is held back until it can be told apart.
    Every break `str.splitlines` knows starts a line, and blanks and zero-width characters
    before the words are looked past."""

    def __init__(self, starts: tuple[str, ...] = CLI_LINE_STARTS) -> None:
        words = [s.encode() for s in starts]
        words += [b"\xef\xbc\xbb" + w[1:] for w in words if w.startswith(b"[")]
        self._starts = tuple(words)
        self._longest = max(len(w) for w in self._starts)
        self._at_start = True
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        data, self._held = self._held + data, b""
        out = bytearray()
        i, n = 0, len(data)
        while i < n:
            if self._at_start:
                j = _INVISIBLE.match(data, i).end()  # type: ignore[union-attr]
                rest = data[j : j + self._longest].lower()  # `[SANDBOX` reads the same
                undecided = j == n or (
                    len(rest) < self._longest and any(w.startswith(rest) for w in self._starts)
                )
                if undecided:
                    if j - i <= _HOLD_MAX:
                        self._held = data[i:]
                        return bytes(out)
                    # A long run of blanks goes out, the line still at its start.
                    out += data[i:j]
                    i = j
                    continue
                if rest.startswith(self._starts):
                    out += data[i:j] + b"\\"
                    i = j
                self._at_start = False
            found = _BREAK.search(data, i)
            if found is None:
                tail = next((c for c in (b"\xe2\x80", b"\xe2", b"\xc2") if data.endswith(c)), b"")
                out += data[i : n - len(tail)]
                self._held = tail
                break
            out += data[i : found.end()]
            i = found.end()
            self._at_start = True
        return bytes(out)

    def finish(self) -> bytes:
        """What was held back at the end of the stream (never a whole marker: as it is)."""
        held, self._held = self._held, b""
        return held


def guard_own_lines(text: str) -> str:
    """``text`` (a whole output) with every line that begins like the MCP server's own
    lines escaped (`OwnLineGuard`)."""
    guard = OwnLineGuard(OWN_LINE_STARTS)
    data = text.encode("utf-8", "surrogateescape")
    return (guard.feed(data) + guard.finish()).decode("utf-8", "surrogateescape")
