"""Everyday git through the import, on both Linux backends: what the command did is what host
git sees afterwards, and the repository stays `git fsck` clean. (Commit, branch, stash,
rebase and worktree are in `tests/workflows/test_git_workflows.py`.)"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox import state as executor_state
from bash_sandbox.git_import import KEEP_NAMESPACE
from bash_seam import BashExecRequest, BashProcess, BashRunResult, GitImportStatus
from tests.sandbox.conftest import ExecutorFactory, counted_git_runs, private_tmpfs
from tests.sandbox.git_import_harness import GIT_ENV, fsck_clean, host_git, make_repo, reachable


def _topic(repo: Path) -> None:
    """A branch `topic` with one commit touching `t.txt`, main checked out."""
    host_git(repo, "switch", "-q", "-c", "topic")
    (repo / "t.txt").write_text("topic\n")
    host_git(repo, "add", "t.txt")
    host_git(repo, "commit", "-qm", "topic work")
    host_git(repo, "switch", "-q", "main")


def _subject(repo: Path, rev: str = "HEAD") -> str:
    return host_git(repo, "log", "-1", "--format=%s", rev).strip()


async def _committed(ex: SandboxBashExecutor, repo: Path, command: str) -> BashRunResult:
    """``command`` (a commit titled "from the command", maybe more) run in ``repo``: it
    exits 0 and its commit is applied on the host."""
    result = await ex.run(
        ex.resolve(BashExecRequest(command=command, workdir=str(repo), env=GIT_ENV))
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    assert [o.status for o in result.sandbox.git] == [GitImportStatus.APPLIED], result.sandbox.git
    assert _subject(repo) == "from the command"
    return result


CASES: dict[str, tuple[str, Callable[[Path], bool]]] = {
    "merge": (
        "git merge -q --no-ff -m 'merge topic' topic",
        lambda r: _subject(r) == "merge topic" and (r / "t.txt").exists(),
    ),
    "cherry-pick": (
        "git cherry-pick topic >/dev/null",
        lambda r: _subject(r) == "topic work" and _subject(r, "HEAD~1") == "start",
    ),
    "am": (
        "git format-patch -q -1 topic -o /tmp/p && git am -q /tmp/p/*.patch",
        lambda r: _subject(r) == "topic work",
    ),
    "bisect": (
        "git bisect start -q topic main >/dev/null",
        lambda r: "git bisect start" in host_git(r, "bisect", "log"),
    ),
    "stash twice": (
        "echo a >> f0.txt && git stash -q && echo b >> f0.txt && git stash -q",
        lambda r: len(host_git(r, "stash", "list").splitlines()) == 2,
    ),
    "tag": ("git tag -a v1 -m release", lambda r: host_git(r, "tag").split() == ["v1"]),
    "clone": (
        "git clone -q . ../cloned && git -C ../cloned log --oneline",
        lambda r: _subject(r.parent / "cloned") == "start",
    ),
    "submodule add": (
        "git -c protocol.file.allow=always submodule add -q ./ sub >/dev/null 2>&1;"
        " git commit -qm 'add sub'",
        # Usable on the host at once: initialised (`git submodule status` has no `-`), and
        # host git reaches into it.
        lambda r: (
            _subject(r) == "add sub"
            and _subject(r / "sub") == "start"
            and host_git(r, "submodule", "status").startswith(" ")
            and host_git(r, "config", "--get", "submodule.sub.active").strip() == "true"
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_git_workflow_lands_on_the_host(
    case: str, make_executor: ExecutorFactory, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    _topic(repo)
    command, landed = CASES[case]
    ex = make_executor(mode="workspace-write")
    result = await ex.run(
        ex.resolve(BashExecRequest(command=command, workdir=str(repo), env=GIT_ENV))
    )
    if result.exit_code != 0 and case == "submodule add" and os.geteuid() != 0:
        # Seen in CI's unprivileged leg only (the command's `git submodule add` fails there;
        # its output is silenced); not diagnosed yet.
        pytest.xfail("git submodule add inside the sandbox fails as an unprivileged user")
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    statuses = {o.status for o in result.sandbox.git}
    assert statuses <= {GitImportStatus.APPLIED}, result.sandbox.git
    assert landed(repo), f"host git does not see the {case}"
    fsck_clean(repo)


async def test_a_rebase_stopped_on_a_conflict_is_continued_by_host_git(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    host_git(repo, "switch", "-q", "-c", "topic")
    (repo / "f0.txt").write_text("topic\n")
    host_git(repo, "commit", "-qam", "topic edit")
    host_git(repo, "switch", "-q", "main")
    (repo / "f0.txt").write_text("main\n")
    host_git(repo, "commit", "-qam", "main edit")
    ex = make_executor(mode="workspace-write")
    result = await ex.run(
        ex.resolve(
            BashExecRequest(
                command="git switch -q topic && git rebase main", workdir=str(repo), env=GIT_ENV
            )
        )
    )
    assert result.exit_code != 0  # stopped on the conflict
    assert result.sandbox is not None
    assert [o.status for o in result.sandbox.git] == [GitImportStatus.APPLIED]
    (repo / "f0.txt").write_text("resolved\n")
    host_git(repo, "add", "f0.txt")
    host_git(repo, "rebase", "--continue", env={"GIT_EDITOR": "true"})
    assert _subject(repo, "topic") == "topic edit"
    assert _subject(repo, "topic~1") == "main edit"
    assert host_git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/topic"
    fsck_clean(repo)


async def test_a_repository_whose_path_holds_a_newline_still_imports(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # The import's view names the host's object store in `objects/info/alternates`, one
    # path a line: written plainly, a newline split it in two and the fetch failed, which
    # refused the import and lost the commit. Now C-quoted, as git reads such a line.
    repo = make_repo(workspace / 'odd\nname "q" \\b ünï')
    ex = make_executor(mode="workspace-write")
    await _committed(ex, repo, "echo more >> f0.txt && git commit -qam 'from the command'")
    fsck_clean(repo)


@pytest.mark.parametrize("spawn_helper", [True, False], ids=["helper", "no-helper"])
async def test_a_workspace_whose_path_is_not_utf8_confines_and_imports(
    make_executor: ExecutorFactory, workspace: Path, spawn_helper: bool
) -> None:
    # A path with bytes that are not UTF-8 (a Latin-1 directory name) reaches Python as
    # surrogate escapes: the child's steps encoded paths strictly, so every workspace-write
    # spawn in such a repository raised UnicodeEncodeError. Paths go as the bytes they are.
    repo = make_repo(Path(os.fsdecode(os.fsencode(str(workspace)) + b"/caf\xe9-\xff")))
    outside = workspace.parent / "outside-target"
    ex = make_executor(mode="workspace-write", workspace_root=str(repo), spawn_helper=spawn_helper)
    command = (
        f"echo more >> f0.txt && git commit -qam 'from the command'; echo x > {outside}; "
        "touch made-here"
    )
    result = await _committed(ex, repo, command)
    assert result.sandbox is not None
    assert (repo / "made-here").exists()  # the root is writable under its own bytes
    assert not outside.exists()  # and nothing outside it, from the host's side
    assert str(outside) in {d.target for d in result.sandbox.denials}
    fsck_clean(repo)
    read_only = make_executor(mode="read-only", workspace_root=str(repo))
    looked = await read_only.run(
        read_only.resolve(BashExecRequest(command="cat f0.txt; touch nope", workdir=str(repo)))
    )
    assert looked.stdout.text.endswith("more\n"), looked.stderr.text
    assert not (repo / "nope").exists()


async def test_a_commit_refused_by_a_full_host_disk_is_kept_and_imported_later(
    make_executor: ExecutorFactory, tmp_path: Path, private_base: Path
) -> None:
    # The executor's own flow: the command commits, the host's disk cannot take the objects,
    # the result says so, and the commit outlives the executor (`exec-kept-*` beside the
    # executors' state) until a later sweep imports it into keep-refs.
    with private_tmpfs(tmp_path / "small", "8m") as mounted:
        repo = make_repo(mounted / "repo")
        filler = mounted / "filler"
        filler.write_bytes(b"\0" * (6 << 20))
        ex = make_executor(mode="workspace-write", workspace_root=str(repo))
        command = (
            "b=$(head -c 3145728 /dev/urandom | git hash-object -w --stdin) && "
            "git update-index --add --cacheinfo 100644,$b,big && git commit -qm precious && "
            "git rev-parse HEAD"
        )
        result = await ex.run(
            ex.resolve(BashExecRequest(command=command, workdir=str(repo), env=GIT_ENV))
        )
        assert result.exit_code == 0, result.stderr.text
        commit = result.stdout.text.strip()
        assert result.sandbox is not None
        assert [o.status for o in result.sandbox.git] == [GitImportStatus.REFUSED]
        assert any("kept" in w for w in result.sandbox.warnings), result.sandbox.warnings
        parent = Path(ex._services.state.path).parent
        await ex.aclose()
        assert not reachable(repo, commit)  # nothing applied on the host
        [kept] = parent.glob("exec-kept-*")
        filler.unlink()
        executor_state.sweep_stale(str(parent))  # as the next executor's start does
        assert not kept.exists()
        assert host_git(repo, "for-each-ref", KEEP_NAMESPACE).strip()
        assert reachable(repo, commit)
        fsck_clean(repo)


def _separate_git_dir(tmp_path: Path, workspace: Path) -> Path:
    """`git init --separate-git-dir`: a git dir not named `.git`, found through the `.git`
    file of a checkout (both in the workspace: one outside is not overlaid)."""
    repo = workspace / "repo"
    sep = workspace / "meta" / "repo.git"
    sep.parent.mkdir()
    host_git(workspace, "init", "-q", "-b", "main", f"--separate-git-dir={sep}", "repo")
    (repo / "f0.txt").write_text("file 0\n")
    host_git(repo, "add", ".")
    host_git(repo, "commit", "-qm", "start")
    return repo


def _submodule(tmp_path: Path, workspace: Path) -> Path:
    """A submodule checked out in the workspace (its git dir `modules/sub`, `core.worktree`
    leading back into the workspace)."""
    lib = make_repo(tmp_path / "lib")
    repo = make_repo(workspace / "repo")
    host_git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "sub")
    host_git(repo, "commit", "-qm", "add sub")
    return repo / "sub"


def _linked_inside(tmp_path: Path, workspace: Path) -> Path:
    repo = make_repo(workspace / "repo")
    host_git(repo, "worktree", "add", "-q", "-b", "side", str(workspace / "wt"))
    return workspace / "wt"


def _linked_outside(tmp_path: Path, workspace: Path) -> Path:
    """The workspace a linked worktree of a checkout outside the roots."""
    proj = make_repo(tmp_path / "proj")
    host_git(proj, "worktree", "add", "-q", "-b", "side", str(workspace / "wt"))
    return workspace / "wt"


LAYOUTS: dict[str, Callable[[Path, Path], Path]] = {
    "separate git dir": _separate_git_dir,
    "submodule": _submodule,
    "linked worktree inside": _linked_inside,
    "linked worktree of a checkout outside": _linked_outside,
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
async def test_a_worktree_in_the_roots_gets_its_head_and_index_whatever_the_layout(
    layout: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The check that keeps a main worktree outside the roots from the command's HEAD and
    # index leaves every checkout in the roots its own (and `proj`'s main one untouched).
    tree = LAYOUTS[layout](tmp_path, workspace)
    outside = [p for p in (tmp_path / "proj",) if p.exists()]
    before = [(p / ".git" / "HEAD").read_bytes() for p in outside]
    ex = make_executor(mode="workspace-write")
    await _committed(
        ex,
        tree,
        "git switch -q -c feature && echo n > n.txt && git add n.txt"
        " && git commit -qm 'from the command' && echo staged > s.txt && git add s.txt",
    )
    assert host_git(tree, "symbolic-ref", "HEAD").strip() == "refs/heads/feature"
    assert host_git(tree, "status", "--porcelain") == "A  s.txt\n"
    assert [(p / ".git" / "HEAD").read_bytes() for p in outside] == before
    assert all(host_git(p, "status", "--porcelain") == "" for p in outside)
    fsck_clean(tree)


@pytest.mark.parametrize("op", ["pop", "drop"])
async def test_a_stash_the_command_pops_or_drops_leaves_the_list_and_survives_gc(
    op: str, make_executor: ExecutorFactory, workspace: Path
) -> None:
    # The entry leaves `git stash list` as the command asked; its commit (only in the
    # stash's reflog until then) is kept by a keep-ref, so the host's gc never loses it.
    repo = make_repo(workspace / "repo")
    for text in ("first", "second"):
        (repo / "f0.txt").write_text(f"{text}\n")
        host_git(repo, "stash", "-q")
    top, below = host_git(repo, "rev-parse", "stash@{0}", "stash@{1}").split()
    ex = make_executor(mode="workspace-write")
    result = await ex.run(
        ex.resolve(BashExecRequest(command=f"git stash {op} -q", workdir=str(repo), env=GIT_ENV))
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    assert [o.status for o in result.sandbox.git] == [GitImportStatus.APPLIED], result.sandbox.git
    assert host_git(repo, "rev-parse", "stash@{0}").strip() == below
    assert len(host_git(repo, "stash", "list").splitlines()) == 1
    assert (repo / "f0.txt").read_text() == ("second\n" if op == "pop" else "file 0\n")
    host_git(repo, "gc", "-q", "--prune=now")
    assert reachable(repo, top)
    kept = host_git(repo, "for-each-ref", "--format=%(refname)", f"{KEEP_NAMESPACE}/").split()
    assert len(kept) == 1 and kept[0] in result.sandbox.git[0].applied
    assert host_git(repo, "log", "-1", "--format=%s", kept[0]).startswith("WIP on main")
    fsck_clean(repo)


@pytest.mark.parametrize("host", ["idle", "stages a file"])
async def test_a_background_commit_on_a_tip_another_import_moved_fast_forwards(
    host: str, make_executor: ExecutorFactory, workspace: Path
) -> None:
    # A background command's snapshot says main=A; a foreground command's import moves main
    # to B meanwhile; the background one sees B through the overlay and commits C on it.
    # That was a conflict with nothing applied (red team): C descends from the host's main
    # and the host's index is B's, so it fast-forwards. A file the host staged meanwhile is
    # the host's work: then it stays a conflict, the index and main the host's.
    repo = make_repo(workspace / "repo")
    go = workspace / "go"
    ex = make_executor(mode="workspace-write")
    background = await ex.start(
        ex.resolve(
            BashExecRequest(
                command=f"while [ ! -e {go} ]; do sleep 0.02; done; echo bg > bg.txt"
                " && git add bg.txt && git commit -qm 'from the background'",
                workdir=str(repo),
                env=GIT_ENV,
            )
        )
    )
    await _committed(
        ex, repo, "echo fg > fg.txt && git add fg.txt && git commit -qm 'from the command'"
    )
    moved = host_git(repo, "rev-parse", "main").strip()
    if host == "stages a file":
        (repo / "h.txt").write_text("host\n")
        host_git(repo, "add", "h.txt")
    go.touch()
    await background.wait()
    assert background.exit_code == 0
    assert background.sandbox is not None
    [outcome] = background.sandbox.git
    if host == "idle":
        assert outcome.status is GitImportStatus.APPLIED, outcome
        assert _subject(repo) == "from the background"
        assert host_git(repo, "rev-parse", "main~1").strip() == moved
        assert host_git(repo, "status", "--porcelain") == ""
        assert host_git(repo, "ls-files").split() == ["bg.txt", "f0.txt", "fg.txt"]
    else:
        assert outcome.status is GitImportStatus.CONFLICT, outcome
        assert host_git(repo, "rev-parse", "main").strip() == moved
        assert host_git(repo, "diff", "--cached", "--name-only").split() == ["h.txt"]
        kept = f"{outcome.kept_at}/heads/main"
        assert _subject(repo, kept) == "from the background"
        assert host_git(repo, "rev-parse", f"{kept}~1").strip() == moved
    fsck_clean(repo)


@pytest.mark.parametrize("by", ["the user on the host", "another command's import"])
async def test_a_background_commit_of_an_index_staged_before_the_tip_moved_keeps_that_work(
    by: str, make_executor: ExecutorFactory, workspace: Path
) -> None:
    # Round 15: the background command staged (its index copied up), the tip moved (the
    # user's `git commit`, or an import), and its commit then rode the moved tip with the
    # stale index: a "fast-forward" that deleted the other commit's file on the host.
    repo = make_repo(workspace / "repo")
    ex = make_executor(mode="workspace-write")
    background, go = await _paused(
        ex, repo, "echo bg > bg.txt && git add bg.txt", "git commit -qm 'from the background'"
    )
    if by == "the user on the host":
        (repo / "user.txt").write_text("important\n")
        host_git(repo, "add", "user.txt")
        host_git(repo, "commit", "-qm", "from the command")  # the subject `_committed` checks
    else:
        await _committed(
            ex, repo, "echo fg > user.txt && git add user.txt && git commit -qm 'from the command'"
        )
    moved = host_git(repo, "rev-parse", "main").strip()
    go.touch()
    await background.wait()
    assert background.exit_code == 0, background.read_output().delta
    assert background.sandbox is not None
    [outcome] = background.sandbox.git
    assert outcome.status is GitImportStatus.CONFLICT, outcome
    # From the host: the other commit and its file stay, and the background's is kept.
    assert host_git(repo, "rev-parse", "main").strip() == moved
    assert "user.txt" in host_git(repo, "ls-tree", "--name-only", "main").split()
    assert "user.txt" in host_git(repo, "ls-files").split()
    assert _subject(repo, f"{outcome.kept_at}/heads/main") == "from the background"
    fsck_clean(repo)


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


async def test_an_object_the_host_writes_during_a_command_is_seen_by_its_git(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # A usability pass: the command's git made `objects/xx` first (a blob it staged), so the
    # directory was its overlay's upper layer alone, and the host's object written there
    # later (the user's commit meanwhile) never showed: `bad tree object HEAD`. Every
    # fan-out directory is made on the host before the command starts now.
    repo = make_repo(workspace / "repo")
    ours = b"the command's\n"
    theirs = next(
        d
        for d in (b"host %d\n" % i for i in range(100_000))
        if _blob_id(d)[:2] == _blob_id(ours)[:2]
    )
    (repo / "ours.txt").write_bytes(ours)
    ex = make_executor(mode="workspace-write")
    background, go = await _paused(
        ex,
        repo,
        "git add ours.txt",
        f"git cat-file -t {_blob_id(theirs)} && git status --short",
    )
    (repo / "theirs.txt").write_bytes(theirs)
    host_git(repo, "add", "theirs.txt")
    host_git(repo, "commit", "-qm", "the user's")
    go.touch()
    await background.wait()
    out = background.read_output()
    assert background.exit_code == 0, out.delta
    assert out.stdout_delta.split("\n")[0] == "blob"
    assert all(
        (repo / ".git" / "objects" / f"{i:02x}").is_dir() for i in range(256)
    )  # made ahead, empty where git has no object yet
    fsck_clean(repo)


@pytest.mark.parametrize("layout", ["the only one", "then another added", "beside one outside"])
async def test_removing_the_last_linked_worktree_unregisters_it_on_the_host(
    layout: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # Git removes `.git/worktrees` itself with the last linked worktree: that removal was
    # not imported at all, and the host kept listing the worktree, prunable (red team).
    # Each registration under it goes, but one whose checkout lies outside the roots.
    repo = make_repo(workspace / "repo")
    host_git(repo, "worktree", "add", "-q", "-b", "x", str(repo / "wt2"))
    outside = tmp_path / "outside-wt"
    command = "git worktree remove wt2"
    if layout == "then another added":  # `worktrees/` made again: opaque in the overlay
        command += " && git worktree add -q -b z wt3"
    elif layout == "beside one outside":
        host_git(repo, "worktree", "add", "-q", "-b", "y", str(outside))
        command += ' && rm -rf "$(git rev-parse --git-common-dir)/worktrees"'
    ex = make_executor(mode="workspace-write")
    result = await ex.run(
        ex.resolve(BashExecRequest(command=command, workdir=str(repo), env=GIT_ENV))
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    assert [o.status for o in result.sandbox.git] == [GitImportStatus.APPLIED], result.sandbox.git
    listed = host_git(repo, "worktree", "list", "--porcelain").splitlines()
    worktrees = [line.removeprefix("worktree ") for line in listed if line.startswith("worktree ")]
    if layout == "the only one":
        assert worktrees == [str(repo)]
        left = repo / ".git" / "worktrees"
        assert not left.exists() or os.listdir(left) == []  # git itself leaves none
    elif layout == "then another added":
        assert worktrees == [str(repo), str(repo / "wt3")]
        assert host_git(repo / "wt3", "symbolic-ref", "HEAD").strip() == "refs/heads/z"
    else:
        assert worktrees == [str(repo), str(outside)]
        assert host_git(outside, "status", "--short") == ""
        reasons = [d.reason for d in result.sandbox.denials]
        assert any("stays registered" in r for r in reasons), reasons
    assert "prunable" not in host_git(repo, "worktree", "list")
    fsck_clean(repo)


async def test_a_worktree_whose_checkout_could_not_be_removed_stays_registered(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # A linked worktree that is a root of its own: its `.git` file is held for the command,
    # so `git worktree remove --force` deleted its files, failed on that file, and went on
    # to delete the admin dir; imported, the host's checkout had no repository left.
    repo = make_repo(workspace / "repo")
    wt = workspace / "wt"
    host_git(repo, "worktree", "add", "-q", "-b", "x", str(wt))
    ex = make_executor(mode="workspace-write", writable_roots=(str(wt),))
    result = await ex.run(
        ex.resolve(
            BashExecRequest(
                command="git worktree remove --force ../wt", workdir=str(repo), env=GIT_ENV
            )
        )
    )
    assert result.exit_code != 0 and result.sandbox is not None
    reasons = [d.reason for d in result.sandbox.denials]
    assert any("remove the worktree on the host" in r for r in reasons), reasons
    # The host's checkout still has its repository: status works, the host removes it.
    host_git(wt, "status", "--short")
    host_git(repo, "worktree", "remove", "--force", str(wt))
    assert not wt.exists()
    fsck_clean(repo)


async def test_dropping_an_older_stash_keeps_only_its_own_commit(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # Reflog entries are compared, dates with them (a command re-dating the host's lost
    # their commits to gc). `git stash drop stash@{2}` rewrites the entry above it (`reflog
    # delete --rewrite`), days old: still only the dropped stash gets a keep-ref, and the
    # stash list is what the command left.
    repo = make_repo(workspace / "repo")
    days_ago = {"GIT_COMMITTER_DATE": f"@{int(time.time()) - 3 * 86400} +0000"}
    for text in ("first", "second", "third", "fourth"):
        (repo / "f0.txt").write_text(f"{text}\n")
        host_git(repo, "stash", "-q", env=days_ago)
    stashes = host_git(repo, "rev-parse", *(f"stash@{{{i}}}" for i in range(4))).split()
    ex = make_executor(mode="workspace-write")
    request = BashExecRequest(
        command="git stash drop -q 'stash@{2}'", workdir=str(repo), env=GIT_ENV
    )
    result = await ex.run(ex.resolve(request))
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    assert [o.status for o in result.sandbox.git] == [GitImportStatus.APPLIED], result.sandbox.git
    left = host_git(repo, "rev-parse", "stash@{0}", "stash@{1}", "stash@{2}").split()
    assert left == [stashes[0], stashes[1], stashes[3]]
    host_git(repo, "gc", "-q", "--prune=now")
    kept = host_git(repo, "for-each-ref", "--format=%(objectname)", f"{KEEP_NAMESPACE}/").split()
    assert kept == [stashes[2]]
    fsck_clean(repo)


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf repo",
        "rm -rf repo/.git; git init -q repo",  # an unborn master: every ref went
        "rm -rf repo/.git; git init -q -b main repo",
        "git -C repo update-ref -d refs/heads/main",
        # HEAD rewritten with the bytes it had: still the command's HEAD naming `main`
        "git -C repo update-ref -d refs/heads/main && cp repo/.git/HEAD h && cp h repo/.git/HEAD",
    ],
    ids=["rm -rf", "rm and init", "rm and init -b main", "update-ref -d", "HEAD rewritten"],
)
async def test_a_command_deleting_the_checked_out_branch_leaves_it_and_its_commits(
    make_executor: ExecutorFactory, workspace: Path, command: str
) -> None:
    # `rm -rf` of a repository the host made: its config and hooks stay (protected), the
    # rest went, and the import deleted every ref: host git then said "your current branch
    # 'main' does not have any commits yet", the history reachable from nothing (a user's).
    # Git refuses to delete a checked-out branch; so does the import, as a denial, and a
    # refs directory removed whole keeps every branch and tag (red team round 4).
    repo = make_repo(workspace / "repo", files=3)
    host_git(repo, "branch", "feature")
    host_git(repo, "tag", "-a", "-m", "one", "v1")
    refs = host_git(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    tip = host_git(repo, "rev-parse", "main").strip()
    ex = make_executor(mode="workspace-write")
    request = BashExecRequest(command=command, workdir=str(workspace), env=GIT_ENV)
    result = await ex.run(ex.resolve(request))
    assert result.sandbox is not None
    if not command.startswith("rm"):  # (`rm`'s dozen hook denials come first in the list)
        denied = [d.target for d in result.sandbox.denials]
        assert any(t.endswith("refs/heads/main") for t in denied), result.sandbox.denials
    assert host_git(repo, "rev-parse", "main").strip() == tip
    assert host_git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert host_git(repo, "for-each-ref", "--format=%(refname) %(objectname)") == refs
    assert host_git(repo, "reflog", "show", "main") != ""  # its reflog stays with it
    host_git(repo, "checkout", "-q", "--", ".")  # what the command removed, back from git
    assert sorted(p.name for p in repo.glob("f*.txt")) == ["f0.txt", "f1.txt", "f2.txt"]
    host_git(repo, "gc", "-q", "--prune=now")
    fsck_clean(repo)


async def test_deleting_a_branch_after_checking_out_another_is_imported(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    ex = make_executor(mode="workspace-write")
    request = BashExecRequest(
        command="git switch -q -c next && git branch -q -D main", workdir=str(repo), env=GIT_ENV
    )
    result = await ex.run(ex.resolve(request))
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    assert [o.status for o in result.sandbox.git] == [GitImportStatus.APPLIED], result.sandbox.git
    assert host_git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/next"
    assert host_git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/").split() == [
        "refs/heads/next"
    ]
    fsck_clean(repo)


async def test_git_status_in_workspace_write_leaves_nothing_to_import(
    make_executor: ExecutorFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `git status` refreshed the index's stat data in the overlay after a `touch`: the
    # import then compared the two indexes with host git (eight processes) to apply nothing.
    # GIT_OPTIONAL_LOCKS=0 (git's own switch for that refresh) in every confined mode.
    repo = make_repo(workspace / "repo", files=3)
    time.sleep(0.05)
    for path in repo.glob("f*.txt"):
        os.utime(path)  # stat data now stale in the host's index: a refresh would write it
    index = os.stat(repo / ".git" / "index")
    ex = make_executor(mode="workspace-write")
    compared = counted_git_runs(monkeypatch, "ls-files")  # the import reading an index
    status = await ex.run(
        ex.resolve(BashExecRequest(command="git status --porcelain", workdir=str(repo)))
    )
    assert status.exit_code == 0 and status.stdout.text == "", status.stderr.text
    assert status.sandbox is not None and status.sandbox.git == ()
    assert compared == []  # no index came back to compare
    now = os.stat(repo / ".git" / "index")
    assert (now.st_ino, now.st_mtime_ns) == (index.st_ino, index.st_mtime_ns)
    added = await ex.run(
        ex.resolve(BashExecRequest(command="echo n > n.txt && git add n.txt", workdir=str(repo)))
    )
    assert added.sandbox is not None
    assert [o.status for o in added.sandbox.git] == [GitImportStatus.APPLIED]
    assert "n.txt" in host_git(repo, "ls-files")  # git's own index writes still land


async def test_an_import_leaves_no_empty_keep_ref_directory_behind(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # The keep-refs are deleted once the commits land; git left their namespace's own
    # directory, so `refs/bash-sandbox/` stayed in every repository (a usability pass).
    repo = make_repo(workspace / "repo")
    ex = make_executor(mode="workspace-write")
    await _committed(ex, repo, "echo x > x && git add x && git commit -qm 'from the command'")
    assert not (repo / ".git" / KEEP_NAMESPACE).exists()
    assert not (repo / ".git" / "logs" / KEEP_NAMESPACE).exists()
    fsck_clean(repo)


async def _paused(
    ex: SandboxBashExecutor, repo: Path, before: str, after: str = "true"
) -> tuple[BashProcess, Path]:
    """A background command in ``repo`` that runs ``before``, then waits (bounded) until the
    returned file exists to run ``after``; returned once ``before`` is done."""
    mark, go = repo.parent / "mark", repo.parent / "go"
    background = await ex.start(
        ex.resolve(
            BashExecRequest(
                command=f"{before} && touch {mark} && for i in $(seq 1000); do"
                f" [ -e {go} ] && break; sleep 0.02; done && {after}",
                workdir=str(repo),
                env=GIT_ENV,
                timeout_ms=60_000,
            )
        )
    )
    for _ in range(1000):
        if mark.exists():
            break
        await asyncio.sleep(0.02)
    assert mark.exists(), "the background command never reached its mark"
    return background, go


@pytest.mark.parametrize("host_step", [("pack-refs", "--all"), ("gc", "-q")])
async def test_a_host_repack_of_refs_during_a_command_that_deleted_a_tag_keeps_every_branch(
    make_executor: ExecutorFactory, workspace: Path, host_step: tuple[str, ...]
) -> None:
    # Deleting a packed tag copies `packed-refs` up into the overlay; the host's `git gc`
    # then packed the loose `main` and `zz` and removed their files, so the import's view
    # showed the stale copy's values: `main` rewound to the packed commit and `zz` deleted,
    # reported as applied (red team). A ref the command never wrote keeps the host's value.
    repo = make_repo(workspace / "repo")
    host_git(repo, "tag", "v0")
    host_git(repo, "pack-refs", "--all")  # main and v0 packed
    for i in (1, 2):
        (repo / "f0.txt").write_text(f"host {i}\n")
        host_git(repo, "commit", "-qam", f"host commit {i}")  # main loose again
    host_git(repo, "branch", "zz", "HEAD~1")
    tip, zz = host_git(repo, "rev-parse", "main", "zz").split()
    ex = make_executor(mode="workspace-write")
    background, go = await _paused(ex, repo, "git tag -d v0 >/dev/null")
    host_git(repo, *host_step)
    go.touch()
    await background.wait()
    assert background.exit_code == 0 and background.sandbox is not None
    [outcome] = background.sandbox.git
    assert outcome.status is GitImportStatus.APPLIED, outcome
    assert host_git(repo, "rev-parse", "main", "zz").split() == [tip, zz]
    assert host_git(repo, "tag").split() == []  # the command's own change landed
    assert host_git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    fsck_clean(repo)


async def test_a_commit_in_a_sparse_partial_clone_is_imported(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # `git clone --filter=blob:none --sparse`: the host lacks the blobs outside the cone,
    # and asking its own store for an object it lacks made git fetch it from the promisor
    # remote (lazy fetching off: exit 128), so every commit was refused and its overlay kept
    # for a retry that never succeeded (red team).
    source = make_repo(tmp_path / "source")
    for d in ("d1", "d2"):
        (source / d).mkdir()
        (source / d / "f").write_text(f"{d}\n")
    host_git(source, "add", ".")
    host_git(source, "commit", "-qm", "dirs")
    host_git(source, "config", "uploadpack.allowfilter", "true")
    repo = workspace / "repo"
    host_git(
        workspace, "clone", "-q", "--filter=blob:none", "--sparse", f"file://{source}", str(repo)
    )
    host_git(repo, "sparse-checkout", "set", "--cone", "d1")
    ex = make_executor(mode="workspace-write")
    for i in (1, 2):
        await _committed(
            ex, repo, f"echo {i} > d1/n{i} && git add d1/n{i} && git commit -qm 'from the command'"
        )
    assert host_git(repo, "log", "--format=%s", "-3").split("\n")[:2] == ["from the command"] * 2
    assert host_git(repo, "status", "--porcelain") == ""
    assert not (repo / "d2").exists()  # still sparse
    host_git(repo, "fsck", "--connectivity-only", "--no-progress")


async def test_a_host_git_status_during_a_background_commit_lets_it_apply(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # A host `git status` (an IDE's poll, a shell prompt) refreshes the index's stat data and
    # replaces the file: every background commit then came back a conflict, its commits and
    # tags only under keep-refs (a usability pass). The entries are the same: applied.
    repo = make_repo(workspace / "repo")
    ex = make_executor(mode="workspace-write")
    background, go = await _paused(
        ex,
        repo,
        "echo bg > bg.txt && git add bg.txt",
        "git commit -qm 'from the command' && git tag done",
    )
    index = repo / ".git" / "index"
    before = index.stat().st_ino
    stamp = (repo / "f0.txt").stat().st_mtime + 5
    os.utime(repo / "f0.txt", (stamp, stamp))  # stat-dirty: the status rewrites the index
    host_git(repo, "status", "--short", env={"GIT_OPTIONAL_LOCKS": "1"})
    assert index.stat().st_ino != before, "the host's status did not refresh the index"
    go.touch()
    await background.wait()
    assert background.exit_code == 0 and background.sandbox is not None
    assert [o.status for o in background.sandbox.git] == [GitImportStatus.APPLIED]
    assert _subject(repo) == "from the command"
    assert host_git(repo, "tag").split() == ["done"]
    assert host_git(repo, "status", "--porcelain") == ""
    fsck_clean(repo)


@pytest.mark.parametrize("when", ["before the command", "while it runs"])
async def test_the_hosts_assume_unchanged_bits_survive_an_imported_index(
    make_executor: ExecutorFactory, workspace: Path, when: str
) -> None:
    # A local edit hidden with `git update-index --assume-unchanged`: the rebuilt index
    # dropped the bit, so the user's next `git commit -a` committed the hidden edit (a local
    # token); one set while the command ran was taken for a stat refresh (red team).
    repo = make_repo(workspace / "repo")
    (repo / "f0.txt").write_text("token = local\n")
    if when == "before the command":
        host_git(repo, "update-index", "--assume-unchanged", "f0.txt")
    ex = make_executor(mode="workspace-write")
    background, go = await _paused(ex, repo, "echo n > new.txt && git add new.txt")
    if when == "while it runs":
        host_git(repo, "update-index", "--assume-unchanged", "f0.txt")
    go.touch()
    await background.wait()
    assert background.exit_code == 0 and background.sandbox is not None
    [outcome] = background.sandbox.git
    if when == "before the command":
        assert outcome.status is GitImportStatus.APPLIED, outcome
        assert host_git(repo, "diff", "--cached", "--name-only").split() == ["new.txt"]
    else:
        assert outcome.status is GitImportStatus.CONFLICT, outcome
    assert host_git(repo, "ls-files", "-v", "f0.txt").split()[0] == "h"  # still hidden
    host_git(repo, "commit", "-qam", "the user's commit -a", check=False)  # maybe nothing to
    assert host_git(repo, "show", "HEAD:f0.txt") == "file 0\n"  # the hidden edit stayed local
    fsck_clean(repo)
