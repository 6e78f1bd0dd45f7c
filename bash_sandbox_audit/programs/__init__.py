"""The audit's helper programs, kept as real files so ruff and mypy check them.

Each file is run, never imported: Python programs by an interpreter (`python -c TEXT`, or
prepended to an attack's body), shell files by bash. `program_text` reads one of them
through `importlib.resources`, so they also work from an installed wheel.
"""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def program_text(name: str) -> str:
    """The source of the helper program ``name`` (e.g. ``"victim.py"``)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
