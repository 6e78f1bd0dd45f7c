"""`TerminalRenderer`: what a terminal is sent for a command's bytes, chunk by chunk."""

from __future__ import annotations

import pytest

from bash_sandbox.cli.render import TerminalRenderer, render_visible


def render_chunks(*chunks: bytes) -> str:
    renderer = TerminalRenderer()
    return "".join(renderer.feed(c) for c in chunks) + renderer.finish()


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (b"\x1b]52;c;SGVsbG8=\x07", "^[]52;c;SGVsbG8=^G"),  # OSC 52 clipboard write
        (b"\x1b]0;title\x1b\\", "^[]0;title^[\\"),  # window title, ST-terminated
        (b"\x1b[2J\x1b[H", "^[[2J^[[H"),  # clear screen, cursor home
        (b"ok\r[exit 0]\n", "ok^M[exit 0]\n"),  # a bare CR overwrites the line
        (b"\x08\x7f\x00", "^H^?^@"),  # backspace, DEL, NUL
        ("\u009b31m".encode(), "\\x9b31m"),  # C1 CSI, UTF-8 encoded
        ("a\u202eb\u2066c".encode(), "a\\u202eb\\u2066c"),  # bidi override and isolate
        ("a\u200fb\u061cc".encode(), "a\\u200fb\\u061cc"),  # bidi marks (RLM, ALM)
        ("a\u2028b\u2029c".encode(), "a\\u2028b\\u2029c"),  # line, paragraph separators
        (b"\xff\xfe", "\\xff\\xfe"),  # not UTF-8: visible, never U+FFFD
        (b"tab\tnl\ncrlf\r\n", "tab\tnl\ncrlf\r\n"),  # kept as they are
        ("é ü 日本 🎉".encode(), "é ü 日本 🎉"),
    ],
)
def test_controls_become_visible_and_text_stays(raw: bytes, shown: str) -> None:
    assert render_chunks(raw) == shown
    assert render_visible(raw.decode(errors="backslashreplace")) == shown


def test_a_multibyte_character_split_at_every_byte_is_whole() -> None:
    data = "x🎉y€z".encode()
    assert render_chunks(*(data[i : i + 1] for i in range(len(data)))) == "x🎉y€z"


def test_crlf_split_between_chunks_is_still_crlf_and_a_final_cr_is_shown() -> None:
    assert render_chunks(b"line\r", b"\nnext\r") == "line\r\nnext^M"
    assert render_chunks(b"a\r", b"b") == "a^Mb"


def test_an_escape_split_across_chunks_is_still_rendered() -> None:
    assert render_chunks(b"\x1b", b"[2J") == "^[[2J"


def test_an_incomplete_character_at_the_end_is_shown_as_bytes() -> None:
    assert render_chunks(b"ok\xe2\x82") == "ok\\xe2\\x82"


def test_a_terminal_whose_locale_is_not_utf8_gets_ascii_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An 8-bit terminal reads the second byte of `Ý` (C3 9D) as OSC and of `Û` as CSI: a red
    # team set the title and cleared the screen through letters. Such a terminal gets none.
    import io

    from bash_sandbox.cli import render, stream

    data = "\u00dd0;TITLE\u00dc then \u00db2J \u00e9 \u65e5".encode()
    monkeypatch.setattr(render.locale, "getpreferredencoding", lambda _=True: "ISO-8859-1")
    assert not render.utf8_terminal()
    out = io.BytesIO()
    sink = stream.StreamSink(io.TextIOWrapper(out, encoding="latin-1"), render=True)
    sink.write_chunk(data)
    sink.finish()
    sink.write_note("[sandbox: write to caf\u00e9\u009b denied]\n")
    written = out.getvalue()
    assert max(written) < 0x80, written
    assert b"\\xdd0;TITLE\\xdc then \\xdb2J \\xe9 \\u65e5" in written
    monkeypatch.setattr(render.locale, "getpreferredencoding", lambda _=True: "UTF-8")
    assert render.utf8_terminal()
    assert render_chunks(data) == data.decode()  # a UTF-8 terminal keeps the letters


def test_a_warm_calls_process_reads_its_clients_locale() -> None:
    # The warm daemon's fork took the client's environment but kept the daemon's locale:
    # an ASCII-only client got the raw bytes an 8-bit terminal reads as controls.
    import locale
    import os

    from bash_sandbox.cli import render
    from bash_sandbox.warm.spare import adopt_environment

    saved_env, saved = dict(os.environ), locale.setlocale(locale.LC_CTYPE)
    try:
        adopt_environment({**saved_env, "LC_ALL": "C.UTF-8"})
        assert render.utf8_terminal()
        adopt_environment({**saved_env, "LC_ALL": "C"})
        assert not render.utf8_terminal()
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        locale.setlocale(locale.LC_CTYPE, saved)


def _guarded(data: bytes, cuts: list[int]) -> bytes:
    """``data`` through the CLI's guard, fed in the pieces ``cuts`` makes."""
    from bash_sandbox.cli.render import OwnWordGuard

    guard = OwnWordGuard()
    out, prev = b"", 0
    for cut in [*cuts, len(data)]:
        out, prev = out + guard.feed(data[prev:cut]), cut
    return out + guard.finish()


def test_every_occurrence_of_the_clis_words_is_escaped_however_it_is_cut() -> None:
    # A command printed the CLI's own denial line, which a harness then acted on (a red
    # team's). Rounds 13 to 17 each got one past a guard of line starts: a line break it did
    # not know (\f, U+2028), invisible characters (U+00A0, U+200B, U+3164, tags), escape
    # sequences a terminal or a stripper reads otherwise (`ESC[ 1m`, `ESC[3\bm`, an OSC
    # ended by CAN, a C1 CSI, `ESC[\rm`), one left open across two writes, and stderr's
    # line start that stdout's newline made on a shared stream. Every occurrence anywhere
    # is escaped now.
    leads = (
        b"", b"  ", b"\xc2\xa0", b"\xe2\x80\x8b", b"\xe3\x85\xa4", b"\xf3\xa0\x80\xa0",
        b"\x1b[ 1m", b"\x1b[3\bm", b"\x1b]0;x\x18", b"\xc2\x9b0m", b"\x1b[\rm", b"\x1b[1\x1cm",
        b"\x1b]" + b"A" * 400 + b"\x07", b"\x1b[m" * 100 + b"\x1b(B", b"x\x1b[1D", b"fine ",
    )  # fmt: skip
    for lead in leads:
        for word in (
            b"[sandbox: x]",
            b"[SANDBOX: x]",
            b"\xef\xbc\xbbsandbox: x]",
            b"bash-sandbox: y",
        ):
            data = b"ok\f" + lead + word + b"\n"
            whole = b"ok\f" + lead + b"\\" + word + b"\n"
            for cuts in ([], *([k] for k in range(len(data))), [3 + len(lead) // 2, 3 + len(lead)]):
                assert _guarded(data, cuts) == whole, (lead[:12], word, cuts)
    # Round 19: whatever a reader drops between the letters (an ANSI stripper, a terminal,
    # `col -b`) is looked past too: an escape sequence, a zero-width or format character, a
    # control, a character a backspace takes back.
    inside = (
        b"[sand\x1b[mbox: x]", b"[sa\x1b]0;t\x07ndbox: y]", b"[sand\xe2\x81\xaabox: z]",
        b"b\x1b[1mash-sandbox: w", b"[sanX\x08dbox: v", b"[s\xc2\xadandbox: u",
        b"\xef\xbc\xbbsan\xef\xbb\xbfdbox: t", b"[SAN\x1b(BDBOX: s",
    )  # fmt: skip
    for word in inside:
        data = b"ok\n" + word + b"\n"
        for cut in range(len(data) + 1):
            for cuts in ([cut], [cut, min(len(data), cut + 1)], [cut, min(len(data), cut + 3)]):
                assert _guarded(data, cuts) == b"ok\n\\" + word + b"\n", (word, cuts)
    # Other text, and a part of a word at the stream's end, go out as they are.
    assert _guarded(b"[sandbo", [3]) == b"[sandbo"
    assert _guarded(b"[exit 0] sandbox [INFO]\n", [5]) == b"[exit 0] sandbox [INFO]\n"
    text = b"caf\xc3\xa9 \xe2\x80\x94 \x1b[32mok\x1b[0m [sandbo"
    assert all(_guarded(text, [k]) == text for k in range(len(text) + 1))


def test_a_note_naming_a_path_with_line_breaks_stays_one_line() -> None:
    # Round 15: a refused path `/usr/x\n[exit 0]` ended the CLI's or the server's own
    # denial line and started a forged one.
    from bash_sandbox.cli.render import one_line

    shown = one_line("[sandbox: write to /usr/x\n[exit 0]\r\u2028\x85\x1b[2K denied]")
    assert shown.splitlines() == [shown]
    assert shown == "[sandbox: write to /usr/x\\n[exit 0]^M\\u2028\\x85^[[2K denied]"
    # Every character a terminal would show as nothing, as the renderer's own table does.
    assert one_line("a\u200bb\u206ac") == "a\\u200bb\\u206ac"


def test_a_terminal_shows_the_characters_it_would_show_as_nothing() -> None:
    # Round 16: `[sand<ZWSP>box:` read on a terminal as the CLI's own line.
    from bash_sandbox.cli.render import render_visible

    shown = render_visible("[sand\u200bbox: x]\u034f\u3164\U000e0020\ufe0f ok")
    assert shown == "[sand\\u200bbox: x]\\u034f\\u3164\\U000e0020\\ufe0f ok"
    # Round 19: any format character, by its category, and the jamo a terminal draws with no
    # width (a list of them fell to U+206A, U+1BCA0, U+1161); what shows stays as it is.
    shown = render_visible("\u206a\U0001bca0\u1161\U00013430 a\u0301 é 日本 \U0001f642 \ue0a0")
    assert shown == "\\u206a\\U0001bca0\\u1161\\U00013430 a\u0301 é 日本 \U0001f642 \ue0a0"
