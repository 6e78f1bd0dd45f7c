"""File hints read from a command's output: what it says was refused, never a denial.

Printed text can be forged (``echo 'bash: /etc/x: Read-only file system' >&2``), so it
never makes a denial nor sets `denied`; denials come from the supervisor, the git overlay,
the egress proxy and kernel records. What the output *points at* is still worth showing:
`infer_file_hints` reads refusal messages in both streams (`facts.dialects`) and keeps
those naming a path the *policy* refuses, as `SandboxHint`s. A message is a hint when it
reports:

- a write (``EROFS``, a write operation with ``EACCES``/``EPERM``, a write the tool reports
  failed without an errno such as ``git push``'s remote unpack, or an operation-less
  message with an errno in ``write_refusals``) to a path outside every writable root, or
  to a protected name inside one (also ``EISDIR`` on it, which is what the placeholder of
  a missing protected file answers; ``ENOENT`` under it and ``EBUSY`` for an explicit write,
  the latter being a rename over the mounted name; ``EROFS`` under a missing protected
  name's placeholder parent such as ``.git``);
- a read or write refused (``EACCES``/``EPERM``/``EROFS``) of a `deny_read` path or below.

Everything else is not the sandbox's doing and is never reported: a refused path the
policy allows (Unix permissions inside the workspace, a missing file), a message without a
path, and printed text naming a path the policy would allow.

A relative path is judged as if against the command's starting directory, but shown as
printed (``relative``): after a ``cd`` (or in a tool that changed directory) the starting
directory is the wrong base, and a wrong absolute path is worse than a relative one. This
is pure: no filesystem access, so the same output and policy always give the same answer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from bash_sandbox.facts.dialects import UNSTATED, RefusalMessage, find_refusal_messages
from bash_seam import DenialKind, HintSource, SandboxHint
from policies import SandboxMode, SandboxPolicy
from policies.autorun import protected_label
from policies.paths import within

REASON_READ_ONLY = "read-only mode"
REASON_OUTSIDE_ROOTS = "outside the writable roots"
REASON_DENY_READ = "deny_read"

# Devices and descriptors every confined mode may write (the fresh /dev keeps the sinks).
_ALWAYS_WRITABLE = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/stdout",
    "/dev/stderr",
    "/dev/fd",
    "/proc/self/fd",
)
_REFUSALS = frozenset({"EROFS", "EACCES", "EPERM"})


def _resolve(path: str, workdir: str) -> str:
    # Lexical on purpose: the host may not look like the sandbox did, and the answer must
    # not depend on what exists now.
    if path.startswith("~"):
        path = os.path.expanduser(path)
    return os.path.normpath(os.path.join(workdir, path))


def _in_scratch(target: str, policy: SandboxPolicy, scratch_dirs: Sequence[str] | None) -> bool:
    if scratch_dirs is not None:
        return any(within(target, s) for s in scratch_dirs)
    # The Linux backends' shared view: the executor's private /tmp and /dev/shm in both
    # confined modes, except that the host's /tmp/<entry> holding a root is bound back
    # read-only so the root stays visible.
    if within(target, "/dev/shm"):
        return True
    if not within(target, "/tmp"):
        return False
    parts = target.split("/")
    roots = (policy.workspace_root, *policy.writable_roots)
    return len(parts) < 3 or not any(within(root, f"/tmp/{parts[2]}") for root in roots)


def _is_refused_write(message: RefusalMessage, write_refusals: frozenset[str]) -> bool:
    """Whether the message reports a write the kernel refused (not merely failed)."""
    if message.errno == "EROFS":
        return True
    if message.errno == UNSTATED:
        # The tool says the write failed, not why: outside the roots the policy refuses it
        # whatever else would have.
        return message.access == "write"
    if message.errno in _REFUSALS:
        return message.access == "write" or (
            message.access == "unknown" and message.errno in write_refusals
        )
    return False


def _protected_reason(
    target: str,
    message: RefusalMessage,
    policy: SandboxPolicy,
    write_refusals: frozenset[str],
    guarded: Mapping[str, str],
) -> str | None:
    """Why the refused ``target`` inside a writable root is protected, if it is."""
    refused = _is_refused_write(message, write_refusals)
    # The placeholder of a missing protected file is a read-only empty directory: writing
    # the file answers EISDIR, creating something below it ENOENT; renaming a new version
    # over a protected (mounted) file answers EBUSY.
    placeholder = (message.errno == "EISDIR" and message.access != "read") or (
        message.errno in ("ENOENT", "EBUSY") and message.access == "write"
    )
    for path, why in guarded.items():
        if within(target, path):
            return why if refused or placeholder else None
    for root in policy.all_writable_roots():
        if not within(target, root):
            continue
        for name in policy.protected_paths:
            if within(target, os.path.join(root, name)):
                return protected_label(name) if refused or placeholder else None
            # A missing protected name is held by a read-only directory at its first missing
            # component (`.git`), so writes below that component are refused with EROFS.
            parent = os.path.dirname(name)
            while parent:
                if message.errno == "EROFS" and within(target, os.path.join(root, parent)):
                    return f"protected name {name}, whose missing parent {parent} is held read-only"
                parent = os.path.dirname(parent)
    return None


def _judge(
    message: RefusalMessage,
    target: str,
    policy: SandboxPolicy,
    scratch_dirs: Sequence[str] | None,
    write_refusals: frozenset[str],
    *,
    guarded: Mapping[str, str],
) -> SandboxHint | None:
    def hint(kind: DenialKind, reason: str) -> SandboxHint:
        relative = not os.path.isabs(os.path.expanduser(message.path))
        return SandboxHint(
            kind=kind,
            target=os.path.normpath(message.path) if relative else target,
            relative=relative,
            operation=message.operation,
            reason=reason,
            source=HintSource.OUTPUT,
        )

    if any(within(target, p) for p in policy.deny_read) and message.errno in _REFUSALS:
        kind = DenialKind.FILE_WRITE if message.access == "write" else DenialKind.FILE_READ
        return hint(kind, REASON_DENY_READ)
    if any(within(target, p) for p in _ALWAYS_WRITABLE):
        return None
    roots = policy.all_writable_roots()
    if any(within(target, r) for r in roots):
        reason = _protected_reason(target, message, policy, write_refusals, guarded)
        return hint(DenialKind.FILE_WRITE, reason) if reason else None
    if not _is_refused_write(message, write_refusals) or _in_scratch(target, policy, scratch_dirs):
        return None
    if policy.mode is SandboxMode.READ_ONLY and any(
        within(target, r) for r in (policy.workspace_root, *policy.writable_roots)
    ):
        # workspace-write would allow it: say so, the marker offers that step.
        return hint(DenialKind.FILE_WRITE, REASON_READ_ONLY)
    return hint(DenialKind.FILE_WRITE, REASON_OUTSIDE_ROOTS)


def infer_file_hints(
    stdout: str,
    stderr: str,
    *,
    policy: SandboxPolicy,
    workdir: str,
    scratch_dirs: Sequence[str] | None = None,
    write_refusals: frozenset[str] = frozenset({"EROFS"}),
    guarded: Mapping[str, str] | None = None,
) -> list[SandboxHint]:
    """File hints (source ``output``) that the output of one command points at.

    ``workdir`` is the command's starting directory (relative paths are judged against
    it and shown as printed). ``scratch_dirs`` are writable in this spawn beyond the
    policy's roots (default: the Linux backends' private ``/tmp`` and ``/dev/shm`` in both
    modes, minus the host ``/tmp`` entries bound back read-only; the Landlock-only
    fallback, which keeps the host ``/tmp`` read-only, passes its private TMPDIR instead).
    ``write_refusals`` are the errnos this backend answers a refused write with, used for
    messages that do not say whether they read or wrote
    (bwrap and Landlock with a mount namespace: ``EROFS``; Landlock alone adds
    ``EACCES``; Seatbelt: ``EPERM``). Each (kind, target) is reported once, stderr first.
    ``guarded`` maps covered paths inside a root that are not protected names (the files
    installed git hooks run) to the reason a refused write there reports.
    Under danger-full-access nothing is a hint.
    """
    if not policy.confined:
        return []
    found: dict[tuple[DenialKind, str], SandboxHint] = {}
    for text in (stderr, stdout):
        for message in find_refusal_messages(text):
            target = _resolve(message.path, workdir)
            judged = _judge(
                message, target, policy, scratch_dirs, write_refusals, guarded=guarded or {}
            )
            if judged is not None:
                found.setdefault((judged.kind, judged.target), judged)
    return list(found.values())
