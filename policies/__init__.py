"""What a confined command may do: modes, the per-call policy, session overrides, escalation."""

from policies.errors import PolicyError, SessionLogError
from policies.jsonl_log import JsonlSessionLog
from policies.limits import LimitExceeded, ResourceLimits
from policies.log_location import SESSION_LOG_IN_WRITABLE_ROOT, check_session_log_location
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
    DEFAULT_DENY_READ_HOST,
    DEFAULT_DENY_READ_RELATIVE,
    DEFAULT_PROTECTED_PATHS,
    SandboxPolicy,
    default_deny_read,
    host_secrets,
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
    "DEFAULT_DENY_READ_HOST",
    "DEFAULT_DENY_READ_RELATIVE",
    "DEFAULT_PROTECTED_PATHS",
    "SANDBOX_MODE_EVENT_TYPE",
    "SESSION_LOG_IN_WRITABLE_ROOT",
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
    "SessionLogError",
    "check_session_log_location",
    "default_deny_read",
    "effective_sandbox_mode",
    "host_secrets",
    "is_strictly_wider",
    "network_denial_marker",
    "sandbox_denial_marker",
    "set_sandbox_mode",
]
