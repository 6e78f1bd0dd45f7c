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


# What the CLI prints as its own lines (markers and notes, on stderr): the command's text
# must never hold them. The MCP server's text indents the command's output instead
# (`mcp_results._quoted`).
CLI_LINE_STARTS = ("[sandbox", "bash-sandbox:")


class OwnWordGuard:
    """Escapes every occurrence of the CLI's own words (``words``: `[sandbox`,
    `bash-sandbox:`, in any case, also with a fullwidth bracket) in a command's stream with
    a backslash before it (`\\[sandbox: ...`), fed chunk by chunk: a tail that may begin one
    is held back until the next chunk tells.

    Anywhere in a line, not only at its start: rounds 13 to 17 each got a forged line past a
    guard of line starts (a line break it did not know, an invisible character, an escape
    sequence a terminal or a stripper reads otherwise, one left open across two writes, a
    cursor moved back, stderr's line start that stdout's newline made). A command's own
    `[sandbox` in the middle of a line is rare, and its backslash costs nothing."""

    def __init__(self, words: tuple[str, ...] = CLI_LINE_STARTS) -> None:
        encoded = [w.lower().encode() for w in words]
        encoded += [b"\xef\xbc\xbb" + w[1:] for w in encoded if w.startswith(b"[")]
        self._words = tuple(encoded)
        self._pattern = re.compile(b"|".join(re.escape(w) for w in self._words), re.IGNORECASE)
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        data = self._held + data
        cut = len(data)
        for size in range(min(len(data), max(map(len, self._words)) - 1), 0, -1):
            tail = data[-size:].lower()
            if any(w.startswith(tail) for w in self._words):
                cut = len(data) - size
                break
        body, self._held = data[:cut], data[cut:]
        return self._pattern.sub(lambda found: b"\\" + found.group(0), body)

    def finish(self) -> bytes:
        """What was held back at the end of the stream (never a whole word: as it is)."""
        held, self._held = self._held, b""
        return held
