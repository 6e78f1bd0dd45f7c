"""`SandboxPolicyService`: turns configuration, a session and a call into one `SandboxPolicy`.

Mode precedence, strongest first:

1. the ``mode`` argument: an escalation the user approved for this call;
2. the session's override (`effective_sandbox_mode` of its events);
3. the configured default.

Workspace root precedence, strongest first:

1. the ``cwd`` argument: the caller named this call's directory explicitly;
2. the session's ``cwd`` attribute, when the session has one and it is not None;
3. the configured ``workspace_root``;
4. the process's current directory.

The chosen root must be absolute and an existing directory; it is canonicalised with
`os.path.realpath`, so a symlinked root is confined under its real name.

A session that is a log on disk (it has a ``path``) must lie outside the workspace root,
the configured root and every writable root, whatever the mode: a confined command must
never be able to write the override that widens its own next call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from policies.errors import PolicyError
from policies.log_location import check_session_log_location
from policies.modes import NetworkMode, SandboxMode
from policies.policy import DEFAULT_PROTECTED_PATHS, SandboxPolicy
from policies.session import Session, effective_sandbox_mode
from policies.types import require_absolute_path

StrPath = str | os.PathLike[str]


def _describe(exc: ValidationError) -> str:
    """A pydantic error as one line that starts with the key: ``field: reason; field: reason``."""
    parts = []
    for err in exc.errors():
        where = str(err["loc"][0]) if err["loc"] else "policy"
        # "Value error, " is pydantic's wrapping of our own ValueError messages.
        parts.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def _canonical_root(raw: object, source: str) -> str:
    """``raw`` as an absolute, symlink-free path to an existing directory, else `PolicyError`."""
    if not isinstance(raw, str | os.PathLike):
        raise PolicyError(f"{source} must be a path, got {type(raw).__name__}")
    path = os.fspath(raw)
    if not isinstance(path, str):
        raise PolicyError(f"{source} must be a text path, got bytes {path!r}")
    try:
        require_absolute_path(path)
    except ValueError as exc:
        raise PolicyError(f"{source} {exc}", hint="pass an absolute directory") from None
    real = os.path.realpath(path)
    if not os.path.exists(real):
        raise PolicyError(
            f"workspace root {path!r} (from {source}) does not exist",
            hint="create it or point the workspace at an existing directory",
        )
    if not os.path.isdir(real):
        raise PolicyError(
            f"workspace root {path!r} (from {source}) is not a directory",
            hint="point the workspace at a directory",
        )
    return real


def _require_existing_roots(policy: SandboxPolicy) -> None:
    # A missing root is the config's mistake; found later, it would look like the sandbox
    # failing ("sandbox unavailable") instead of a key to fix.
    for root in policy.writable_roots:
        if not os.path.exists(root):
            raise PolicyError(
                f"writable_roots: {root} does not exist",
                hint="create it, or remove it from writable_roots",
                code="WRITABLE_ROOT_MISSING",
            )


def _path_tuple(values: Iterable[str], field: str) -> tuple[str, ...]:
    # A bare string is iterable too; splitting it into one-letter paths would be nonsense.
    if isinstance(values, str | bytes):
        raise PolicyError(f"{field} must be a list of paths, got the single string {values!r}")
    return tuple(values)


class SandboxPolicyService:
    """Resolves the `SandboxPolicy` for one call from configuration, session and arguments.

    Configuration is validated here, at construction: an unknown mode or network raises
    `ValueError` naming the valid values; a relative ``workspace_root``, a relative or
    missing writable root or a protected path that escapes its root raises `PolicyError`
    (a `ValueError`) whose message starts with the key. ``writable_roots`` may start with
    ``~/``. Whether the workspace root *exists* is checked at `resolve` time, when it is used.
    ``deny_read=None`` keeps the policy default (credential stores under the user's home).
    The path lists are keyword-only: three positional tuples would be easy to swap.
    """

    def __init__(
        self,
        default_mode: SandboxMode | str = SandboxMode.READ_ONLY,
        workspace_root: StrPath | None = None,
        network: NetworkMode | str = NetworkMode.ISOLATED,
        *,
        writable_roots: Iterable[str] = (),
        protected_paths: Iterable[str] = DEFAULT_PROTECTED_PATHS,
        deny_read: Iterable[str] | None = None,
        unprotected_paths: Iterable[str] = (),
    ) -> None:
        self._default_mode = SandboxMode(default_mode)
        self._network = NetworkMode(network)
        self._workspace_root: str | None = None
        if workspace_root is not None:
            path = os.fspath(workspace_root)
            if not isinstance(path, str):
                raise PolicyError(f"workspace_root must be a text path, got bytes {path!r}")
            try:
                self._workspace_root = require_absolute_path(path)
            except ValueError as exc:
                raise PolicyError(
                    f"workspace_root {exc}",
                    hint="pass an absolute directory, or None to use the process cwd",
                ) from None
        self._writable_roots = _path_tuple(writable_roots, "writable_roots")
        self._protected_paths = _path_tuple(protected_paths, "protected_paths")
        self._unprotected_paths = _path_tuple(unprotected_paths, "unprotected_paths")
        self._deny_read = None if deny_read is None else _path_tuple(deny_read, "deny_read")
        # Validate the path lists now (against the configured root, else a stand-in, with
        # every root writable) so a bad config fails at startup, not on the first command.
        self._build(SandboxMode.WORKSPACE_WRITE, self._workspace_root or os.sep)

    @property
    def default_mode(self) -> SandboxMode:
        return self._default_mode

    @property
    def network(self) -> NetworkMode:
        return self._network

    @property
    def workspace_root(self) -> str | None:
        """The configured root as given (canonicalised only when resolved)."""
        return self._workspace_root

    def resolve_mode(
        self, session: Session | None = None, mode: SandboxMode | str | None = None
    ) -> SandboxMode:
        """The mode alone: ``mode`` argument > session override > configured default."""
        if mode is not None:
            return SandboxMode(mode)
        if session is not None:
            override = effective_sandbox_mode(session.events)
            if override is not None:
                return override
        return self._default_mode

    def resolve_root(self, session: Session | None = None, cwd: StrPath | None = None) -> str:
        """The canonical workspace root (precedence in the module docstring)."""
        if cwd is not None:
            return _canonical_root(cwd, "cwd")
        session_cwd = getattr(session, "cwd", None) if session is not None else None
        if session_cwd is not None:
            # A cwd we cannot use is an error, never a silent fallback to another root.
            return _canonical_root(session_cwd, "session.cwd")
        if self._workspace_root is not None:
            return _canonical_root(self._workspace_root, "workspace_root")
        try:
            process_cwd = os.getcwd()
        except FileNotFoundError:
            raise PolicyError(
                "the process's current directory no longer exists",
                hint="pass cwd= or configure workspace_root",
            ) from None
        return _canonical_root(process_cwd, "the process cwd")

    def resolve(
        self,
        session: Session | None = None,
        mode: SandboxMode | str | None = None,
        cwd: StrPath | None = None,
    ) -> SandboxPolicy:
        """The complete policy for one call.

        ``mode`` is an approved per-call mode and beats the session's override, which beats
        the default. ``cwd`` beats ``session.cwd``, which beats the configured root, which
        beats the process cwd. Raises `PolicyError` when the root is relative, missing or
        not a directory, when a writable root is missing, or when ``session`` is a log (it
        has a ``path``) that lies inside the workspace or a writable root, and `ValueError`
        for an unknown ``mode``.
        """
        resolved_mode = self.resolve_mode(session, mode)
        policy = self._build(resolved_mode, self.resolve_root(session, cwd))
        log_path = getattr(session, "path", None) if session is not None else None
        if log_path is not None:
            self.check_session_log(log_path, policy)
        return policy

    def check_session_log(self, path: StrPath, policy: SandboxPolicy) -> None:
        """Refuse a session log at ``path`` that a confined command could write (any mode).

        Checks ``policy``'s roots and this service's configured root, which another call
        without ``cwd`` would use. Raises `PolicyError` ``SESSION_LOG_IN_WRITABLE_ROOT``.
        """
        extra: tuple[str, ...] = ()
        if self._workspace_root is not None:
            extra = (self._workspace_root,)
        check_session_log_location(path, policy, extra_roots=extra)

    def _build(self, mode: SandboxMode, root: str) -> SandboxPolicy:
        fields: dict[str, Any] = {
            "mode": mode,
            "workspace_root": root,
            "network": self._network,
            "writable_roots": self._writable_roots,
            "protected_paths": self._protected_paths,
            "unprotected_paths": self._unprotected_paths,
        }
        if self._deny_read is not None:
            fields["deny_read"] = self._deny_read
        try:
            policy = SandboxPolicy.model_validate(fields)
        except ValidationError as exc:
            raise PolicyError(_describe(exc)) from exc
        _require_existing_roots(policy)
        return policy

    def __repr__(self) -> str:
        return (
            f"SandboxPolicyService(default_mode={self._default_mode.value!r}, "
            f"workspace_root={self._workspace_root!r}, network={self._network.value!r})"
        )
