"""`LocalBashConfig`: limits and defaults of the local executor, validated at construction."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from bash_seam import AbsolutePath, PositiveInt

# `bash_sandbox.config` takes its positive integers from here.
__all__ = ["LocalBashConfig", "PositiveInt"]


class LocalBashConfig(BaseModel):
    """Defaults and caps. Unknown fields, relative paths and non-positive numbers are rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cwd: AbsolutePath | None = None
    timeout_ms: PositiveInt = 120_000
    max_timeout_ms: PositiveInt = 600_000
    max_output_bytes: PositiveInt = 64_000
    max_spill_bytes: PositiveInt = 64 * 1024 * 1024
    grace_ms: PositiveInt = 3_000
    spill_dir: AbsolutePath | None = None
