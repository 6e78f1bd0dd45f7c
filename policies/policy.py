"""The complete, frozen per-call `SandboxPolicy` and its defaults."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policies.autorun import DEFAULT_AUTORUN_PATHS
from policies.dir_glob import expand
from policies.egress import canonical_allowlist
from policies.limits import ResourceLimits
from policies.modes import NetworkMode, SandboxMode
from policies.paths import within
from policies.types import CanonicalPath, NormalPath, UserCanonicalPath

# Kept read-only inside every writable root, so `git commit` works while hooks and config
# (both run code on the user's next git command) cannot be planted; and the files editors,
# direnv, agent tools and shells run on their own (`autorun.py`).
DEFAULT_PROTECTED_PATHS: tuple[str, ...] = (".git/hooks", ".git/config", *DEFAULT_AUTORUN_PATHS)

# Credential stores under the user's home that no confined command may read: the one list.
# An entry with `*` is a glob, expanded each time a default is built; the names it usually
# matches are listed too, so a file created later is denied as well.
DEFAULT_DENY_READ_RELATIVE: tuple[str, ...] = (
    # keys and cloud credentials
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".oci",
    ".config/doctl",
    ".kube",
    ".docker",  # the whole dir: config.json holds auths, and rootless docker's socket lives here
    ".config/containers/auth.json",
    ".terraform.d",
    ".vault-token",
    ".s3cfg",
    ".boto",
    ".config/rclone",
    ".local/share/keyrings",
    ".password-store",
    # forges and git
    ".netrc",
    ".git-credentials",
    ".config/git/credentials",
    ".config/gh",
    ".config/hub",
    # package registries
    ".npmrc",
    ".yarnrc.yml",
    ".pypirc",
    ".config/pip/pip.conf",
    ".pip/pip.conf",
    ".cargo/credentials.toml",
    ".cargo/credentials",
    ".gem/credentials",
    ".m2/settings.xml",
    ".gradle/gradle.properties",
    ".composer/auth.json",
    ".config/composer/auth.json",
    ".nuget/NuGet/NuGet.Config",
    # databases
    ".pgpass",
    ".my.cnf",
    # model hubs
    ".cache/huggingface/token",
    ".huggingface/token",
    ".kaggle/kaggle.json",
    # shell and REPL histories: pasted tokens, `export X=...`, `mysql -p...`
    ".bash_history",
    ".zsh_history",
    ".histfile",
    ".sh_history",
    ".local/share/fish/fish_history",
    ".python_history",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
    ".node_repl_history",
    # coding agents: their API keys, OAuth tokens and the transcripts of every session
    ".claude",
    ".claude.json",
    ".config/claude",
    ".codex",
    ".gemini",
    ".aider",
    ".aider.conf.yml",
    ".aider.chat.history.md",
    ".aider.input.history",
    ".aider.model.settings.yml",
    ".aider.model.metadata.json",
    ".aider*",
    ".continue",
    ".cursor",
    ".config/Cursor",
    ".codeium",
    ".config/github-copilot",
    ".config/goose",
    ".local/share/opencode",
)

# Host secrets outside any home, part of every default `deny_read` (same glob rule).
DEFAULT_DENY_READ_HOST: tuple[str, ...] = (
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
    "/etc/ssh/ssh_host_*_key",
    "/etc/ssl/private",
    "/etc/pki/tls/private",
)


def host_secrets() -> tuple[str, ...]:
    """The host's own secrets, denied to every confined command whatever `deny_read` says."""
    return tuple(dict.fromkeys(p for pattern in DEFAULT_DENY_READ_HOST for p in expand(pattern)))


def default_deny_read(home: str | None = None) -> tuple[str, ...]:
    """The default `deny_read` list: the stores under ``home`` (default: the user's), then host.

    Glob entries are expanded now, against what exists; the rest are kept whether or not
    they exist (the backends look again at every spawn).
    """
    base = home if home is not None else os.path.expanduser("~")
    patterns = (*(os.path.join(base, rel) for rel in DEFAULT_DENY_READ_RELATIVE),)
    if home is None:
        patterns += _moved_stores(os.environ)
    patterns += DEFAULT_DENY_READ_HOST
    return tuple(dict.fromkeys(p for pattern in patterns for p in expand(pattern)))


# Where the environment moves a home's stores: the XDG base directories (gh, git's
# credentials, pip, keyrings under `$XDG_CONFIG_HOME` and `$XDG_DATA_HOME`), and tools' own
# variables naming a credential file or directory (a red team read them all there, with
# `enforcement: full`).
_XDG_BASES = {
    ".config/": "XDG_CONFIG_HOME",
    ".local/share/": "XDG_DATA_HOME",
    ".cache/": "XDG_CACHE_HOME",
}
_NAMED_STORES = (
    "PIP_CONFIG_FILE",
    "NPM_CONFIG_USERCONFIG",
    "npm_config_userconfig",
    "DOCKER_CONFIG",
    "KUBECONFIG",
    "GNUPGHOME",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "CLOUDSDK_CONFIG",
    "GH_CONFIG_DIR",
    "PASSWORD_STORE_DIR",
    "NETRC",
)
_NAMED_HOMES = {
    "CARGO_HOME": ("credentials.toml", "credentials"),
    "GRADLE_USER_HOME": ("gradle.properties",),
}


def _moved_stores(environ: Mapping[str, str]) -> tuple[str, ...]:
    found: list[str] = []
    for prefix, variable in _XDG_BASES.items():
        moved = environ.get(variable, "")
        if os.path.isabs(moved):
            found += [
                os.path.join(moved, rel.removeprefix(prefix))
                for rel in DEFAULT_DENY_READ_RELATIVE
                if rel.startswith(prefix)
            ]
    for variable in _NAMED_STORES:
        found += [p for p in environ.get(variable, "").split(os.pathsep) if os.path.isabs(p)]
    for variable, names in _NAMED_HOMES.items():
        moved = environ.get(variable, "")
        if os.path.isabs(moved):
            found += [os.path.join(moved, name) for name in names]
    return tuple(os.path.normpath(p) for p in found)


def root_through_a_link_in_a_root(named: tuple[str, ...]) -> str | None:
    """Why one of the roots ``named`` (as given: ``~`` allowed) is refused, or None: a root
    reached through a symlink that lies inside one of the roots (a command could have written
    that link: a root `ws/sub` that is a link to `/etc` would make `/etc` writable)."""
    # A relative path or one with a NUL is the field's own validator's to refuse, by name.
    given = [os.path.expanduser(p) for p in named if "\0" not in p]
    given = [os.path.normpath(p) for p in given if os.path.isabs(p)]
    reals = [os.path.realpath(p) for p in given]
    for path in given:
        prefix = "/"
        for part in path.strip("/").split("/"):
            prefix = os.path.join(prefix, part)
            if not os.path.islink(prefix):
                continue
            where = os.path.join(os.path.realpath(os.path.dirname(prefix)), part)
            # `/` holds everything and is never a root (a stand-in while a config is checked).
            holder = next((r for r in reals if r not in (where, "/") and within(where, r)), None)
            if holder is not None:
                return (
                    f"writable root {path} leads through the symlink {prefix} (to "
                    f"{os.path.realpath(prefix)}), which lies inside the writable root {holder}: "
                    "a command there could have planted it; name the directory it leads to "
                    "if you mean that one"
                )
    return None


@functools.lru_cache(maxsize=32)
def _checked_names(value: tuple[str, ...]) -> tuple[str, ...]:
    """``value`` normalised, each a name relative to a writable root (else ValueError).
    Cached: every policy checks the same 40-odd default names, a PurePosixPath each."""
    for v in value:
        p = PurePosixPath(v)
        if "\x00" in v or p.is_absolute() or ".." in p.parts or not p.parts:
            raise ValueError(f"entries are names relative to a writable root, got {v!r}")
    return tuple(str(PurePosixPath(v)) for v in value)


# Trees every confined command's view makes its own: a cover on the host's is no cover.
_OWN_TREES = ("/proc", "/dev")


class SandboxPolicy(BaseModel):
    """Everything a backend needs to confine one command; resolved, canonical and immutable.

    Semantics: the filesystem is readable except `deny_read`; nothing is writable in
    `read-only`; `workspace-write` adds `workspace_root`, `writable_roots` and a private
    `/tmp`; `protected_paths` (relative names) stay read-only inside every writable root,
    and win over the roots they sit in.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: SandboxMode
    workspace_root: CanonicalPath
    network: NetworkMode = NetworkMode.ISOLATED
    # `~/...` is the user's home; symlinks are resolved, so a root is confined by its real name.
    writable_roots: tuple[UserCanonicalPath, ...] = ()
    protected_paths: tuple[str, ...] = DEFAULT_PROTECTED_PATHS
    # Names taken out of `protected_paths` (e.g. ".vscode" to let commands edit its settings):
    # the opt-out of a default without restating the whole list.
    unprotected_paths: tuple[str, ...] = ()
    # Also keep read-only the workspace files installed git hooks run (husky, pre-commit,
    # lefthook, a `core.hooksPath` directory): editing one is editing the hook.
    protect_hook_chain: bool = True
    # Not resolved: the backends hide a denied symlink under both its names.
    deny_read: tuple[NormalPath, ...] = Field(default_factory=default_deny_read)
    # Destinations the egress proxy may reach under `isolated` (domains, `*.suffix`, `:port`).
    allow_domains: tuple[str, ...] = ()
    # Host unix sockets a confined command may connect to (absolute paths, `@name` abstract).
    allow_unix_sockets: tuple[str, ...] = ()
    limits: ResourceLimits = Field(default_factory=ResourceLimits)

    @field_validator("allow_domains")
    @classmethod
    def _egress_rules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Canonical text (lowercase, bracketed IPv6, no duplicates); a bad entry is named.
        return canonical_allowlist(value)

    @field_validator("protected_paths", "unprotected_paths")
    @classmethod
    def _relative_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _checked_names(tuple(value))

    @field_validator("deny_read")
    @classmethod
    def _no_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # A pattern would be taken as the literal name and deny nothing, silently (red
        # team: `ws/*.pem`). The defaults' patterns are expanded before they get here.
        for path in value:
            # A `*` in the last name, naming no existing file, is a pattern (a default's
            # expansion may name a real file whose name holds one).
            if "*" in os.path.basename(path) and not os.path.lexists(path):
                raise ValueError(
                    f"deny_read takes paths, not patterns: {path!r}; name the files, or "
                    "their directory (a denied directory covers what is made in it later)"
                )
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_root_through_a_link_in_a_root(cls, data: Any) -> Any:
        # Roots are kept by their real names; a root named through a symlink that lies in
        # another root is refused: a command there could have planted that link, and the
        # next call naming the root would make wherever it leads writable.
        writes = (SandboxMode.WORKSPACE_WRITE, SandboxMode.WORKSPACE_WRITE.value)
        if isinstance(data, dict) and data.get("mode") in writes:
            named = [data.get("workspace_root"), *(data.get("writable_roots") or ())]
            problem = root_through_a_link_in_a_root(tuple(p for p in named if isinstance(p, str)))
            if problem is not None:
                raise ValueError(problem)
        return data

    @model_validator(mode="after")
    def _a_view_that_can_be_built(self) -> SandboxPolicy:
        # What no backend can confine as asked is the request's error, never a spawn's
        # `SandboxUnavailableError` (that tells a harness the host cannot confine) nor a
        # silent gap (Landlock ignored a deny of `/` or in `/proc`; a red team's).
        roots = (self.workspace_root, *self.writable_roots)
        for path in self.deny_read:
            if path == "/" or any(within(path, top) for top in _OWN_TREES):
                raise ValueError(
                    f"deny_read cannot hide {path!r}: every command's view has its own /proc "
                    "and /dev, and / is the view itself; name the files to hide instead"
                )
            holder = next((r for r in roots if within(r, path)), None)
            if holder is not None:
                raise ValueError(
                    f"deny_read {path!r} would hide the root {holder} (a command could not "
                    "even enter it); name the secrets beside the root instead"
                )
        for root in self.writable_roots:
            if any(within(root, top) for top in (*_OWN_TREES, "/sys")):
                raise ValueError(f"writable root {root!r}: the kernel's own files, never a root")
            if os.path.lexists(root) and not os.path.isdir(root):
                raise ValueError(f"writable root {root!r} is not a directory")
        return self

    @model_validator(mode="after")
    def _unprotected_names(self) -> SandboxPolicy:
        if self.unprotected_paths:
            lifted = set(self.unprotected_paths)
            kept = tuple(p for p in self.protected_paths if p not in lifted)
            object.__setattr__(self, "protected_paths", kept)
        return self

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
