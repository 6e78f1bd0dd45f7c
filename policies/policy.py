"""The complete, frozen per-call `SandboxPolicy` and its defaults."""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policies.egress import canonical_allowlist
from policies.limits import ResourceLimits
from policies.modes import NetworkMode, SandboxMode

# Kept read-only inside every writable root, so `git commit` works while hooks and config
# (both run code on the user's next git command) cannot be planted.
DEFAULT_PROTECTED_PATHS: tuple[str, ...] = (".git/hooks", ".git/config")

# Credential stores under the user's home that no confined command may read.
DEFAULT_DENY_READ_RELATIVE: tuple[str, ...] = (
    ".ssh",
    ".aws",
    ".gnupg",
    ".netrc",
    ".docker/config.json",
    ".kube",
    ".git-credentials",
    ".config/gh",
    ".config/gcloud",
    ".azure",
    ".pypirc",
    ".npmrc",
)


def default_deny_read(home: str | None = None) -> tuple[str, ...]:
    """The default `deny_read` list, absolute under ``home`` (default: the user's home)."""
    base = home if home is not None else os.path.expanduser("~")
    return tuple(os.path.join(base, rel) for rel in DEFAULT_DENY_READ_RELATIVE)


def canonical_path(path: str, *, field: str) -> str:
    """An absolute path with symlinks and `..` resolved; relative paths are an error."""
    if "\x00" in path:
        raise ValueError(f"{field} contains a NUL byte")
    if not os.path.isabs(path):
        raise ValueError(f"{field} must be an absolute path, got {path!r}")
    return os.path.realpath(path)


class SandboxPolicy(BaseModel):
    """Everything a backend needs to confine one command; resolved, canonical and immutable.

    Semantics: the filesystem is readable except `deny_read`; nothing is writable in
    `read-only`; `workspace-write` adds `workspace_root`, `writable_roots` and a private
    `/tmp`; `protected_paths` (relative names) stay read-only inside every writable root,
    and win over the roots they sit in.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: SandboxMode
    workspace_root: str
    network: NetworkMode = NetworkMode.ISOLATED
    writable_roots: tuple[str, ...] = ()
    protected_paths: tuple[str, ...] = DEFAULT_PROTECTED_PATHS
    deny_read: tuple[str, ...] = Field(default_factory=default_deny_read)
    # Destinations the egress proxy may reach under `isolated` (domains, `*.suffix`, `:port`).
    allow_domains: tuple[str, ...] = ()
    # Host unix sockets a confined command may connect to (absolute paths, `@name` abstract).
    allow_unix_sockets: tuple[str, ...] = ()
    limits: ResourceLimits = Field(default_factory=ResourceLimits)

    @field_validator("workspace_root")
    @classmethod
    def _canonical_root(cls, value: str) -> str:
        return canonical_path(value, field="workspace_root")

    @field_validator("writable_roots")
    @classmethod
    def _canonical_roots(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(canonical_path(v, field="writable_roots") for v in value)

    @field_validator("allow_domains")
    @classmethod
    def _egress_rules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Canonical text (lowercase, bracketed IPv6, no duplicates); a bad entry is named.
        return canonical_allowlist(value)

    @field_validator("deny_read")
    @classmethod
    def _absolute_deny(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Not resolved: a denied path that is a symlink is hidden under both names.
        out: list[str] = []
        for v in value:
            expanded = os.path.expanduser(v)
            if "\x00" in expanded or not os.path.isabs(expanded):
                raise ValueError(f"deny_read entries must be absolute paths, got {v!r}")
            out.append(os.path.normpath(expanded))
        return tuple(out)

    @field_validator("protected_paths")
    @classmethod
    def _relative_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for v in value:
            p = PurePosixPath(v)
            if "\x00" in v or p.is_absolute() or ".." in p.parts or not p.parts:
                raise ValueError(
                    f"protected_paths entries are names relative to a writable root, got {v!r}"
                )
        return tuple(str(PurePosixPath(v)) for v in value)

    @model_validator(mode="after")
    def _network_follows_mode(self) -> SandboxPolicy:
        # danger-full-access is unconfined: it always sees the host network.
        if self.mode is SandboxMode.DANGER_FULL_ACCESS and self.network is not NetworkMode.HOST:
            object.__setattr__(self, "network", NetworkMode.HOST)
        return self

    @property
    def confined(self) -> bool:
        return self.mode is not SandboxMode.DANGER_FULL_ACCESS

    def all_writable_roots(self) -> tuple[str, ...]:
        """Workspace plus extra roots (deduplicated, in order); empty unless workspace-write."""
        if self.mode is not SandboxMode.WORKSPACE_WRITE:
            return ()
        seen: dict[str, None] = {}
        for root in (self.workspace_root, *self.writable_roots):
            seen.setdefault(root, None)
        return tuple(seen)
