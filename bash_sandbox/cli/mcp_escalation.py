"""What a model may widen through the MCP server, and where a remembered widening is kept.

The server starts at the configured mode and network (or the session log's override). A call
may ask for a wider mode (`sandbox_mode`) or the host network (`network`) only when the
operator set a ceiling (`--allow-escalation-to MODE`, `--allow-network-escalation`):

- nothing asked, or something no wider than now: the call runs as asked, no question;
- wider, but above the ceiling (or with no ceiling at all): refused, nothing runs;
- wider and within the ceiling: the user is asked first (see `mcp_approval`).

"Wider" is `policies.is_strictly_wider` for modes; for the network, `host` is wider than
`isolated`. A remembered widening (the user ticked "for this session") is a
`bash/sandbox-mode` event in the `--session` log, which must lie where no confined command can
write it: outside the workspace and every writable root (threat model row 15).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from policies import NetworkMode, SandboxMode, is_strictly_wider
from policies.log_location import session_log_refusal


class EscalationError(Exception):
    """A call asked for more than the server may grant; nothing ran."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class EscalationCeiling(BaseModel):
    """The most a model may ask for, as the operator started the server."""

    model_config = ConfigDict(frozen=True)

    mode: SandboxMode | None = None  # None: no per-call mode at all
    network: NetworkMode = NetworkMode.ISOLATED

    def offers_mode(self, default: SandboxMode) -> bool:
        """Whether the tool schema advertises `sandbox_mode`: the ceiling is wider."""
        return self.mode is not None and is_strictly_wider(self.mode, default)

    def offers_network(self, default: NetworkMode) -> bool:
        """Whether the tool schema advertises `network`: `host` is allowed and not the default."""
        return self.network is NetworkMode.HOST and default is NetworkMode.ISOLATED

    def modes_offered(self, default: SandboxMode) -> tuple[SandboxMode, ...]:
        """The modes a call may name, narrowest first: up to the ceiling."""
        if self.mode is None:
            return ()
        ceiling = self.mode
        return tuple(m for m in SandboxMode if not is_strictly_wider(m, ceiling))


class Escalation(BaseModel):
    """How one call runs: its mode and network, and what of it needs the user's yes."""

    model_config = ConfigDict(frozen=True)

    mode: SandboxMode
    network: NetworkMode
    wider_mode: bool = False
    wider_network: bool = False

    @property
    def needs_approval(self) -> bool:
        return self.wider_mode or self.wider_network

    def describe(self) -> str:
        """The widening in words, for the question the user is asked."""
        parts: list[str] = []
        if self.wider_mode:
            parts.append(f"sandbox mode {self.mode.value}")
        if self.wider_network:
            parts.append("the host network")
        return " and ".join(parts)


def judge_escalation(
    ceiling: EscalationCeiling,
    *,
    current_mode: SandboxMode,
    current_network: NetworkMode,
    requested_mode: SandboxMode | None,
    requested_network: NetworkMode | None,
) -> Escalation:
    """Decide how a call runs; raises `EscalationError` when it asks above the ceiling."""
    mode = requested_mode if requested_mode is not None else current_mode
    network = requested_network if requested_network is not None else current_network
    wider_mode = is_strictly_wider(mode, current_mode)
    if wider_mode and (ceiling.mode is None or is_strictly_wider(mode, ceiling.mode)):
        limit = ceiling.mode.value if ceiling.mode is not None else current_mode.value
        raise EscalationError(
            f"sandbox_mode {mode.value} is above this server's ceiling ({limit}); "
            f"run the command under {current_mode.value}, or ask the user to restart the server "
            "with a higher --allow-escalation-to",
            "ESCALATION_ABOVE_CEILING",
        )
    wider_network = network is NetworkMode.HOST and current_network is NetworkMode.ISOLATED
    if mode is SandboxMode.DANGER_FULL_ACCESS:
        wider_network = False  # unconfined: the network is the host's anyway, no second question
    elif wider_network and ceiling.network is not NetworkMode.HOST:
        raise EscalationError(
            "network host is above this server's ceiling (isolated); the sandbox only has its "
            "own loopback, or ask the user to restart the server with --allow-network-escalation",
            "ESCALATION_ABOVE_CEILING",
        )
    return Escalation(
        mode=mode, network=network, wider_mode=wider_mode, wider_network=wider_network
    )


def check_session_log_location(path: str, writable_roots: Iterable[str]) -> str:
    """The session log's canonical path; raises `EscalationError` when a command could write
    it (`policies.session_log_refusal`, the one check). ``writable_roots`` are every root a
    confined command may write (the workspace included)."""
    refusal = session_log_refusal(path, writable_roots)
    if refusal is not None:
        raise EscalationError(
            f"{refusal}. Put the log outside the workspace and every writable root (e.g. under "
            "~/.local/state)",
            "SESSION_LOG_UNSAFE",
        )
    return os.path.realpath(os.path.abspath(os.path.expanduser(path)))
