"""Where a session log may live: never inside a root a confined command could write.

A log inside the workspace or a writable root lets a confined command append its own
``bash/sandbox-mode: danger-full-access`` event, or swap the log for a symlink so the host
writes somewhere else. The check covers every mode: a read-only session may be escalated to
workspace-write later, and then the same log would be writable.

Events carry no MAC: a key the executor can read is readable to the commands that could
forge events (danger-full-access runs as the same user, unconfined), and a confined command
cannot reach a log outside every writable root at all. Refusing such places, plus the
no-follow, single-link, owner-only checks of `JsonlSessionLog`, is what makes the log
trustworthy; a MAC would add a key to manage without closing any further route.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from policies.errors import PolicyError
from policies.paths import within
from policies.policy import SandboxPolicy

SESSION_LOG_IN_WRITABLE_ROOT = "SESSION_LOG_IN_WRITABLE_ROOT"


def _names_of(path: str) -> tuple[str, ...]:
    # Both the name the host opens (parent resolved, last component as is) and where a
    # symlink at that name leads: either one inside a root is writable by a command.
    absolute = os.path.abspath(path)
    parent, name = os.path.split(absolute)
    opened = os.path.join(os.path.realpath(parent), name)
    return tuple(dict.fromkeys((opened, os.path.realpath(absolute))))


def session_log_refusal(
    path: str | os.PathLike[str], roots: Iterable[str], *, workspace: str | None = None
) -> str | None:
    """Why ``path`` must not hold a session log, or None. The one check every caller uses
    (the policy service, `run --session`, `mcp --session`).

    ``roots`` are every root a confined command may write (the workspace included), in
    any spelling: each is resolved here. Both the name the host opens (its directory
    resolved) and where a symlink at that name leads are checked; a directory is refused.
    """
    absolute = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if os.path.isdir(absolute):
        return f"session log {absolute} is a directory"
    real_roots = [(root, os.path.realpath(root)) for root in roots]
    for name in _names_of(absolute):
        for root, real_root in real_roots:
            for candidate in dict.fromkeys((root, real_root)):
                if within(name, candidate):
                    what = "the workspace root" if root == workspace else "the writable root"
                    return (
                        f"session log {name} lies inside {what} {candidate}, where a "
                        "confined command could rewrite the session's sandbox mode"
                    )
    return None


def check_session_log_location(
    path: str | os.PathLike[str], policy: SandboxPolicy, *, extra_roots: Iterable[str] = ()
) -> None:
    """Raise `PolicyError` (``SESSION_LOG_IN_WRITABLE_ROOT``) when ``path`` is writable to a
    confined command under ``policy`` in any mode: inside its workspace root, one of its
    ``writable_roots``, or one of ``extra_roots`` (e.g. a configured root the call did not use).
    """
    roots = (policy.workspace_root, *policy.writable_roots, *extra_roots)
    refusal = session_log_refusal(path, roots, workspace=policy.workspace_root)
    if refusal is not None:
        raise PolicyError(
            refusal,
            hint="keep session logs outside the workspace and every writable root, "
            "e.g. under ~/.local/state/bash-sandbox/",
            code=SESSION_LOG_IN_WRITABLE_ROOT,
        )
