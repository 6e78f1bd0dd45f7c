"""The host refs a spawn's snapshot starts from, kept while no ref file changed.

`begin` records the host's refs before every command in a repository: a `git for-each-ref`
process, 1.5-3 ms of each spawn. Git's files backend reads refs from `packed-refs` and the
files below `refs/`, so its answer is kept with the stamp of each of those (`kept_answers`):
every directory under `refs/` (a ref made, renamed or removed changes its directory), every
loose ref file (an edit in place changes the file), `packed-refs` and the config (which names
the ref storage). Only the snapshot reads the kept answer; the import itself asks git again
and moves refs with git's own compare-and-swap, so even a stale baseline could only show a
conflict, never overwrite a host ref.

Asked every time: a reftable repository, a linked worktree's git directory (its refs live in
two places), and a `refs/` tree of more than `_MAX_ENTRIES` entries (stamping it would cost
what git does).
"""

from __future__ import annotations

import os
import time

from bash_sandbox.git_import.gitcmd import GitError
from bash_sandbox.git_import.transaction import host_refs
from bash_sandbox.kept_answers import KeptAnswers
from bash_sandbox.safe_read import blocking_names

_MAX_ENTRIES = 4096
_ANSWERS: KeptAnswers[str, tuple[dict[str, str], tuple[str, ...]]] = KeptAnswers()


def snapshot_refs(gitdir: str) -> tuple[dict[str, str], tuple[str, ...] | None]:
    """`host_refs(gitdir)`, from the kept answer when no file it came from changed, and the
    names of the refs that were loose files then (None: not listed). The import tells by
    the second a ref the command never wrote from one whose loose file the host packed
    while it ran (its view then showed the command's stale `packed-refs` value)."""
    known = _ANSWERS.get(gitdir)
    if known is not None:
        return dict(known[0]), known[1]
    blocking = blocking_names(gitdir)
    if blocking:
        # git would wait on it until its time bound, with the loop waiting for git.
        raise GitError(["for-each-ref"], 128, f"not a file git can read: {blocking[0]}")
    asked = time.time_ns()
    refs = host_refs(gitdir)
    # Listed after git read them: a ref the host makes loose in between is listed (and only
    # ever keeps the host's value), one it packs in between is not (the command's view read
    # it packed too).
    listed = _ref_files(gitdir)
    if listed is None:
        return refs, None
    watched, loose = listed
    _ANSWERS.keep(gitdir, watched, asked, (dict(refs), loose))
    return refs, loose


def _ref_files(gitdir: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Every file and directory git's files backend reads refs from, and the names of the
    loose refs among them (`refs/...`); None where the answer must not be kept."""
    for other in ("commondir", "reftable"):
        if os.path.lexists(os.path.join(gitdir, other)):
            return None
    top = os.path.join(gitdir, "refs")
    if not os.path.isdir(top) or os.path.islink(top):
        return None
    found = [os.path.join(gitdir, "config"), os.path.join(gitdir, "packed-refs"), top]
    loose: list[str] = []
    pending = [top]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            return None
        for entry in entries:
            if entry.is_symlink():
                return None  # git follows it; its target's entries are not walked here
            found.append(entry.path)
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            elif entry.is_file(follow_symlinks=False):
                loose.append(os.path.relpath(entry.path, gitdir))
        if len(found) > _MAX_ENTRIES:
            return None
    return tuple(found), tuple(loose)
