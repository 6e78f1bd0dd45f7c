"""A repository the command created, imported into a fresh one with git's default control
plane: the same import as an overlaid repository's, from an empty start."""

from __future__ import annotations

import os

from bash_sandbox.git_import.gitcmd import git
from bash_sandbox.git_import.importer import ImportResult, Snapshot, import_changes
from bash_sandbox.git_import.transaction import host_refs


def import_created(source_gitdir: str, host_gitdir: str, work: str) -> ImportResult:
    """Make ``host_gitdir`` a new repository with git's default control plane (`git init`
    with no template: no hooks, config git writes itself), then import ``source_gitdir``'s
    objects, refs, HEAD and index into it as a command's changes over an empty repository.
    ``source_gitdir`` is untrusted (the command's, moved aside by the caller); ``work`` is
    an empty directory of the executor's (the upper slot: the import keeps its view and
    journal beside it). ``host_gitdir`` must not exist yet."""
    os.makedirs(os.path.dirname(host_gitdir), exist_ok=True)
    git(host_gitdir, "init", "--bare", "-q", "--template=", host_gitdir)
    git(host_gitdir, "config", "core.bare", "false")
    snap = Snapshot(
        gitdir=host_gitdir,
        upper=source_gitdir,
        run_id=f"created-{os.path.basename(work)}",
        refs=host_refs(host_gitdir),
        heads={"": _head(host_gitdir)},
        indexes={"": None},
    )
    os.makedirs(work, exist_ok=True)
    return import_changes(snap, work_base=work)


def _head(gitdir: str) -> str | None:
    with open(os.path.join(gitdir, "HEAD")) as fh:
        return fh.read()
