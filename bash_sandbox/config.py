"""`SandboxBashConfig`: the local executor's config plus what to confine and with which backend."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictStr, field_validator

from bash_local.config import LocalBashConfig, PositiveInt
from bash_seam import AbsolutePath
from policies import DEFAULT_PROTECTED_PATHS, NetworkMode, ResourceLimits, SandboxMode
from policies.egress import canonical_allowlist

BackendName = Literal["auto", "bwrap", "landlock", "seatbelt"]


class SandboxBashConfig(LocalBashConfig):
    """Defaults for every confined call; a request may override the mode or the whole policy."""

    mode: SandboxMode = SandboxMode.READ_ONLY
    workspace_root: AbsolutePath | None = None
    network: NetworkMode = NetworkMode.ISOLATED
    backend: BackendName = "auto"
    # An operator-asserted bwrap-compatible runner (argv prefix) and its fatal stderr lines.
    runner_command: list[StrictStr] = Field(default_factory=list)
    runner_failure_signatures: list[StrictStr] = Field(default_factory=list)
    probe_timeout_ms: PositiveInt = 5_000
    writable_roots: tuple[str, ...] = ()
    protected_paths: tuple[str, ...] = DEFAULT_PROTECTED_PATHS
    deny_read: tuple[str, ...] | None = None  # None: the policy's default credential stores
    # Egress allowlist (served by the executor's proxy under `isolated`) and named host sockets.
    allow_domains: tuple[str, ...] = ()
    allow_unix_sockets: tuple[str, ...] = ()
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    # workspace-write: the tools' cache variables point at the sandbox's own cache home.
    tool_caches: bool = True
    # Spawn confined commands through a per-executor helper process instead of forking the
    # harness (`linux/spawn_helper.py`); off by default (a measured prototype, see docs).
    spawn_helper: bool = False

    @field_validator("allow_domains")
    @classmethod
    def _egress_rules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # As `SandboxPolicy` does: the list is stamped on every policy without revalidation.
        return canonical_allowlist(value)
