"""The vocabulary of confinement: modes, enforcement levels, network modes, and escalation."""

from __future__ import annotations

import enum
from types import MappingProxyType


class SandboxMode(enum.StrEnum):
    """What a confined command may change."""

    READ_ONLY = "read-only"
    WORKSPACE_WRITE = "workspace-write"
    DANGER_FULL_ACCESS = "danger-full-access"

    @classmethod
    def _missing_(cls, value: object) -> SandboxMode:
        known = ", ".join(m.value for m in cls)
        raise ValueError(f"unknown sandbox mode {value!r}; expected one of: {known}")


class SandboxEnforcement(enum.StrEnum):
    """Whether every right the mode relies on was enforced on this host."""

    FULL = "full"
    PARTIAL = "partial"


class NetworkMode(enum.StrEnum):
    """Which network a confined command sees."""

    ISOLATED = "isolated"
    HOST = "host"

    @classmethod
    def _missing_(cls, value: object) -> NetworkMode:
        raise ValueError(f"unknown network mode {value!r}; expected 'isolated' or 'host'")


# Each mode maps to the modes a user may escalate it to, narrowest first.
WIDER_MODES: MappingProxyType[SandboxMode, tuple[SandboxMode, ...]] = MappingProxyType(
    {
        SandboxMode.READ_ONLY: (SandboxMode.WORKSPACE_WRITE, SandboxMode.DANGER_FULL_ACCESS),
        SandboxMode.WORKSPACE_WRITE: (SandboxMode.DANGER_FULL_ACCESS,),
        SandboxMode.DANGER_FULL_ACCESS: (),
    }
)


def is_strictly_wider(target: SandboxMode | str, current: SandboxMode | str) -> bool:
    """True when ``target`` grants more than ``current`` (an escalation, not a lateral move)."""
    return SandboxMode(target) in WIDER_MODES[SandboxMode(current)]


def sandbox_denial_marker(mode: SandboxMode | str) -> str:
    """The line a harness shows (and matches) when a command hit the file sandbox."""
    return f"[sandbox: file access denied under {SandboxMode(mode).value} mode]"


def network_denial_marker() -> str:
    """The line a harness shows (and matches) when the isolated network refused a command."""
    return "[sandbox: network access denied under isolated network]"
