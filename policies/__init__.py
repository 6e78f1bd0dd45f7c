"""What a confined command may do: modes, the per-call policy, session overrides, escalation."""

from policies.errors import PolicyError
from policies.jsonl_log import JsonlSessionLog
from policies.limits import LimitExceeded, ResourceLimits
from policies.modes import (
    WIDER_MODES,
    NetworkMode,
    SandboxEnforcement,
    SandboxMode,
    is_strictly_wider,
    network_denial_marker,
    sandbox_denial_marker,
)
from policies.policy import (
    DEFAULT_PROTECTED_PATHS,
    SandboxPolicy,
    default_deny_read,
)
from policies.service import SandboxPolicyService
from policies.session import (
    SANDBOX_MODE_EVENT_TYPE,
    InMemorySession,
    SandboxModeEvent,
    Session,
    effective_sandbox_mode,
    set_sandbox_mode,
)

__all__ = [
    "DEFAULT_PROTECTED_PATHS",
    "SANDBOX_MODE_EVENT_TYPE",
    "WIDER_MODES",
    "InMemorySession",
    "JsonlSessionLog",
    "LimitExceeded",
    "NetworkMode",
    "PolicyError",
    "ResourceLimits",
    "SandboxEnforcement",
    "SandboxMode",
    "SandboxModeEvent",
    "SandboxPolicy",
    "SandboxPolicyService",
    "Session",
    "default_deny_read",
    "effective_sandbox_mode",
    "is_strictly_wider",
    "network_denial_marker",
    "sandbox_denial_marker",
    "set_sandbox_mode",
]
