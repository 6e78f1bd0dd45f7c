"""`SandboxBashConfig`: the local executor's config plus what to confine and with which backend."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictStr, field_validator

from bash_local.config import LocalBashConfig, PositiveInt
from bash_seam import AbsolutePath
from policies import DEFAULT_PROTECTED_PATHS, NetworkMode, ResourceLimits, SandboxMode
from policies.egress import (
    EgressCredential,
    canonical_allowlist,
    canonical_pins,
    canonical_private_domains,
)

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
    # Default protected names commands may write after all (e.g. ".vscode"): `policies.autorun`.
    unprotected_paths: tuple[str, ...] = ()
    # The workspace files installed git hooks run (husky, pre-commit, lefthook) stay read-only.
    protect_hook_chain: bool = True
    deny_read: tuple[str, ...] | None = None  # None: the policy's default credential stores
    # Egress allowlist (served by the executor's proxy under `isolated`) and named host sockets.
    allow_domains: tuple[str, ...] = ()
    # Names whose private-range DNS answers the proxy may use (never loopback or metadata).
    allow_private_domains: tuple[str, ...] = ()
    # The operator's own answers, used whatever their range: `pin`, then the hosts file
    # (None or "": not read); DNS for every other name.
    pin: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    hosts_file: AbsolutePath | None = "/etc/hosts"
    allow_unix_sockets: tuple[str, ...] = ()
    # Secrets the egress proxy injects on requests to their domain (each domain must be in
    # allow_domains); commands see placeholders only. See `bash_sandbox.egress.credentials`.
    credentials: tuple[EgressCredential, ...] = ()
    # Where `start(publish=...)` listens on the host: loopback unless the operator says so.
    publish_host: StrictStr = "127.0.0.1"
    # Publish on the port number asked for (when free) instead of a free one; see
    # `bash_sandbox.publish` for why that is the operator's choice only.
    publish_same_port: bool = False
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    # workspace-write: the tools' cache variables point at the sandbox's own cache home.
    tool_caches: bool = True
    # Spawn confined commands through a per-executor helper process instead of forking the
    # harness (`linux/spawn_helper.py`): the loop never blocks on a fork, and a large harness
    # costs nothing per command. Off: fork the harness per command (what a one-shot
    # `bash-sandbox run` does unless its config says otherwise: one command does not repay
    # the helper's start).
    spawn_helper: bool = True
    # workspace-write: keep the placeholder directories of missing auto-run names this long
    # after the executor's last command let them go, for its next command to take over
    # (`placeholder_linger.py`); the user sees the empty directories that long. 0: removed
    # as soon as no command holds them. A danger-full-access command never sees them.
    placeholder_linger_ms: int = Field(default=0, ge=0, le=600_000)

    @field_validator("allow_domains")
    @classmethod
    def _egress_rules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # As `SandboxPolicy` does: the list is stamped on every policy without revalidation.
        return canonical_allowlist(value)

    @field_validator("allow_private_domains")
    @classmethod
    def _private_domains(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return canonical_private_domains(value)

    @field_validator("pin", mode="before")
    @classmethod
    def _pins(cls, value: object) -> object:
        # One address or a list of them per name; canonical (and checked) here.
        if not isinstance(value, dict):
            return value
        return canonical_pins(value)

    @field_validator("hosts_file", mode="before")
    @classmethod
    def _no_hosts_file(cls, value: object) -> object:
        # TOML has no null: `hosts_file = ""` (or `--hosts-file ''`) reads no hosts file.
        return None if value == "" else value

    @field_validator("publish_host")
    @classmethod
    def _publish_address(cls, value: str) -> str:
        import ipaddress

        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"publish_host must be an IP address, got {value!r}") from None
