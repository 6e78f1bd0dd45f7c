"""`LocalBashConfig`: limits and defaults of the local executor, validated at construction."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

PositiveInt = Annotated[StrictInt, Field(gt=0)]


class LocalBashConfig(BaseModel):
    """Defaults and caps. Unknown fields and non-positive numbers are rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cwd: str | None = None
    timeout_ms: PositiveInt = 120_000
    max_timeout_ms: PositiveInt = 600_000
    max_output_bytes: PositiveInt = 64_000
    max_spill_bytes: PositiveInt = 64 * 1024 * 1024
    grace_ms: PositiveInt = 3_000
    spill_dir: str | None = None

    @field_validator("cwd", "spill_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or "\x00" in value):
            raise ValueError(f"must be an absolute path, got {value!r}")
        return value
