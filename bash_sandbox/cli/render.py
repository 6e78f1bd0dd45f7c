"""Making a command's output safe to show on a terminal (threat-model row 18).

A terminal interprets what it is sent: escape sequences set the clipboard (OSC 52), the
title, clear the screen or move the cursor, and a bare `\\r` lets a command overwrite what
the CLI printed (a fake `[exit 0]`). `TerminalRenderer` turns one stream's bytes into text
where every control character is visible and inert: C0 controls as caret notation (`^[`,
`^M`), DEL as `^?`, C1 controls as `\\x9b`, invalid UTF-8 bytes as `\\xff`, and the
bidirectional controls that reorder what is displayed, the Unicode line and paragraph
separators and the characters a terminal shows as nothing (zero-width, fillers, tags) as
`\\u202e`. Newline, tab and a `\\r` directly before a newline (CRLF) are
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
from typing import Any

_KEPT = {ord("\n"), ord("\t")}
# Reorder the displayed text without being visible themselves ("Trojan Source"): the
# embeddings, overrides and isolates, and the implicit marks (LRM, RLM, ALM).
_BIDI_CONTROLS = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)
# Line and paragraph separators: a client that breaks lines at them shows text as lines of
# their own that the CLI never started (an indented command line left unindented).
_LINE_BREAKS = (0x2028, 0x2029)
# Characters a terminal shows as nothing (format characters, joiners, fillers, variation
# and tag characters): inside a word they made `[sand<ZWSP>box:` read as the CLI's own line
# (round 16).
_INVISIBLE_CHARS = (
    0x00AD, 0x034F, 0x061C, 0x115F, 0x1160, 0x17B4, 0x17B5, *range(0x180B, 0x1810),
    *range(0x200B, 0x200E), *range(0x2060, 0x2066), 0x2800, 0x3164, *range(0xFE00, 0xFE10),
    0xFEFF, 0xFFA0, *range(0xFFF9, 0xFFFC), *range(0x1D173, 0x1D17B), 0xE0001,
    *range(0xE0020, 0xE0080), *range(0xE0100, 0xE01F0),
)  # fmt: skip


def _visible_forms() -> dict[int, str]:
    table: dict[int, str] = {}
    for code in range(0x20):
        if code not in _KEPT:
            table[code] = "^" + chr(code + 0x40)
    table[0x7F] = "^?"
    for code in range(0x80, 0xA0):
        table[code] = f"\\x{code:02x}"
    for code in (*_BIDI_CONTROLS, *_LINE_BREAKS, *_INVISIBLE_CHARS):
        table[code] = f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
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


def json_safe(value: Any) -> Any:
    """``value`` (strings, lists, tuples and dicts of them) with every string that holds
    lone surrogates (a path's bytes that are not UTF-8, as `os.fsdecode` keeps them) shown
    as escapes instead (`caf\\xe9`): a JSON writer refuses them, and a strict reader too."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            try:
                raw = value.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # a surrogate no byte became
                return value.encode("utf-8", "backslashreplace").decode()
            return raw.decode("utf-8", "backslashreplace")
        return value
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


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


# What the CLI prints as its own lines (markers and notes, on stderr): a command's line that
# begins so could pass for one (a forged denial that makes a harness ask to widen the mode:
# a red team's). The MCP server's text indents the command's output instead
# (`mcp_results._quoted`).
CLI_LINE_STARTS = ("[sandbox", "bash-sandbox:")
# What a reader takes for the start of a line (`str.splitlines` breaks at each), and what
# it may not see before the words: every control, blank, escape sequence and character that
# is not printable ASCII (a list of invisible ones fell to the next one a red team found:
# fillers, joiners, tag and variation characters). A line whose first printable ASCII
# begins like an own line is escaped, also after a visible letter of another script: the
# backslash costs nothing there. Escape sequences are read as a terminal reads them: a
# control inside a CSI runs and the CSI goes on, CAN and SUB end a string (round 16).
_BREAK = re.compile(rb"[\n\r\v\f\x1c\x1d\x1e]|\xc2\x85|\xe2\x80[\xa8\xa9]")
# In a CSI: parameters, intermediates, and the controls a terminal runs meanwhile (not a
# break, not ESC, CAN or SUB, which end it).
_CSI_BODY = rb"[\x00-\x09\x0e-\x17\x19\x1f-\x3f]*"
_STRING_BODY = rb"[^\x07\x1b\x18\x1a\n\r\v\f\x1c\x1d\x1e]*"
_STRING_END = rb"(?:\x07|\x1b\\|[\x18\x1a])"
_INVISIBLE = re.compile(
    rb"(?:\x1b\[" + _CSI_BODY + rb"(?:[\x40-\x7e]|\Z)"  # CSI
    rb"|\x1b[\]PX^_]" + _STRING_BODY + rb"(?:" + _STRING_END + rb"|\x1b?\Z)?"  # OSC, DCS...
    rb"|\x1b[\x20-\x2f]*[\x30-\x7e]?"  # the others (`ESC ( B`)
    rb"|[\x00-\x09\x0e-\x1a\x1f\x20\x7f\x80-\xc1\xf5-\xff]"
    rb"|(?!\xc2\x85|\xe2\x80[\xa8\xa9]|\xef\xbc\xbb)"  # a break, the fullwidth bracket
    rb"(?:[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3})"
    rb"|[\xc2-\xf4][\x80-\xbf]{0,2}\Z)*"  # cut by the chunk's end: told apart with the next
)
# An escape sequence still open where a long run at a line start is let go, and the rest of
# one in the next chunk (up to its end, and whether it ended).
_OPEN = re.compile(rb"\x1b(?:(\[)" + _CSI_BODY + rb"|[\]PX^_]" + _STRING_BODY + rb")\Z")
_CSI_REST = re.compile(_CSI_BODY + rb"([\x40-\x7e])?")
_STRING_REST = re.compile(_STRING_BODY + rb"(" + _STRING_END + rb")?")
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
        self._open: re.Pattern[bytes] | None = None  # the rest of a sequence let go open

    def feed(self, data: bytes) -> bytes:
        data, self._held = self._held + data, b""
        out = bytearray()
        i, n = 0, len(data)
        while i < n:
            if self._at_start and self._open is not None:
                # Still inside an escape sequence a long run let go: its rest is not text.
                inside = self._open.match(data, i)
                assert inside is not None  # both patterns match the empty string
                out += data[i : inside.end()]
                i = inside.end()
                if inside.group(1) is None and i == n:
                    return bytes(out)
                self._open = None
                continue
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
                    # A long run of blanks goes out, the line still at its start; one that
                    # ends inside an escape sequence has the sequence's rest read as such.
                    if data.endswith(b"\x1b"):  # ends a string, or begins a sequence
                        out += data[i : n - 1]
                        self._held = data[n - 1 :]
                        return bytes(out)
                    out += data[i:j]
                    escape = data.rfind(b"\x1b", i, j)
                    still = _OPEN.fullmatch(data, escape, j) if escape >= 0 else None
                    if still is not None:
                        self._open = _CSI_REST if still.group(1) else _STRING_REST
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
