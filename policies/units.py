"""The one grammar for sizes and durations, shared by the CLI flags, the config file and MCP.

Sizes: a whole number of bytes, or a whole number followed by ``K``, ``M``, ``G`` or ``T``
(powers of 1024; ``KiB``/``KB``/``k`` all mean the same): ``4096``, ``512M``, ``2G``.
Fractions are refused (``1.5G``: write ``1536M``) so a value always names whole bytes.

Durations: a whole number of milliseconds, or a whole number followed by ``ms``, ``s``,
``m`` or ``h``: ``500ms``, ``30s``, ``10m``.

Both parsers raise `UnitsError` (a `ValueError`) with the accepted forms in the message.
"""

from __future__ import annotations

import re

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
DURATION_UNITS_MS = {"": 1, "MS": 1, "S": 1000, "M": 60_000, "H": 3_600_000}

_SIZE = re.compile(r"(?P<number>[0-9]+)\s*(?P<unit>[KMGT]?)(?:I?B)?", re.IGNORECASE)
_DURATION = re.compile(r"(?P<number>[0-9]+)\s*(?P<unit>MS|S|M|H)?", re.IGNORECASE)

SIZE_FORMS = "a size such as 512M or 2G (bytes, K, M, G, T: powers of 1024)"
DURATION_FORMS = "a duration such as 500ms, 30s or 10m (a bare number is milliseconds)"


class UnitsError(ValueError):
    """A size or duration outside the grammar; the message lists the accepted forms."""

    code = "INVALID_UNITS"


def parse_size(value: str | int) -> int:
    """``"512M"`` -> 536870912; an int is already bytes. Positive only."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
        number = int(match["number"]) * SIZE_UNITS[match["unit"].upper()] if match else 0
    if number <= 0:
        raise UnitsError(f"expected {SIZE_FORMS}, got {value!r}")
    return number


def parse_duration_ms(value: str | int) -> int:
    """``"30s"`` -> 30000; an int is already milliseconds. Positive only."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        match = _DURATION.fullmatch(value.strip()) if isinstance(value, str) else None
        unit = (match["unit"] or "").upper() if match else ""
        number = int(match["number"]) * DURATION_UNITS_MS[unit] if match else 0
    if number <= 0:
        raise UnitsError(f"expected {DURATION_FORMS}, got {value!r}")
    return number


def format_size(number: int) -> str:
    """The shortest exact spelling: 16777216 -> ``16M``, 1000 -> ``1000``."""
    for unit in ("T", "G", "M", "K"):
        if number % SIZE_UNITS[unit] == 0:
            return f"{number // SIZE_UNITS[unit]}{unit}"
    return str(number)


def size_or_text(value: object) -> object:
    """A pydantic before-validator: text in the size grammar becomes bytes; anything else is
    left for the field's own validation."""
    return parse_size(value) if isinstance(value, str) else value


def duration_or_text(value: object) -> object:
    """The same for a millisecond field."""
    return parse_duration_ms(value) if isinstance(value, str) else value
