"""A repository the command created, imported into a fresh one with git's default control
plane: the same import as an overlaid repository's, from an empty start."""

from __future__ import annotations

import os

from bash_sandbox.git_import.gitcmd import git
from bash_sandbox.git_import.importer import ImportResult, Snapshot, import_changes
from bash_sandbox.git_import.transaction import host_refs


def import_created(
    source_gitdir: str,
    host_gitdir: str,
    work: str,
    *,
    run_id: str,
    worktree_within: str | None = None,
) -> ImportResult:
    """Make ``host_gitdir`` a new repository with git's default control plane (`git init`
    with no template: no hooks, config git writes itself), then import ``source_gitdir``'s
    objects, refs, HEAD and index into it as a command's changes over an empty repository.
    ``source_gitdir`` is untrusted (the command's, moved aside by the caller); ``work`` is
    an empty directory of the executor's (its view and journal go there); ``run_id`` names
    the keep-refs. ``host_gitdir`` must not exist yet. A submodule's `core.worktree` (read
    with git's config parser) is kept when it leads inside ``worktree_within``."""
    os.makedirs(os.path.dirname(host_gitdir), exist_ok=True)
    git(host_gitdir, "init", "--bare", "-q", "--template=", host_gitdir)
    git(host_gitdir, "config", "core.bare", "false")
    if worktree_within is not None:
        _keep_worktree(source_gitdir, host_gitdir, worktree_within)
    snap = Snapshot(
        gitdir=host_gitdir,
        upper=source_gitdir,
        run_id=run_id,
        refs=host_refs(host_gitdir),
        heads={"": _head(host_gitdir)},
        indexes={"": None},
    )
    os.makedirs(work, exist_ok=True)
    return import_changes(snap, work_base=work)


def _keep_worktree(source: str, host_gitdir: str, within: str) -> None:
    got = git(
        "/nonexistent",
        "config",
        "--file",
        os.path.join(source, "config"),
        "--get",
        "core.worktree",
        check=False,
    )
    value = got.stdout.decode(errors="replace").strip()
    target = os.path.normpath(os.path.join(host_gitdir, value))
    if value and "\n" not in value and (target == within or target.startswith(within + "/")):
        git(host_gitdir, "config", "core.worktree", value)


def _head(gitdir: str) -> str | None:
    with open(os.path.join(gitdir, "HEAD")) as fh:
        return fh.read()
