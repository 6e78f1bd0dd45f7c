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
import unicodedata
from typing import Any

_KEPT = {ord("\n"), ord("\t")}
# Reorder the displayed text without being visible themselves ("Trojan Source"): the
# embeddings, overrides and isolates, and the implicit marks (LRM, RLM, ALM).
_BIDI_CONTROLS = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)
# Line and paragraph separators: a client that breaks lines at them shows text as lines of
# their own that the CLI never started (an indented command line left unindented).
_LINE_BREAKS = (0x2028, 0x2029)
# Characters a terminal shows as nothing, beyond the controls: every format character
# (Unicode category Cf: joiners, tags, invisible operators, the soft hyphen) and the
# fillers, jamo and selectors a terminal draws with no width. Inside a word they made
# `[sand<ZWSP>box:` read as the CLI's own line (round 16); a list of them fell to the next
# ones (round 19: U+206A, U+1BCA0, Hangul jamo), so the category decides, once per character.
_NO_WIDTH = (
    (0x115F, 0x1200), (0x17B4, 0x17B6), (0x180B, 0x1810), (0x2800, 0x2801),
    (0x3164, 0x3165), (0xD7B0, 0xD800), (0xFE00, 0xFE10), (0xFFA0, 0xFFA1),
    (0xE0100, 0xE01F0), (0x034F, 0x0350),
)  # fmt: skip


def _escaped(code: int) -> str:
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class _VisibleForms(dict[int, str]):
    """`str.translate`'s table: the controls' forms, and any other character the terminal
    would show as nothing, worked out (and kept) the first time it is met."""

    def __missing__(self, code: int) -> str:
        invisible = code >= 0x80 and unicodedata.category(chr(code)) in ("Cf", "Zl", "Zp", "Cs")
        if not invisible and not any(low <= code < high for low, high in _NO_WIDTH):
            raise LookupError(code)  # shown as it is
        # A byte a path held that is not UTF-8 (`surrogateescape`): shown as the byte, as an
        # invalid byte of the output is (`\\xff`).
        form = f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else _escaped(code)
        self[code] = form
        return form


def _visible_forms() -> _VisibleForms:
    table = _VisibleForms()
    for code in range(0x20):
        if code not in _KEPT:
            table[code] = "^" + chr(code + 0x40)
    table[0x7F] = "^?"
    for code in range(0x80, 0xA0):
        table[code] = f"\\x{code:02x}"
    for code in (*_BIDI_CONTROLS, *_LINE_BREAKS):
        table[code] = _escaped(code)
    return table


VISIBLE_FORMS = _visible_forms()


def render_visible(text: str, *, ascii_only: bool = False) -> str:
    """``text`` with every control character shown as inert text (CRLF kept); with
    ``ascii_only``, every non-ASCII character too."""
    shown = "\r\n".join(part.translate(VISIBLE_FORMS) for part in text.split("\r\n"))
    return shown.encode("ascii", "backslashreplace").decode("ascii") if ascii_only else shown


# A line of the CLI's or the server's own is one line whatever it names: a refused path the
# command chose (`/usr/x\n[exit 0]`) would otherwise end it and start a forged one.
_ONE_LINE = _visible_forms()  # a table of its own, working out the invisible ones as well
_ONE_LINE[ord("\n")] = "\\n"


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


# The words the CLI's own lines (markers and notes, on stderr) begin with: the command's
# text must never hold them. The MCP server's text indents the command's output instead
# (`mcp_results._quoted`).
CLI_OWN_WORDS = ("[sandbox", "bash-sandbox:")


# What a reader may drop between the letters of a word (round 19: `[sand<ESC[m>box` read as
# the CLI's own line once an ANSI stripper had run): escape sequences, C0 and C1 controls
# but line breaks, DEL, a character a backspace takes back, and characters shown as nothing.
_IGNORABLE = (
    rb"(?:\x1b\[[\x20-\x3f]*[\x40-\x7e]?"
    rb"|\x1b[\]PX^_][^\x07\x1b\n]*(?:\x07|\x1b\\)?"
    rb"|\x1b[\x20-\x2f]*[\x30-\x7e]?"
    rb"|[\x00-\x09\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]"
    rb"|[^\n\r]\x08"
    rb"|\xc2[\x80-\x9f\xad]|\xe2\x80[\x8b-\x8f]|\xe2\x81[\xa0-\xaf]|\xef\xbb\xbf)"
)
# Whether a stretch holds any of them at all (most output holds none, and then a literal
# search of the words is many times faster): a control byte, or a lead of the UTF-8 ones.
_PLAIN_BYTES = bytes([9, 10, 13, *range(0x20, 0x7F), *range(0x80, 0x100)])
_UTF8_IGNORABLE_LEADS = (b"\xc2", b"\xe2\x80", b"\xe2\x81", b"\xef\xbb\xbf")


def _may_hide(data: bytes) -> bool:
    return (
        bool(data.translate(None, _PLAIN_BYTES))
        or any(lead in data for lead in _UTF8_IGNORABLE_LEADS)
        or data.endswith((b"\xe2", b"\xef", b"\xef\xbb"))  # one cut by the chunk's end
    )


# A chunk's end inside one of them (told apart with the next chunk).
_CUT = rb"(?:\x1b[\x20-\x3f]*|\xc2|\xe2[\x80\x81]?|\xef\xbb?|[^\n\r])?"
_HOLD_MAX = 4096  # bytes held back at most while a word may still be forming


def _spelled(word: bytes) -> bytes:
    """A regex for ``word`` with anything a reader drops between its letters."""
    letters = [word[:3]] if word.startswith(b"\xef\xbc\xbb") else [word[:1]]
    rest = word[len(letters[0]) :]
    letters += [rest[i : i + 1] for i in range(len(rest))]
    return (_IGNORABLE + b"*").join(re.escape(c) for c in letters)


class OwnWordGuard:
    """Escapes every occurrence of the CLI's own words (``words``: `[sandbox`,
    `bash-sandbox:`, in any case, also with a fullwidth bracket, and with whatever a reader
    drops between their letters) in a command's stream with a backslash before it
    (`\\[sandbox: ...`), fed chunk by chunk: a tail that may begin one is held back until the
    next chunk tells.

    Anywhere in a line, not only at its start: rounds 13 to 19 each got a forged line past a
    guard of line starts (a line break it did not know, an invisible character, an escape
    sequence a terminal or a stripper reads otherwise, one left open across two writes, a
    cursor moved back, stderr's line start that stdout's newline made). A command's own
    `[sandbox` in the middle of a line is rare, and its backslash costs nothing."""

    def __init__(self, words: tuple[str, ...] = CLI_OWN_WORDS) -> None:
        encoded = [w.lower().encode() for w in words]
        encoded += [b"\xef\xbc\xbb" + w[1:] for w in encoded if w.startswith(b"[")]
        self._pattern = re.compile(b"|".join(_spelled(w) for w in encoded), re.IGNORECASE)
        self._literal = re.compile(b"|".join(re.escape(w) for w in encoded), re.IGNORECASE)
        self._words = tuple(encoded)
        self._longest = max(map(len, encoded)) - 1
        self._begun = frozenset(w[:k] for w in encoded for k in range(1, len(w)))
        # Every proper beginning of a word, running to the end of what was fed.
        starts = [_spelled(w[:k]) for w in encoded for k in range(1, len(w))]
        self._forming = re.compile(
            b"(?:" + b"|".join(starts) + b")" + _IGNORABLE + b"*" + _CUT + rb"\Z",
            re.IGNORECASE,
        )
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        data = self._held + data
        cut = len(data)
        start = max(0, cut - _HOLD_MAX)
        if _may_hide(data[start:]):
            forming = self._forming.search(data, start)
            cut = forming.start() if forming is not None else cut
        else:
            # A beginning at the end, or one and a character a backspace may take back next.
            lowered = data[-self._longest - 1 :].lower()
            cut -= max(
                (
                    n + extra
                    for extra in (0, 1)
                    for n in range(1, len(lowered) + 1 - extra)
                    if lowered[len(lowered) - n - extra : len(lowered) - extra] in self._begun
                ),
                default=0,
            )
        body, self._held = data[:cut], data[cut:]
        if _may_hide(body):
            return self._pattern.sub(lambda found: b"\\" + found.group(0), body)
        lowered = body.lower()
        if not any(word in lowered for word in self._words):
            return body
        return self._literal.sub(lambda found: b"\\" + found.group(0), body)

    def finish(self) -> bytes:
        """What was held back at the end of the stream (never a whole word: as it is)."""
        held, self._held = self._held, b""
        return held
