"""One grammar for sizes and durations (`policies.units`), in flags, the config file and MCP."""

from __future__ import annotations

import pytest

from policies.units import UnitsError, format_size, parse_duration_ms, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4096", 4096), ("8K", 8 << 10), ("512m", 512 << 20), ("2G", 2 << 30), ("1TiB", 1 << 40)],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected
    assert parse_size(expected) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("250", 250), ("500ms", 500), ("30s", 30_000), ("10m", 600_000), ("2h", 7_200_000)],
)
def test_durations(text: str, expected: int) -> None:
    assert parse_duration_ms(text) == expected


@pytest.mark.parametrize("bad", ["0", "-1", "1.5G", "G", "12X", "", "true"])
def test_bad_sizes_list_the_accepted_forms(bad: str) -> None:
    with pytest.raises(UnitsError, match="expected a size such as 512M or 2G"):
        parse_size(bad)


@pytest.mark.parametrize("bad", ["0s", "soon", "1.5s", "3 parsecs", True])
def test_bad_durations_list_the_accepted_forms(bad: str | bool) -> None:
    with pytest.raises(UnitsError, match="expected a duration such as 500ms"):
        parse_duration_ms(bad)  # type: ignore[arg-type]


def test_sizes_are_shown_in_the_grammar() -> None:
    assert [format_size(n) for n in (16 << 20, 8 << 30, 1000)] == ["16M", "8G", "1000"]


def test_mcp_tool_arguments_take_the_same_durations() -> None:
    pytest.importorskip("mcp")
    from bash_sandbox.cli.mcp_tools import BashRunArguments

    assert (
        BashRunArguments.model_validate({"command": "x", "timeout_ms": "30s"}).timeout_ms == 30_000
    )
    assert BashRunArguments.model_validate({"command": "x", "timeout_ms": 250}).timeout_ms == 250
    with pytest.raises(ValueError, match="expected a duration"):
        BashRunArguments.model_validate({"command": "x", "timeout_ms": "soon"})
