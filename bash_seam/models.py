"""The seam's vocabulary: request, resolved spec, results, facts, and background reads."""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, StrictStr, field_validator

from bash_seam.abort import AbortSignal
from policies import LimitExceeded, NetworkMode, SandboxEnforcement, SandboxMode, SandboxPolicy
from policies.types import PositiveInt

DSH_ENV_PREFIX = "DSH_"


def _check_command(value: str) -> str:
    if "\x00" in value:
        raise ValueError("command contains a NUL byte")
    return value


def _check_env(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return None
    for name, val in value.items():
        if not name or "=" in name or "\x00" in name:
            raise ValueError(f"invalid environment variable name {name!r}")
        if "\x00" in val:
            raise ValueError(f"environment variable {name} contains a NUL byte")
    return value


class BashExecRequest(BaseModel):
    """What a caller asks for; `None` means "use the executor's default"."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    command: StrictStr
    workdir: StrictStr | None = None
    timeout_ms: PositiveInt | None = None
    stdout_max_bytes: PositiveInt | None = None
    signal: AbortSignal | None = None
    stdin: StrictStr | bytes | None = None
    env: dict[StrictStr, StrictStr] | None = None
    dsh_env: dict[StrictStr, StrictStr] | None = None
    owner: StrictStr | None = None
    sandbox_mode: SandboxMode | None = None
    sandbox_policy: SandboxPolicy | None = None

    _command = field_validator("command")(_check_command)
    _env = field_validator("env", "dsh_env")(_check_env)


class BashExecSpec(BaseModel):
    """A fully resolved request: what `run()`/`start()` execute, with nothing left to default."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    command: StrictStr
    workdir: StrictStr
    timeout_ms: PositiveInt
    stdout_max_bytes: PositiveInt
    owner: StrictStr | None
    sandbox_policy: SandboxPolicy | None
    signal: AbortSignal | None = None
    stdin: StrictStr | bytes | None = None
    env: dict[StrictStr, StrictStr] | None = None
    dsh_env: dict[StrictStr, StrictStr] | None = None

    _command = field_validator("command")(_check_command)
    _env = field_validator("env", "dsh_env")(_check_env)


class CollectedOutput(BaseModel):
    """One stream: its tail when truncated, and the private spill file holding all of it."""

    model_config = ConfigDict(frozen=True)

    text: str
    truncated: bool = False
    spill_path: str | None = None


class DenialKind(enum.StrEnum):
    """What a confined command was refused."""

    FILE_WRITE = "file-write"
    FILE_READ = "file-read"
    SOCKET = "socket"  # a unix socket or a socket family outside the policy
    NETWORK_CONNECT = "network-connect"
    NETWORK_RESOLVE = "network-resolve"


class DenialEvidence(enum.StrEnum):
    """Who saw the refusal. Only `inferred` comes from the command's own output."""

    SUPERVISOR = "supervisor"  # the executor's seccomp supervisor refused the syscall
    OVERLAY = "overlay"  # a write the git control plane discarded (found in its upper dir)
    PROXY = "proxy"  # the egress proxy refused the destination
    KERNEL = "kernel"  # a kernel record (e.g. Landlock audit) named the access
    INFERRED = "inferred"  # an error message naming a path, checked against the policy


class SandboxDenial(BaseModel):
    """One refused operation: what, where, why, and who saw it."""

    model_config = ConfigDict(frozen=True)

    kind: DenialKind
    target: str  # a path, `host:port`, a socket path, or a socket family
    operation: str | None = None  # e.g. "open", "mkdir", "connect", "socket(AF_VSOCK)"
    reason: str  # why the policy refuses it, e.g. "outside the writable roots"
    evidence: DenialEvidence


class SandboxFacts(BaseModel):
    """What confinement did for one command; `None` fields mean "unconfined".

    ``denials`` lists the first refusals (bounded); ``denials_total`` counts all of them.
    ``denied`` and ``network_denied`` keep their contract meaning: the run failed (nonzero
    exit, no signal) and at least one file/socket, resp. network, denial explains it.
    """

    model_config = ConfigDict(frozen=True)

    mode: SandboxMode
    denied: bool
    enforcement: SandboxEnforcement | None
    runner_failed: bool = False
    backend: str | None = None
    network: NetworkMode | None = None
    network_denied: bool = False
    denials: tuple[SandboxDenial, ...] = ()
    denials_total: int = 0
    # A limit that stopped the command, if any, and how this host enforces the limits.
    limit_exceeded: LimitExceeded | None = None
    limits_enforcement: SandboxEnforcement | None = None
    # Git repositories the command created (reset to git's default control plane after the
    # command) and gitlinks it added to an index.
    nested_repositories: tuple[str, ...] = ()
    # Loud notes about a degraded or interrupted confinement (never silent).
    warnings: tuple[str, ...] = ()


class BashRunResult(BaseModel):
    """How a foreground command ended. A timeout or abort is a result, not an exception."""

    model_config = ConfigDict(frozen=True)

    exit_code: int | None
    signal: str | None
    timed_out: bool
    aborted: bool
    timeout_ms: int
    stdout: CollectedOutput
    stderr: CollectedOutput
    sandbox: SandboxFacts | None = None


class BashProcessRead(BaseModel):
    """New output of a background process since the previous read."""

    model_config = ConfigDict(frozen=True)

    delta: str
    lossy: bool = False
    stdout_spill_path: str | None = None
    stderr_spill_path: str | None = None
