"""Bounded output: tails, exact caps, undecodable bytes, and the private spill files."""

from __future__ import annotations

import asyncio
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from bash_local import LocalBashExecutor, OutputCollector, SpillDirectory
from bash_local.output import incomplete_utf8_suffix, leading_continuation_bytes
from bash_seam import BashExecRequest, BashExecSpec

Spec = Callable[..., BashExecSpec]
EURO = "€".encode()  # three bytes: e2 82 ac


def _spec(ex: LocalBashExecutor, command: str) -> BashExecSpec:
    return ex.resolve(BashExecRequest(command=command, workdir="/"))


async def test_output_exactly_at_the_cap_is_not_truncated(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    result = await executor.run(spec("head -c 100 /dev/zero | tr '\\0' a", stdout_max_bytes=100))
    assert result.stdout.text == "a" * 100
    assert not result.stdout.truncated and result.stdout.spill_path is None


async def test_one_byte_over_the_cap_keeps_the_tail(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    result = await executor.run(
        spec("printf b; head -c 100 /dev/zero | tr '\\0' a", stdout_max_bytes=100)
    )
    assert result.stdout.truncated
    assert result.stdout.text == "a" * 100


async def test_cap_applies_to_stderr_separately(executor: LocalBashExecutor, spec: Spec) -> None:
    result = await executor.run(
        spec("echo short; head -c 500 /dev/zero | tr '\\0' e >&2", stdout_max_bytes=50)
    )
    assert result.stdout.text == "short\n" and not result.stdout.truncated
    assert result.stderr.truncated and result.stderr.text == "e" * 50


async def test_binary_and_invalid_utf8_output_is_replaced_not_raised(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    result = await executor.run(
        spec(r"printf 'ok\xff\xfe\x00\xc3(end'; head -c 4096 /dev/urandom >&2")
    )
    assert result.stdout.text == "ok\ufffd\ufffd\x00\ufffd(end"
    assert result.exit_code == 0
    assert isinstance(result.stderr.text, str)


async def test_tail_never_starts_inside_a_multibyte_character(
    executor: LocalBashExecutor, spec: Spec
) -> None:
    # 4 + 6 bytes, cap 4: the cut falls after the first byte of the first euro sign.
    result = await executor.run(spec(r"printf 'xxxx\xe2\x82\xac\xe2\x82\xac'", stdout_max_bytes=4))
    assert result.stdout.truncated
    assert result.stdout.text == "€"


async def test_large_output_spills_whole_stream_to_a_private_file(
    executor: LocalBashExecutor, spec: Spec, tmp_path: Path, spill_parent: Path
) -> None:
    copy = tmp_path / "copy"
    result = await executor.run(
        spec(f"head -c 300000 /dev/urandom | tee {copy}", stdout_max_bytes=1000)
    )
    out = result.stdout
    assert out.truncated and out.spill_path is not None
    spilled = Path(out.spill_path).read_bytes()
    assert spilled == copy.read_bytes()
    tail = spilled[-1000:]
    assert out.text == tail[leading_continuation_bytes(tail) :].decode("utf-8", "replace")
    # Owner-only file in an owner-only directory under the configured parent, name unguessable.
    assert stat.S_IMODE(os.stat(out.spill_path).st_mode) == 0o600
    directory = os.path.dirname(out.spill_path)
    # Writable and searchable, never listable: a spill is reached only by its exact path.
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o300
    assert os.path.dirname(directory) == str(spill_parent)
    assert re.fullmatch(r"[0-9a-f]{32}\.stdout", os.path.basename(out.spill_path))
    assert executor.spill_directory == directory


async def test_spill_files_outlive_aclose(spill_parent: Path, tmp_path: Path) -> None:
    async with LocalBashExecutor(spill_dir=str(spill_parent), max_output_bytes=10) as ex:
        result = await ex.run(_spec(ex, "seq 1000"))
    assert result.stdout.spill_path is not None
    assert Path(result.stdout.spill_path).read_text() == "".join(f"{i}\n" for i in range(1, 1001))


async def test_stream_beyond_max_spill_bytes_leaves_no_spill(
    spill_parent: Path, tmp_path: Path
) -> None:
    async with LocalBashExecutor(
        spill_dir=str(spill_parent), max_output_bytes=1000, max_spill_bytes=5000
    ) as ex:
        result = await ex.run(_spec(ex, "head -c 10000 /dev/zero; echo end"))
    out = result.stdout
    assert out.truncated and out.spill_path is None
    assert out.text.endswith("end\n")
    assert [p for p in spill_parent.rglob("*") if p.is_file()] == []


def test_collector_memory_stays_bounded_by_cap_plus_one_chunk(tmp_path: Path) -> None:
    collector = OutputCollector(
        1000, stream="stdout", spill_dir=SpillDirectory(str(tmp_path)), max_spill_bytes=10_000
    )
    spilled: set[str] = set()
    for i in range(5000):
        collector.feed(bytes([65 + i % 26]) * 700)
        assert collector._mem_bytes < 1000 + 700  # the tail window, never the stream
        if collector.spill_path is not None:
            spilled.add(collector.spill_path)
    collector.close()
    assert collector.total == 5000 * 700
    assert len(spilled) == 1  # it did spill, until the stream outgrew max_spill_bytes
    assert collector.spill_path is None
    assert not os.path.exists(spilled.pop())
    assert len(collector.collected().text) == 1000


def test_a_byte_at_a_time_is_kept_in_a_few_chunks_not_one_object_a_read(
    tmp_path: Path,
) -> None:
    # One bytes object per pipe read: a command printing a byte at a time grew the harness
    # to 15 times the cap (object headers, not output: a red team's measure).
    collector = OutputCollector(
        100_000, stream="stdout", spill_dir=SpillDirectory(str(tmp_path)), max_spill_bytes=1
    )
    for i in range(300_000):
        collector.feed(bytes([65 + i % 26]))
    assert len(collector._chunks) <= 100_000 // (100_000 // 4) + 2
    assert 100_000 <= collector._mem_bytes < 100_000 + 100_000 // 4 + 1
    text = collector.collected().text
    assert len(text) == 100_000 and text.endswith(chr(65 + 299_999 % 26))


class _BrokenSpillDirectory(SpillDirectory):
    """Hands out a read-only descriptor, so every spill write fails."""

    def create_file(self, stream: str) -> tuple[str, int]:
        path, fd = super().create_file(stream)
        os.close(fd)
        return path, os.open(path, os.O_RDONLY)


def test_a_spill_whose_write_failed_is_deleted_and_never_reported(tmp_path: Path) -> None:
    collector = OutputCollector(
        10, stream="stdout", spill_dir=_BrokenSpillDirectory(str(tmp_path)), max_spill_bytes=1000
    )
    collector.feed(b"0123456789abcdef")
    collector.close()
    out = collector.collected()
    assert out.truncated and out.spill_path is None
    assert out.text == "6789abcdef"
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_unusable_spill_parent_still_yields_the_tail(tmp_path: Path) -> None:
    collector = OutputCollector(
        4,
        stream="stderr",
        spill_dir=SpillDirectory(str(tmp_path / "missing")),
        max_spill_bytes=1000,
    )
    collector.feed(b"abcdefgh")
    collector.close()
    assert collector.collected().text == "efgh"
    assert collector.collected().spill_path is None


def test_read_from_returns_at_most_the_cap_and_skips_a_larger_backlog(tmp_path: Path) -> None:
    spill = SpillDirectory(str(tmp_path))
    collector = OutputCollector(10, stream="stdout", spill_dir=spill, max_spill_bytes=1000)
    collector.feed(b"0123456789")
    assert collector.read_from(0, final=False) == (b"0123456789", 10, False)
    collector.feed(b"ABCDEFGHIJ" * 3)
    # 30 unread bytes, cap 10: the tail is returned, the skip is flagged, the spill is whole.
    assert collector.read_from(10, final=False) == (b"ABCDEFGHIJ", 40, True)
    assert collector.spill_path is not None
    with open(collector.spill_path, "rb") as fh:
        assert fh.read() == b"0123456789" + b"ABCDEFGHIJ" * 3
    collector.feed(b"klm")
    assert collector.read_from(40, final=False) == (b"klm", 43, False)

    small = OutputCollector(10, stream="stdout", spill_dir=spill, max_spill_bytes=20)
    small.feed(b"0123456789")
    small.feed(b"ABCDEFGHIJ" * 3)  # beyond max_spill_bytes: the spill is gone
    data, offset, lossy = small.read_from(0, final=True)
    assert lossy and offset == 40 and data.endswith(b"ABCDEFGHIJ")
    assert small.read_from(40, final=True) == (b"", 40, False)


def test_read_from_holds_back_an_incomplete_character_until_final(tmp_path: Path) -> None:
    collector = OutputCollector(
        100, stream="stdout", spill_dir=SpillDirectory(str(tmp_path)), max_spill_bytes=1000
    )
    collector.feed(b"a" + EURO[:2])
    assert collector.read_from(0, final=False) == (b"a", 1, False)
    collector.feed(EURO[2:])
    assert collector.read_from(1, final=False) == (EURO, 4, False)
    collector.feed(b"\xe2")
    assert collector.read_from(4, final=True) == (b"\xe2", 5, False)


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"", 0), (b"abc", 0), (EURO, 0), (EURO[:1], 1), (EURO[:2], 2), (b"a\xf0\x9f\x98", 3)],
)
def test_incomplete_utf8_suffix(data: bytes, expected: int) -> None:
    assert incomplete_utf8_suffix(data) == expected


def test_leading_continuation_bytes_are_counted_up_to_three() -> None:
    assert leading_continuation_bytes(EURO[1:] + b"x") == 2
    assert leading_continuation_bytes(b"\x80" * 5) == 3
    assert leading_continuation_bytes(b"x\x80") == 0


class _SlowReader:
    """A `PacedListener` whose reader is away until `back()`: held from the first chunk."""

    def __init__(self) -> None:
        self.bytes = 0
        self.away = True
        self.resume: list[Callable[[], None]] = []

    def __call__(self, stream: str, data: bytes) -> None:
        self.bytes += len(data)

    def held(self) -> bool:
        return self.away

    def on_drained(self, resume: Callable[[], None]) -> None:
        self.resume.append(resume)

    def back(self) -> None:
        self.away = False
        for resume in self.resume:
            resume()


async def test_a_paced_listener_holds_the_commands_pipe_and_never_the_loop(
    executor: LocalBashExecutor, tmp_path: Path
) -> None:
    # While the listener's reader is away, the command waits on its full pipe (it never
    # gets to write `done`), and the stream is whole once the reader is back.
    reader = _SlowReader()
    done = tmp_path / "done"
    spec = executor.resolve(
        BashExecRequest(command=f"head -c 1000000 /dev/zero; touch {done}", workdir="/")
    )
    run = asyncio.ensure_future(executor.run(spec, on_output=reader))
    await asyncio.sleep(1.0)  # the loop's own work goes on meanwhile
    assert not done.exists() and reader.bytes < 1000000
    reader.back()
    result = await asyncio.wait_for(run, 30)
    assert done.exists() and result.exit_code == 0 and reader.bytes == 1000000
