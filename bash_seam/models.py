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
    # Kept for old results: the command's own output, which it can forge. Output now makes
    # a `SandboxHint`, never a denial.
    INFERRED = "inferred"


class SandboxDenial(BaseModel):
    """One refused operation: what, where, why, and who saw it."""

    model_config = ConfigDict(frozen=True)

    kind: DenialKind
    target: str  # a path, `host:port`, a socket path, or a socket family
    operation: str | None = None  # e.g. "open", "mkdir", "connect", "socket(AF_VSOCK)"
    reason: str  # why the policy refuses it, e.g. "outside the writable roots"
    evidence: DenialEvidence


class HintSource(enum.StrEnum):
    """What a hint rests on. None of these is evidence of a refusal."""

    OUTPUT = "output"  # the command's own output named it (it could print anything)
    HOST_LISTENER = "host-listener"  # the host listens where the command connected


class SandboxHint(BaseModel):
    """Something the sandbox *may* have refused, pointed at but not witnessed.

    Never sets `denied`: printed text can be forged. ``relative``: ``target`` is a path as
    the tool printed it, relative to a directory the output does not say (the command may
    have changed directory), so it is not resolved.
    """

    model_config = ConfigDict(frozen=True)

    kind: DenialKind  # what it would be, were it a denial
    target: str
    relative: bool = False
    operation: str | None = None
    reason: str  # why the policy would refuse it, or what the host knows about it
    source: HintSource = HintSource.OUTPUT


class DenialGroup(BaseModel):
    """Denials of one kind, reason and place (a directory, a socket family, the network),
    counted, with the first few targets: what a harness shows instead of every line."""

    model_config = ConfigDict(frozen=True)

    kind: DenialKind
    reason: str
    place: str  # the directory of file targets; "" for network destinations
    evidence: DenialEvidence
    operation: str | None = None  # the first denial's
    count: int  # the denials seen in this group (sources bound what they keep)
    targets: tuple[str, ...]  # the first few distinct targets


class GitImportStatus(enum.StrEnum):
    """What became of one repository's git state after a command (see `GitImportOutcome`)."""

    APPLIED = "applied"  # every ref, the index, HEAD and the state files landed on the host
    CONFLICT = "conflict"  # the host changed or locked what the command changed: nothing applied
    REFUSED = "refused"  # the command's state failed git's validation: nothing applied
    PARTIAL = "partial"  # applied, but some of it could not be (named in ``refused``)


class GitRefConflict(BaseModel):
    """One name both sides changed: the host's value now and the command's."""

    model_config = ConfigDict(frozen=True)

    name: str  # a ref, `HEAD`, `index` or a lock file
    host: str | None  # an object id, `ref: <name>`, or None (absent / held lock)
    command: str | None


class GitImportOutcome(BaseModel):
    """One repository's import of the command's git state (never silent: a conflict or a
    refusal names what was kept where)."""

    model_config = ConfigDict(frozen=True)

    repository: str  # the host git directory
    status: GitImportStatus
    kept_at: str | None = None  # the ref prefix holding the command's commits, when not applied
    applied: tuple[str, ...] = ()  # refs, `HEAD`, `index`, state files that landed
    conflicts: tuple[GitRefConflict, ...] = ()
    refused: tuple[str, ...] = ()  # what failed validation, and why


class SandboxFacts(BaseModel):
    """What confinement did for one command; `None` fields mean "unconfined".

    ``denials`` lists the first refusals (bounded); ``denials_total`` counts all of them.
    A denial exists only on evidence the command cannot forge (supervisor, overlay, proxy,
    kernel); what its output merely says is a ``hint``.
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
    # The denials grouped (every one seen, not only the listed ones), for display.
    denial_groups: tuple[DenialGroup, ...] = ()
    # What the output or the host points at without evidence: never a denial (bounded).
    hints: tuple[SandboxHint, ...] = ()
    # A limit that stopped the command, if any, and how this host enforces the limits.
    limit_exceeded: LimitExceeded | None = None
    limits_enforcement: SandboxEnforcement | None = None
    # Git repositories the command created (reset to git's default control plane after the
    # command) and gitlinks it added to an index.
    nested_repositories: tuple[str, ...] = ()
    # Per repository whose git state the command changed: what the import did with it.
    git: tuple[GitImportOutcome, ...] = ()
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
    # The two streams of ``delta`` apart: a reader that marks a stream itself (the MCP
    # server's text) cannot otherwise tell the real `[stderr]` line from a printed one.
    stdout_delta: str = ""
    stderr_delta: str = ""
    stdout_spill_path: str | None = None
    stderr_spill_path: str | None = None
