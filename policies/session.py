"""Per-session sandbox-mode overrides: the event, the fold and the setter.

A session is anything with ``.events`` (a sequence) and ``.append(event)``. The override is
not stored as state: it is *folded* from the session's events each time, so a replayed log
and a live session always agree on the mode.

Event shape: ``{"type": "bash/sandbox-mode", "mode": "<mode>"}`` (plain dicts, so JSON logs
stay simple) or a `SandboxModeEvent`. Every other event is ignored by the fold.

Untrusted overrides: a sandbox-mode event whose mode is not a known `SandboxMode` (a
hand-edited log, a newer writer, corruption) is *skipped* with a warning on the
``"policies"`` logger; the fold never raises. Skipping means the last event that *can* be
verified stays in force: an unreadable event can neither widen nor narrow the mode.
`set_sandbox_mode` never writes such an event.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from policies.modes import SandboxMode

logger = logging.getLogger("policies")

SANDBOX_MODE_EVENT_TYPE = "bash/sandbox-mode"

_VALID_MODES = ", ".join(m.value for m in SandboxMode)


class SandboxModeEvent(BaseModel):
    """One per-session override: from this event on, commands run under ``mode``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["bash/sandbox-mode"] = "bash/sandbox-mode"
    mode: SandboxMode


@runtime_checkable
class Session(Protocol):
    """Anything that holds a session's events and can record one more."""

    @property
    def events(self) -> Sequence[Any]: ...

    def append(self, event: Any, /) -> None: ...


class InMemorySession:
    """A session kept in a list: for tests and harnesses that persist nothing."""

    def __init__(self, events: Iterable[Any] = (), *, cwd: str | None = None) -> None:
        self.events: list[Any] = list(events)
        # Optional: `SandboxPolicyService.resolve` uses a session's cwd as its workspace root.
        self.cwd = cwd

    def append(self, event: Any, /) -> None:
        self.events.append(event)

    def __repr__(self) -> str:
        return f"InMemorySession(events={len(self.events)}, cwd={self.cwd!r})"


def _event_mode(event: object, index: int) -> SandboxMode | None:
    """The mode a sandbox-mode event sets, or None when ``event`` is not a usable one."""
    if isinstance(event, SandboxModeEvent):
        return event.mode
    if not isinstance(event, Mapping) or event.get("type") != SANDBOX_MODE_EVENT_TYPE:
        return None
    raw = event.get("mode")
    if isinstance(raw, str):
        with contextlib.suppress(ValueError):
            return SandboxMode(raw)
    logger.warning(
        "ignoring sandbox-mode event #%d with unknown mode %r (expected one of: %s)",
        index,
        raw,
        _VALID_MODES,
    )
    return None


def effective_sandbox_mode(events: Iterable[object]) -> SandboxMode | None:
    """The session's override: the mode of the last valid sandbox-mode event, else None.

    Other events are ignored; sandbox-mode events with an unknown mode are skipped with a
    warning (see the module docstring). Never raises.
    """
    effective: SandboxMode | None = None
    for index, event in enumerate(events):
        mode = _event_mode(event, index)
        if mode is not None:
            effective = mode
    return effective


def set_sandbox_mode(session: Session, mode: SandboxMode | str) -> SandboxMode:
    """Record a per-session override on ``session``; returns the validated mode.

    Appends exactly one ``{"type": "bash/sandbox-mode", "mode": ...}`` dict. An unknown mode
    raises `ValueError` naming the valid modes, and nothing is appended.
    """
    try:
        validated = SandboxMode(mode)
    except ValueError:
        raise ValueError(
            f"cannot set sandbox mode {mode!r}: expected one of: {_VALID_MODES}"
        ) from None
    session.append({"type": SANDBOX_MODE_EVENT_TYPE, "mode": validated.value})
    return validated
