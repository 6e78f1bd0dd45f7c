"""Whether a path lies at or below a directory: the one spelling every package uses.

Lexical, on canonical paths: callers resolve (`os.path.realpath`) first where the host's
symlinks matter; ``/a/bc`` is not within ``/a/b``.
"""

from __future__ import annotations

from collections.abc import Iterable


def within(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def within_any(path: str, roots: Iterable[str]) -> bool:
    return any(within(path, r) for r in roots)
