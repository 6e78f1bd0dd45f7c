"""`ResourceLimits`: how much of the host one confined command may take.

The numbers are per command (its whole process tree). `None` means "no limit of this kind".
How each limit is enforced (cgroups, rlimits, tmpfs sizes) is the sandbox's business; this
module only says what is asked for.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt

_MiB = 1024 * 1024
_GiB = 1024 * _MiB

PositiveLimit = Annotated[StrictInt, Field(gt=0)]


class ResourceLimits(BaseModel):
    """Per-command limits; defaults no ordinary build or test suite hits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_bytes: PositiveLimit | None = 8 * _GiB
    processes: PositiveLimit | None = 4096
    # CPU time share as a number of cores (1.5 = one and a half cores), None: unlimited.
    cpu_cores: Annotated[float, Field(gt=0)] | None = None
    tmp_bytes: PositiveLimit = 4 * _GiB
    shm_bytes: PositiveLimit = 1 * _GiB
    open_files: PositiveLimit | None = 65536
