"""Whether a path lies at or below a directory: the one spelling every package uses.

Lexical, on canonical paths: callers resolve (`os.path.realpath`) first where the host's
symlinks matter; ``/a/bc`` is not within ``/a/b``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def within(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def within_any(path: str, roots: Iterable[str]) -> bool:
    return any(within(path, r) for r in roots)


def within_set(path: str, tops: set[str]) -> bool:
    """`within_any` for many roots at once: a set lookup per ancestor of ``path`` (a home's
    spawn has some 200 covers and 60 denied names)."""
    while path not in ("/", ""):
        if path in tops:
            return True
        path = os.path.dirname(path)
    return False
