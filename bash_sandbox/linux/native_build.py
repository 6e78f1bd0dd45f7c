"""The package's compiled parts (`native/*.c`): the build next to the package, used only
when it was built from the source beside it.

The package's build compiles them (`setup.py`, optional extensions: the install goes on
without a C compiler), as trusted as the Python beside them; nothing is compiled at run
time. Each build has its source's hash compiled in: an editable install whose C file
changed since (its struct layouts may differ) is not used until it is reinstalled.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent


def checked_build(stem: str, source: Path, symbol: str) -> tuple[Path, ctypes.CDLL] | None:
    """The build ``stem`` (loaded) if its ``symbol`` names ``source``'s hash, else None."""
    path = next(
        (
            HERE / (stem + suffix)
            for suffix in importlib.machinery.EXTENSION_SUFFIXES
            if (HERE / (stem + suffix)).is_file()
        ),
        None,
    )
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path), use_errno=True)
        getattr(lib, symbol).restype = ctypes.c_char_p
        compiled_for = getattr(lib, symbol)().decode()
    except (OSError, AttributeError) as exc:
        logger.warning("%s not loaded: %s", path.name, exc)
        return None
    if source.is_file() and compiled_for != hashlib.sha256(source.read_bytes()).hexdigest():
        logger.warning(
            "%s not loaded: it was built from another %s (reinstall the package to rebuild it)",
            path,
            source.name,
        )
        return None
    return path, lib
