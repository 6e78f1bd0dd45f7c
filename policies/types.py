"""The validated value types every layer shares: absolute paths and positive integers.

Each rule is written once here; models use the annotated types, and code that checks a path
outside a model (the policy service's roots) calls `require_absolute_path`. Messages are
written to follow the name of the value (pydantic puts the field name in front of them).

- `AbsolutePath`: text, no NUL byte, absolute; kept as given.
- `NormalPath`: ``~`` expanded for the user, then `AbsolutePath`, then ``..`` and ``//``
  folded lexically (symlinks are *not* resolved: a denied symlink stays denied by its name).
- `CanonicalPath`: `AbsolutePath` with symlinks and ``..`` resolved (`os.path.realpath`).
- `UserCanonicalPath`: ``~`` expanded for the user, then `CanonicalPath`.
- `PositiveInt`: a strict ``int`` greater than zero (``True`` and ``1.0`` are refused).
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, StrictInt


def require_absolute_path(value: str) -> str:
    """``value`` unchanged when it is an absolute path without NUL bytes, else `ValueError`."""
    if "\x00" in value:
        # The kernel would cut the path at the NUL, silently naming another file.
        raise ValueError(f"contains a NUL byte: {value!r}")
    if not os.path.isabs(value):
        # Resolving against the process cwd would silently name the wrong directory.
        raise ValueError(f"must be an absolute path, got {value!r}")
    return value


def _expand_user(value: object) -> object:
    # Only text is expanded; anything else reaches pydantic's own type check unchanged.
    return os.path.expanduser(value) if isinstance(value, str) else value


PositiveInt = Annotated[StrictInt, Field(gt=0)]

AbsolutePath = Annotated[str, AfterValidator(require_absolute_path)]

NormalPath = Annotated[
    str,
    BeforeValidator(_expand_user),
    AfterValidator(require_absolute_path),
    AfterValidator(os.path.normpath),
]

CanonicalPath = Annotated[
    str, AfterValidator(require_absolute_path), AfterValidator(os.path.realpath)
]

UserCanonicalPath = Annotated[
    str,
    BeforeValidator(_expand_user),
    AfterValidator(require_absolute_path),
    AfterValidator(os.path.realpath),
]
