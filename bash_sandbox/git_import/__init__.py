"""The git import: a confined command's git directory is an untrusted remote.

Commands see a normal, writable repository (an overlay of the host's git directory with a
private upper layer, `bash_sandbox.git_plane`). When one ends, nothing it wrote there reaches
the host as it is. Its objects, refs, `HEAD`, pseudo-refs, index and rebase/sequencer state
are read through git's own parsers from a private view (`view.py`), checked, and written on
the host by git's own writers: objects by `git fetch` with fsck (each object hashed; trees
with `.git` or `..` in any spelling refused), refs by one `git update-ref --stdin`
transaction of compare-and-swaps against the values the command started from (or, for a
branch the host moved forward meanwhile to an ancestor of the command's value, against the
host's: a fast-forward), the index rebuilt with `git update-index --index-info` (git's path rules;
cache-tree and unknown extensions dropped, split index refused) and installed under git's
`index.lock`. The `HEAD`, index, state and `HEAD` reflog of a worktree (linked or main)
outside the command's writable roots stay the host's, and so do its `gitdir` and the branch
it has checked out, bisects or rebases (moving it is a conflict). A host commit that the
command's ref deletions or reflog edits (entries removed or re-dated) would leave unreachable
gets a keep-ref (`refs/bash-sandbox/<run>-kept/<n>`) in the same ref transaction. Config,
hooks, `info/`, `commondir` and attributes stay the host's. See `transaction.py` for the order
of the writes and the recovery after a crash, `state_files.py` for the small files.

Public: `begin(gitdir, upper, roots, main_inside=...)` before the command (the snapshot;
`main_checkout_inside` tells a separate git dir's checkout in the roots), `import_changes(
snapshot)` after it, `recover(state_dir)` before a dead executor's state is swept, and
`import_created(source_gitdir, worktree)` for a repository the command created; `fan_out(
gitdir)`, which `begin` runs: git's empty `objects/xx` directories, made on the host once.
"""

from bash_sandbox.git_import.importer import (
    ImportResult,
    Snapshot,
    begin,
    fan_out,
    import_changes,
    import_created,
    load_snapshot,
    main_checkout_inside,
    mark_unimported,
    may_keep,
    recover,
    recover_overlay,
)
from bash_sandbox.git_import.transaction import CRASH_ENV, KEEP_NAMESPACE, WRITE_POINTS
from bash_sandbox.git_import.view import GIT_STATE_CAP_BYTES

__all__ = [
    "CRASH_ENV",
    "GIT_STATE_CAP_BYTES",
    "KEEP_NAMESPACE",
    "WRITE_POINTS",
    "ImportResult",
    "Snapshot",
    "begin",
    "fan_out",
    "import_changes",
    "import_created",
    "load_snapshot",
    "main_checkout_inside",
    "mark_unimported",
    "may_keep",
    "recover",
    "recover_overlay",
]
