"""Crafted git state a command leaves in its overlay, then the host user's ordinary git:
nothing planted runs, nothing outside the workspace changes, the committed tree is what the
user staged. Real bwrap and Landlock; every check made with host git from outside."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from bash_seam import BashExecRequest, BashRunResult, GitImportStatus
from tests.sandbox.conftest import ExecutorFactory
from tests.sandbox.git_import_harness import GIT_ENV, fsck_clean, host_git, make_repo

# Writes a git index (version 2) with the given `name=oid` entries, and a root cache-tree
# claiming `TREE=<oid>` when given: git checks neither the names nor the cache-tree when it
# reads an index, only when it adds an entry.
CRAFT = r"""
import hashlib, struct, sys
path, args = sys.argv[1], sys.argv[2:]
tree = [a.split("=", 1)[1] for a in args if a.startswith("TREE=")]
items = sorted(
    (n.encode(), bytes.fromhex(o))
    for n, o in (a.split("=", 1) for a in args if not a.startswith("TREE="))
)
body = b""
for name, oid in items:
    entry = struct.pack(">10I", 0, 0, 0, 0, 0, 0, 0o100644, 0, 0, 0) + oid
    entry += struct.pack(">H", min(len(name), 0xFFF)) + name
    body += entry + b"\0" * (8 - len(entry) % 8)
data = b"DIRC" + struct.pack(">II", 2, len(items)) + body
if tree:
    ext = b"\0" + f"{len(items)} 0\n".encode() + bytes.fromhex(tree[0])
    data += b"TREE" + struct.pack(">I", len(ext)) + ext
open(path, "wb").write(data + hashlib.sha1(data).digest())
"""


async def _run(ex: object, command: str, cwd: Path) -> BashRunResult:
    run = ex.run  # type: ignore[attr-defined]
    spec = ex.resolve(BashExecRequest(command=command, workdir=str(cwd), env=GIT_ENV))  # type: ignore[attr-defined]
    result: BashRunResult = await run(spec)
    return result


def _outcome(result: BashRunResult) -> GitImportStatus | None:
    assert result.sandbox is not None
    outcomes = result.sandbox.git
    return outcomes[0].status if outcomes else None


async def test_an_index_naming_git_config_and_a_path_outside_changes_nothing_on_host_checkout(
    make_executor: ExecutorFactory, tmp_path: Path, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    (repo / "craft.py").write_text(CRAFT)
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = tmp_path / "pwned"
    config_before = (repo / ".git" / "config").read_bytes()
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        f"cfg=$(printf '[core]\\n\\tfsmonitor = touch {marker}\\n' | git hash-object -w --stdin)"
        " && out=$(echo owned | git hash-object -w --stdin)"
        " && f0=$(git rev-parse HEAD:f0.txt)"
        ' && python3 craft.py .git/index ".git/config=$cfg" "../outside/x=$out" '
        '".GIT/config=$cfg" "f0.txt=$f0" && git ls-files',
        repo,
    )
    assert result.exit_code == 0, result.stderr.text
    assert ".git/config" in result.stdout.text  # the sandbox's git read the crafted index
    assert _outcome(result) is GitImportStatus.REFUSED
    for args in (("restore", "."), ("checkout", "--", "."), ("status",), ("diff",)):
        host_git(repo, *args, check=False)
    assert (repo / ".git" / "config").read_bytes() == config_before
    assert not (outside / "x").exists()
    assert not marker.exists()
    fsck_clean(repo)


async def test_an_index_naming_git_config_in_a_repository_the_command_created_writes_nothing(
    make_executor: ExecutorFactory, tmp_path: Path, workspace: Path
) -> None:
    # A repository the command creates keeps its index; host git checks entry names when it
    # adds one, not when it reads an index: `git restore .` wrote `.git/config` (which then
    # ran) and `../../outside/x`.
    (workspace / "craft.py").write_text(CRAFT)
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = tmp_path / "pwned"
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        "git init -q made && cd made && echo ok > ok.txt && git add ok.txt && git commit -qm c"
        f" && cfg=$(printf '[core]\\n\\tfsmonitor = touch {marker}\\n'"
        " | git hash-object -w --stdin)"
        " && out=$(echo owned | git hash-object -w --stdin)"
        ' && python3 ../craft.py .git/index ".git/config=$cfg" "../../outside/x=$out"'
        " && git ls-files && cd .. && git init -q good && cd good && echo a > a.txt"
        " && git add a.txt",
        workspace,
    )
    assert result.exit_code == 0, result.stderr.text
    assert ".git/config" in result.stdout.text  # the sandbox's git read the crafted index
    made = workspace / "made"
    for args in (("restore", "."), ("checkout", "--", "."), ("status",), ("diff",)):
        host_git(made, *args, check=False)
    assert b"fsmonitor" not in (made / ".git" / "config").read_bytes()
    assert not (outside / "x").exists()
    assert not marker.exists()
    # An index git's path rules accept is the command's work, kept as it is.
    assert host_git(workspace / "good", "diff", "--cached", "--name-only").split() == ["a.txt"]


async def test_a_crafted_cache_tree_never_puts_an_unstaged_file_in_the_hosts_commit(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    (repo / "craft.py").write_text(CRAFT)
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        "echo note > notes.txt && git add notes.txt"
        " && mkdir -p .github/workflows && echo 'run: evil' > .github/workflows/ci.yml"
        " && git add .github && t=$(git write-tree) && git rm -q --cached -r .github"
        " && rm -r .github"
        ' && python3 craft.py .git/index "TREE=$t"'
        " $(git ls-files -s | awk '{print $4\"=\"$2}')"
        " && git diff --cached --name-only",
        repo,
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.stdout.text.split() == ["notes.txt"]  # what the user sees staged
    assert _outcome(result) is GitImportStatus.APPLIED
    assert host_git(repo, "diff", "--cached", "--name-only").split() == ["notes.txt"]
    host_git(repo, "commit", "-qm", "the user's commit")
    committed = host_git(repo, "ls-tree", "-r", "--name-only", "HEAD").split()
    assert committed == ["f0.txt", "notes.txt"]
    fsck_clean(repo)


async def test_an_object_planted_under_another_contents_hash_never_reaches_the_host(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    reviewed = (
        subprocess.run(
            ["git", "hash-object", "--stdin"], input=b"reviewed\n", capture_output=True, check=True
        )
        .stdout.decode()
        .strip()
    )
    plant = (
        "import os, sys, zlib; oid = sys.argv[1]; d = os.path.join('.git/objects', oid[:2]);"
        " os.makedirs(d, exist_ok=True);"
        " open(os.path.join(d, oid[2:]), 'wb').write(zlib.compress(b'blob 5\\0evil\\n'))"
    )
    ex = make_executor(mode="workspace-write")
    # Planted, then committed in a tree that names it.
    result = await _run(
        ex,
        f'python3 -c "{plant}" {reviewed} && git cat-file -p {reviewed}'
        f" && git update-index --add --cacheinfo 100644,{reviewed},f.txt"
        " && git commit -qm planted",
        repo,
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.stdout.text == "evil\n"  # the sandbox's own git took the planted blob
    assert _outcome(result) is GitImportStatus.REFUSED
    missing = subprocess.run(
        ["git", "cat-file", "-e", reviewed], cwd=repo, capture_output=True, check=False
    )
    assert missing.returncode != 0
    (repo / "f.txt").write_text("reviewed\n")
    host_git(repo, "add", "f.txt")
    host_git(repo, "commit", "-qm", "the reviewed edit")
    assert host_git(repo, "show", "HEAD:f.txt") == "reviewed\n"
    fsck_clean(repo)


async def test_sequencer_options_git_reads_differently_from_a_regex_run_nothing_on_continue(
    make_executor: ExecutorFactory, tmp_path: Path, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    # Two commits to pick, the first conflicting: the sequencer stops with its state.
    host_git(repo, "switch", "-q", "-c", "other")
    (repo / "f0.txt").write_text("other\n")
    host_git(repo, "commit", "-qam", "conflicting")
    (repo / "g.txt").write_text("g\n")
    host_git(repo, "add", "g.txt")
    host_git(repo, "commit", "-qm", "g")
    host_git(repo, "switch", "-q", "main")
    (repo / "f0.txt").write_text("main\n")
    host_git(repo, "commit", "-qam", "main")
    marker = tmp_path / "pwned"
    planted = repo / "git-merge-ours x"
    planted.mkdir()
    (planted / "evil").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (planted / "evil").chmod(0o755)
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        "git cherry-pick main..other >/dev/null 2>&1; test -d .git/sequencer"
        " && printf '\\357\\273\\277[options]\\n\\tstrategy = ours x/evil\\n'"
        " > .git/sequencer/opts",
        repo,
    )
    assert result.exit_code == 0, result.stderr.text
    assert _outcome(result) is GitImportStatus.REFUSED
    host_git(repo, "checkout", "--theirs", "f0.txt", check=False)
    host_git(repo, "add", "f0.txt", check=False)
    host_git(repo, "cherry-pick", "--continue", check=False, env={"GIT_EDITOR": "true"})
    assert not marker.exists()
    fsck_clean(repo)


async def test_a_lock_the_host_takes_during_the_command_keeps_the_commit_and_applies_nothing(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    before = host_git(repo, "rev-parse", "main").strip()
    ex = make_executor(mode="workspace-write")
    process = await ex.start(
        ex.resolve(
            BashExecRequest(
                command="echo more >> f0.txt && git commit -qam more && touch committed && sleep 1",
                workdir=str(repo),
                env=GIT_ENV,
            )
        )
    )
    for _ in range(200):
        if (repo / "committed").exists():
            break
        await asyncio.sleep(0.05)
    lock = repo / ".git" / "refs" / "heads" / "main.lock"
    lock.write_text("host\n")
    await process.wait()
    assert process.sandbox is not None and process.sandbox.git, process.sandbox
    outcome = process.sandbox.git[0]
    assert outcome.status is GitImportStatus.CONFLICT
    assert lock.read_text() == "host\n"
    lock.unlink()
    assert host_git(repo, "rev-parse", "main").strip() == before
    kept = host_git(repo, "rev-parse", f"{outcome.kept_at}/heads/main").strip()
    assert host_git(repo, "log", "-1", "--format=%s", kept).strip() == "more"
    assert any("conflict" in w for w in process.sandbox.warnings)
    fsck_clean(repo)


async def test_a_host_commit_during_the_command_is_a_conflict_and_nothing_is_lost(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # Both commit on `main` as the command found it: two histories, neither a
    # fast-forward of the other (a command that builds on the host's commit is one).
    repo = make_repo(workspace / "repo")
    start = host_git(repo, "rev-parse", "main").strip()
    go = workspace / "go"
    ex = make_executor(mode="workspace-write")
    process = await ex.start(
        ex.resolve(
            BashExecRequest(
                command="echo sandbox > s.txt && git add s.txt && git commit -qm sandbox"
                f" && touch ../committed && while [ ! -e {go} ]; do sleep 0.02; done",
                workdir=str(repo),
                env=GIT_ENV,
            )
        )
    )
    for _ in range(200):
        if (workspace / "committed").exists():
            break
        await asyncio.sleep(0.05)
    (repo / "h.txt").write_text("host\n")
    host_git(repo, "add", "h.txt")
    host_git(repo, "commit", "-qm", "host")
    host_commit = host_git(repo, "rev-parse", "main").strip()
    go.touch()
    await process.wait()
    assert process.exit_code == 0
    assert process.sandbox is not None and process.sandbox.git
    outcome = process.sandbox.git[0]
    assert outcome.status is GitImportStatus.CONFLICT
    assert host_git(repo, "rev-parse", "main").strip() == host_commit
    kept = host_git(repo, "rev-parse", f"{outcome.kept_at}/heads/main").strip()
    assert host_git(repo, "log", "-1", "--format=%s", kept).strip() == "sandbox"
    assert host_git(repo, "rev-parse", f"{kept}~1").strip() == start
    assert host_git(repo, "diff", "--cached", "--name-only") == ""  # the host's index
    fsck_clean(repo)


async def test_a_command_that_leaves_git_alone_reports_no_git_outcome(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, "echo x > x.txt && git status --short", repo)
    assert result.exit_code == 0
    assert result.sandbox is not None and result.sandbox.git == ()
    assert os.listdir(repo / ".git" / "refs" / "heads") == ["main"]


async def test_a_replace_ref_never_changes_what_host_git_shows(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # `git replace` makes host git show another object wherever the replaced one appears
    # (a diff hid a backdoor while a push sent it; a file the command never touched showed
    # forged text, and `git checkout` wrote it): imported as any ref, found by a red team.
    repo = make_repo(workspace / "repo")
    real = host_git(repo, "rev-parse", "HEAD:f0.txt").strip()
    ex = make_executor(mode="workspace-write")
    forge = (
        "fake=$(printf 'forged\\n' | git hash-object -w --stdin) && "
        f"git replace -f {real} $fake && git show HEAD:f0.txt && echo new > n.txt && "
        "git add n.txt && git commit -qm 'also a commit'"
    )
    result = await _run(ex, forge, repo)
    assert result.exit_code == 0, result.stderr.text
    assert result.stdout.text == "forged\n"  # inside, the command's git shows its forgery
    # From the host: the commit is there, the replace ref is not, the file shows as it is.
    assert host_git(repo, "log", "-1", "--format=%s") == "also a commit\n"
    assert host_git(repo, "for-each-ref", "refs/replace/") == ""
    assert host_git(repo, "show", "HEAD:f0.txt") == "file 0\n"
    assert result.sandbox is not None
    named = [d for d in result.sandbox.denials if "refs/replace/" in d.target]
    assert named and "replace ref" in named[0].reason, result.sandbox.denials
    fsck_clean(repo)


async def test_a_bisect_start_that_git_would_read_as_an_option_is_refused(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # `git bisect reset` checks out what BISECT_START names, as a word on checkout's
    # command line: `-f` there threw away the user's uncommitted work (red team).
    repo = make_repo(workspace / "repo")
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex, "git bisect start -q 2>/dev/null; printf -- '-f\\n' > .git/BISECT_START", repo
    )
    assert result.exit_code == 0, result.stderr.text
    assert not (repo / ".git" / "BISECT_START").exists() or (
        (repo / ".git" / "BISECT_START").read_text().strip() != "-f"
    )
    (repo / "f0.txt").write_text("the user's uncommitted work\n")
    host_git(repo, "bisect", "reset", check=False)
    assert (repo / "f0.txt").read_text() == "the user's uncommitted work\n"


async def test_a_rebase_state_naming_control_files_as_refs_writes_none_on_continue(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # A rebase the command left stopped, its `update-refs` naming `shallow`, `info/grafts`
    # and a replace ref: the user's `git rebase --continue` wrote each (history hidden, a
    # forged object shown), since git checks only their format (red team). Now refused.
    repo = make_repo(workspace / "repo")
    for i in (1, 2, 3):
        (repo / f"c{i}.txt").write_text(f"{i}\n")
        host_git(repo, "add", ".")
        host_git(repo, "commit", "-qm", f"c{i}")
    before = host_git(repo, "log", "--format=%H")
    ex = make_executor(mode="workspace-write")
    plant = (
        "GIT_SEQUENCE_EDITOR='sed -i 1ibreak' git rebase -q -i HEAD~1 >/dev/null 2>&1; "
        "h=$(git rev-parse HEAD); z=$(printf %040d 0); p=$(git rev-parse HEAD~1); "
        'printf "shallow\\n$z\\n$h\\ninfo/grafts\\n$z\\n$h\\nrefs/replace/$p\\n$z\\n$h\\n" '
        "> .git/rebase-merge/update-refs; ls .git/rebase-merge/update-refs"
    )
    result = await _run(ex, plant, repo)
    assert result.exit_code == 0, result.stderr.text
    # The user finishes (or aborts) whatever rebase the host has: no control file written.
    host_git(repo, "rebase", "--continue", check=False)
    host_git(repo, "rebase", "--abort", check=False)
    git = repo / ".git"
    assert not (git / "shallow").exists() and not (git / "info" / "grafts").exists()
    assert host_git(repo, "for-each-ref", "refs/replace/") == ""
    assert host_git(repo, "log", "--format=%H") == before  # every commit still shown
    fsck_clean(repo)
    assert result.sandbox is not None
    refused = [r for o in result.sandbox.git for r in o.refused]
    assert any("update-refs" in r for r in refused), result.sandbox.git


@pytest.mark.parametrize(
    "how", ["head-name, then --abort", "update-refs, then --continue", "a todo's update-ref"]
)
async def test_a_rebase_state_naming_a_branch_checked_out_outside_moves_nothing_there(
    how: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # Round 15: a stopped rebase whose `head-name` (or `update-refs`) named `release`,
    # checked out in a worktree outside the roots: the user's `git rebase --abort` (or
    # `--continue`) moved it to the command's commit without git's own checked-out check,
    # and that worktree's `reset --hard` then wrote the command's file outside every root.
    repo = make_repo(workspace / "repo")
    (repo / "f0.txt").write_text("two\n")
    host_git(repo, "commit", "-qam", "c2")
    outside = tmp_path / "outside-wt"
    host_git(repo, "worktree", "add", "-q", "-b", "release", str(outside))
    release = host_git(repo, "rev-parse", "release").strip()
    plant = (
        "git checkout -q -b evil && echo planted > planted.txt && git add planted.txt"
        " && git commit -qm evil && c=$(git rev-parse HEAD) && git checkout -q main"
        " && GIT_SEQUENCE_EDITOR='sed -i 1ibreak' git rebase -q -i HEAD~1 >/dev/null 2>&1;"
    )
    if how.startswith("head-name"):
        plant += " echo refs/heads/release > .git/rebase-merge/head-name"
        plant += " && echo $c > .git/rebase-merge/orig-head"
    elif how.startswith("a todo"):
        # The user's `git rebase --edit-todo` adds it to `update-refs` (round 16).
        plant += " echo 'update-ref refs/heads/release' >> .git/rebase-merge/git-rebase-todo"
    else:
        plant += f" printf 'refs/heads/release\\n{release}\\n%s\\n' $c"
        plant += " > .git/rebase-merge/update-refs"
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, plant, repo)
    assert result.exit_code == 0, result.stderr.text
    if how.startswith("a todo"):
        editor = {"GIT_SEQUENCE_EDITOR": "true", "GIT_EDITOR": "true"}
        host_git(repo, "rebase", "--edit-todo", check=False, env=editor)
    host_git(repo, "rebase", "--abort" if "abort" in how else "--continue", check=False)
    assert host_git(repo, "rev-parse", "release").strip() == release
    host_git(outside, "reset", "-q", "--hard", check=False)
    assert not (outside / "planted.txt").exists()
    assert result.sandbox is not None
    refused = [r for o in result.sandbox.git for r in o.refused]
    assert any("refs/heads/release" in r and "outside" in r for r in refused), refused
    fsck_clean(repo)


@pytest.mark.parametrize("bit", ["--skip-worktree", "--assume-unchanged"])
async def test_a_bit_the_command_sets_does_not_hide_its_edit_from_host_git(
    bit: str, make_executor: ExecutorFactory, workspace: Path
) -> None:
    # Round 15: `git update-index --skip-worktree build.sh` and an edit: the import kept the
    # bit, so the host's `git status`, `diff` and `commit -a` never showed the change.
    repo = make_repo(workspace / "repo")
    (repo / "build.sh").write_text("echo build\n")
    host_git(repo, "add", "build.sh")
    host_git(repo, "commit", "-qm", "build")
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex, f"git update-index {bit} build.sh && echo 'echo planted' >> build.sh", repo
    )
    assert result.exit_code == 0, result.stderr.text
    assert host_git(repo, "status", "--porcelain").split() == ["M", "build.sh"]
    assert "echo planted" in host_git(repo, "diff")
    assert result.sandbox is not None
    reasons = [d.reason for d in result.sandbox.denials if d.target.endswith("index")]
    assert any("hide its edits" in r for r in reasons), result.sandbox.denials
    fsck_clean(repo)


async def test_a_created_repositorys_linked_objects_make_nothing_on_the_host(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # Round 19: the executor makes each `objects/xx` fan-out directory before a spawn; a
    # repository the command made with `objects` linked to a host directory had it make
    # 256 directories there, with that directory's owner, at the next command.
    repo = make_repo(workspace / "repo")
    victim = tmp_path / "victim"
    victim.mkdir()
    ex = make_executor(mode="workspace-write")
    plant = (
        f"mkdir sub && cd sub && git init -q && rm -rf .git/objects && ln -s {victim} .git/objects"
    )
    result = await _run(ex, plant, repo)
    assert result.exit_code == 0, result.stderr.text
    again = await _run(ex, "true", repo)
    assert again.exit_code == 0
    assert list(victim.iterdir()) == []
    assert all((repo / ".git" / "objects" / f"{i:02x}").is_dir() for i in range(256))


async def test_a_worktree_outside_the_roots_keeps_its_own_head_and_index(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The host's linked worktree lies outside the roots; the command rewrote its admin
    # dir's HEAD and index (staging an executable): the user's `git restore` or `checkout`
    # there would then write it outside every root (red team). Both stay the host's.
    repo = make_repo(workspace / "repo")
    outside = tmp_path / "outside-wt"
    host_git(repo, "worktree", "add", "-q", "-b", "side", str(outside))
    admin = repo / ".git" / "worktrees" / "outside-wt"
    head_before = (admin / "HEAD").read_bytes()
    index_before = (admin / "index").read_bytes()
    ex = make_executor(mode="workspace-write")
    plant = (
        "printf '#!/bin/sh\\ntouch pwned\\n' > evil.sh && chmod +x evil.sh && "
        "b=$(git hash-object -w evil.sh) && "
        "GIT_INDEX_FILE=.git/worktrees/outside-wt/index "
        "git update-index --add --cacheinfo 100755,$b,evil.sh && "
        "echo 'ref: refs/heads/main' > .git/worktrees/outside-wt/HEAD && rm evil.sh"
    )
    result = await _run(ex, plant, repo)
    assert result.exit_code == 0, result.stderr.text
    assert (admin / "HEAD").read_bytes() == head_before
    assert (admin / "index").read_bytes() == index_before
    assert host_git(outside, "status", "--porcelain") == ""
    host_git(outside, "checkout", "--", ".", check=False)
    assert not (outside / "evil.sh").exists()
    assert result.sandbox is not None
    refused = [r for o in result.sandbox.git for r in o.refused]
    assert any("worktree outside the writable roots" in r for r in refused), result.sandbox.git
    fsck_clean(repo)


def _checkout_outside(tmp_path: Path, workspace: Path) -> tuple[Path, Path]:
    """The user's checkout `proj` outside the roots, and the workspace's linked worktree of
    it: (proj, the worktree). Its main worktree's HEAD, index and state are in the common
    dir the command's git writes."""
    proj = make_repo(tmp_path / "proj")
    wt = workspace / "wt"
    host_git(proj, "worktree", "add", "-q", "-b", "wsbranch", str(wt))
    return proj, wt


_EXE = "printf '#!/bin/sh\\ntouch pwned\\n' | git hash-object -w --stdin"
# What the command plants in the main worktree's admin dir, and the user's git in `proj`
# that would then write it there (outside every root).
_MAIN_PLANTS = {
    "index": (
        f"C=$(git rev-parse --git-common-dir) && b=$({_EXE}) && "
        "GIT_INDEX_FILE=$C/index git update-index --add --cacheinfo 100755,$b,run-me.sh && "
        "GIT_INDEX_FILE=$C/index git update-index --cacheinfo 100644,$b,f0.txt",
        (("restore", "."), ("checkout", "--", ".")),
    ),
    "HEAD": (
        "C=$(git rev-parse --git-common-dir) && git switch -q -c evil && "
        f"git update-index --add --cacheinfo 100755,$({_EXE}),run-me.sh && "
        "git commit -qm evil && git switch -q wsbranch && "
        "git --git-dir=$C symbolic-ref HEAD refs/heads/evil",
        (("reset", "-q", "--hard"),),
    ),
    # `git merge --abort` applies the autostash a merge left: the command's stash.
    "MERGE_AUTOSTASH": (
        f"C=$(git rev-parse --git-common-dir) && b=$({_EXE}) && "
        "git update-index --add --cacheinfo 100755,$b,run-me.sh && s=$(git stash create) && "
        "git reset -q && git rev-parse HEAD > $C/MERGE_HEAD && echo $s > $C/MERGE_AUTOSTASH",
        (("merge", "--abort"),),
    ),
}


@pytest.mark.parametrize("plant", list(_MAIN_PLANTS))
async def test_the_main_worktree_outside_the_roots_keeps_its_own_head_index_and_state(
    plant: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The workspace is a linked worktree of a checkout outside the roots: the common dir is
    # overlaid and imported, and the main worktree's `HEAD`, `index` and merge state were
    # applied to it; the user's `git restore` / `reset --hard` / `merge --abort` there then
    # wrote the command's executable outside every root (red team).
    proj, wt = _checkout_outside(tmp_path, workspace)
    gitdir = proj / ".git"
    head_before = (gitdir / "HEAD").read_bytes()
    index_before = (gitdir / "index").read_bytes()
    command, user_acts = _MAIN_PLANTS[plant]
    result = await _run(make_executor(mode="workspace-write"), command, wt)
    assert result.exit_code == 0, result.stderr.text
    assert (gitdir / "HEAD").read_bytes() == head_before
    assert (gitdir / "index").read_bytes() == index_before
    assert not (gitdir / "MERGE_AUTOSTASH").exists()
    assert host_git(proj, "status", "--porcelain") == ""
    for args in user_acts:
        host_git(proj, *args, check=False)
    assert not (proj / "run-me.sh").exists()
    assert (proj / "f0.txt").read_text() == "file 0\n"
    assert result.sandbox is not None
    refused = [r for o in result.sandbox.git for r in o.refused]
    assert any("worktree outside the writable roots" in r for r in refused), result.sandbox.git
    fsck_clean(proj)


async def test_a_submodule_whose_checkout_lies_outside_the_roots_keeps_its_own_index(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The same through a submodule of that checkout: its git dir (`modules/sub`, in the
    # overlaid common dir) has `core.worktree` leading to `proj/sub`, outside the roots.
    lib = make_repo(tmp_path / "lib")
    proj, wt = _checkout_outside(tmp_path, workspace)
    host_git(proj, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "sub")
    host_git(proj, "commit", "-qm", "add sub")
    index = proj / ".git" / "modules" / "sub" / "index"
    before = index.read_bytes()
    command = (
        "M=$(git rev-parse --git-common-dir)/modules/sub && "
        f"b=$({_EXE.replace('git hash-object', 'git --git-dir=$M hash-object')}) && "
        "git --git-dir=$M update-index --add --cacheinfo 100755,$b,run-me.sh"
    )
    result = await _run(make_executor(mode="workspace-write"), command, wt)
    assert result.exit_code == 0, result.stderr.text
    assert index.read_bytes() == before
    host_git(proj / "sub", "restore", ".", check=False)
    host_git(proj / "sub", "checkout", "--", ".", check=False)
    assert not (proj / "sub" / "run-me.sh").exists()
    assert result.sandbox is not None
    refused = [r for o in result.sandbox.git for r in o.refused]
    assert any("worktree outside the writable roots" in r for r in refused), result.sandbox.git
    fsck_clean(proj / "sub")


# What the command does to the host's history, and whether a keep-ref must hold what it
# dropped (a branch moved back keeps its old tip in the reflog the command appended to).
_DROPS = {
    "reflogs expired": (
        "git reset -q --hard HEAD~3"
        " && git reflog expire --expire=now --expire-unreachable=now --all",
        True,
    ),
    "branch deleted": ("git branch -D side", True),
    "branch moved back": ("git reset -q --hard HEAD~3", False),
}


@pytest.mark.parametrize("drop", list(_DROPS))
async def test_no_commit_the_host_reached_is_lost_to_its_gc_after_the_import(
    drop: str, make_executor: ExecutorFactory, workspace: Path
) -> None:
    # The command rewound `main` and emptied every reflog: the import copied the emptied
    # reflogs, and the host's `git gc --prune=now` deleted its own commits (red team). A
    # branch the command deletes takes its reflog with it. Every commit the host reached
    # through a ref or a reflog when the command began survives the host's gc.
    repo = make_repo(workspace / "repo")
    for i in (1, 2, 3):
        (repo / f"h{i}.txt").write_text(f"{i}\n")
        host_git(repo, "add", ".")
        host_git(repo, "commit", "-qm", f"host {i}")
    side = host_git(repo, "commit-tree", "-p", "HEAD~3", "-m", "side", "HEAD^{tree}").strip()
    host_git(repo, "branch", "side", side)  # never checked out: in no HEAD reflog
    known = host_git(repo, "rev-list", "--all", "--reflog").split()
    command, keeps = _DROPS[drop]
    result = await _run(make_executor(mode="workspace-write"), command, repo)
    assert result.exit_code == 0, result.stderr.text
    assert _outcome(result) is GitImportStatus.APPLIED
    host_git(repo, "gc", "-q", "--prune=now")
    missing = subprocess.run(
        ["git", "cat-file", "--batch-check"],
        cwd=repo,
        input="".join(f"{c}\n" for c in known),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "missing" not in missing, missing
    kept = host_git(repo, "for-each-ref", "--format=%(refname)", "refs/bash-sandbox/").split()
    assert bool(kept) is keeps, kept
    assert result.sandbox is not None
    assert set(kept) <= set(result.sandbox.git[0].applied)  # named in the outcome
    fsck_clean(repo)


async def test_a_rebase_state_asking_to_sign_never_signs_with_the_users_key_on_continue(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A rebase stopped at a `break`, its `gpg_sign_opt` set to a bare `-S`: the user's
    # `git rebase --continue` signed the command's commits with the user's key (red team).
    repo = make_repo(workspace / "repo")
    marker = tmp_path / "signed"
    signer = tmp_path / "gpg"
    signer.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    signer.chmod(0o755)
    # The two commits swapped after the `break`: each pick then makes a new commit.
    plant = (
        "for i in 1 2; do echo $i > c$i.txt && git add c$i.txt && git commit -qm c$i; done"
        " && a=$(git rev-parse HEAD~1) && b=$(git rev-parse HEAD)"
        " && GIT_SEQUENCE_EDITOR=\"printf 'break\\npick $b\\npick $a\\n' >\""
        " git rebase -q -i HEAD~2 >/dev/null 2>&1;"
        " test -d .git/rebase-merge && printf -- '-S\\n' > .git/rebase-merge/gpg_sign_opt"
    )
    result = await _run(make_executor(mode="workspace-write"), plant, repo)
    assert result.exit_code == 0, result.stderr.text
    signing = ("-c", f"gpg.program={signer}", "-c", "user.signingKey=the-users-key")
    host_git(repo, *signing, "rebase", "--continue", check=False, env={"GIT_EDITOR": "true"})
    assert not marker.exists()
    assert result.sandbox is not None
    refused = [r for o in result.sandbox.git for r in o.refused]
    assert any("signing" in r for r in refused), result.sandbox.git
    fsck_clean(repo)


def _branch_outside(layout: str, tmp_path: Path, workspace: Path) -> tuple[Path, str, Path]:
    """A checkout outside the roots and the branch it has checked out, and where the command
    runs: the workspace a linked worktree of `proj` (whose main worktree is outside), or a
    repository of the workspace with a linked worktree outside."""
    if layout == "main worktree":
        proj, wt = _checkout_outside(tmp_path, workspace)
        return proj, "main", wt
    repo = make_repo(workspace / "repo")
    outside = tmp_path / "outside-wt"
    host_git(repo, "worktree", "add", "-q", "-b", "side", str(outside))
    return outside, "side", repo


# A commit whose tree is one executable, made on top of the branch `B` names.
_EVIL_COMMIT = (
    f"b=$({_EXE}) && t=$(printf '100755 blob %s\\trun-me.sh\\n' $b | git mktree)"
    ' && c=$(git commit-tree -p "$B" -m evil $t)'
)


@pytest.mark.parametrize("action", ["moved", "deleted"])
@pytest.mark.parametrize("layout", ["main worktree", "linked worktree"])
async def test_a_branch_checked_out_outside_the_roots_is_never_moved(
    layout: str, action: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The command moved the branch a checkout outside the roots has checked out (that
    # HEAD stayed the host's, the branch it names did not): the user's `git reset --hard`,
    # or `git status` and `git checkout .`, there then wrote the command's tree outside
    # every root (red team). A conflict for that ref: its value kept, nothing applied.
    checkout, branch, where = _branch_outside(layout, tmp_path, workspace)
    before = host_git(checkout, "rev-parse", branch).strip()
    change = {
        "moved": 'git update-ref refs/heads/"$B" $c',
        "deleted": 'git update-ref -d refs/heads/"$B"',
    }
    command = (
        f"B={branch} && {_EVIL_COMMIT} && {change[action]}"
        " && echo mine > mine.txt && git add mine.txt && git commit -qm mine"
    )
    result = await _run(make_executor(mode="workspace-write"), command, where)
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    [outcome] = result.sandbox.git
    assert outcome.status is GitImportStatus.CONFLICT, outcome
    assert [c.name for c in outcome.conflicts] == [f"refs/heads/{branch}"]
    assert host_git(checkout, "rev-parse", branch).strip() == before
    assert host_git(checkout, "status", "--porcelain") == ""
    for args in (("reset", "-q", "--hard"), ("checkout", "--", ".")):
        host_git(checkout, *args, check=False)
    assert not (checkout / "run-me.sh").exists()
    assert (checkout / "f0.txt").read_text() == "file 0\n"
    # The command's work is kept, as in any conflict: its commit on its own branch, and the
    # value it gave the branch it moved.
    assert outcome.kept_at is not None
    mine = host_git(where, "rev-parse", "--abbrev-ref", "HEAD").strip()
    assert host_git(where, "log", "-1", "--format=%s", f"{outcome.kept_at}/heads/{mine}") == (
        "mine\n"
    )
    if action == "moved":
        kept = f"{outcome.kept_at}/heads/{branch}"
        assert host_git(checkout, "log", "-1", "--format=%s", kept) == "evil\n"
    named = [d for d in result.sandbox.denials if d.target.endswith(f"refs/heads/{branch}")]
    assert named and "outside the writable roots" in named[0].reason, result.sandbox.denials
    fsck_clean(checkout)


@pytest.mark.parametrize("layout", ["main worktree", "linked worktree"])
async def test_the_head_reflog_of_a_worktree_outside_the_roots_stays_the_hosts(
    layout: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A "checkout: moving from evil to <branch>" entry planted in the HEAD reflog of a
    # checkout outside the roots: the user's `git checkout -` there switched to the
    # command's branch and wrote its executable outside every root (red team).
    checkout, branch, where = _branch_outside(layout, tmp_path, workspace)
    admin = Path(host_git(checkout, "rev-parse", "--absolute-git-dir").strip())
    reflog = admin / "logs" / "HEAD"
    before = reflog.read_bytes()
    plant = (
        f"B={branch} && {_EVIL_COMMIT} && git branch evil $c && h=$(git rev-parse $B)"
        ' && printf "%s %s t <t@e> 1700000000 +0000\\tcheckout: moving from evil to %s\\n"'
        f' $h $h $B >> "{reflog}"'
    )
    result = await _run(make_executor(mode="workspace-write"), plant, where)
    assert result.exit_code == 0, result.stderr.text
    assert reflog.read_bytes() == before
    host_git(checkout, "checkout", "-q", "-", check=False)
    assert not (checkout / "run-me.sh").exists()
    assert host_git(checkout, "symbolic-ref", "HEAD").strip() == f"refs/heads/{branch}"
    assert result.sandbox is not None
    # The reflog write alone is dropped, with a denial; the rest of the import goes on.
    reasons = [d.reason for d in result.sandbox.denials]
    assert any("worktree outside the writable roots" in r for r in reasons), reasons
    fsck_clean(checkout)


@pytest.mark.parametrize("layout", ["main worktree", "linked worktree"])
async def test_a_worktree_outside_the_roots_keeps_its_registration_and_gc_never_refuses_all(
    layout: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The command removed an outside worktree's admin dir (its checkout left without a
    # repository), and `git gc --auto` rewriting an outside worktree's HEAD reflog refused
    # the whole import, the command's commit with it.
    checkout, _branch, where = _branch_outside(layout, tmp_path, workspace)
    common = Path(
        host_git(where, "rev-parse", "--path-format=absolute", "--git-common-dir").strip()
    )
    other = tmp_path / "other"
    host_git(checkout, "worktree", "add", "-q", "-b", "other", str(other))
    admins = sorted(p.name for p in (common / "worktrees").iterdir())
    plant = (
        "echo work > work.txt && git add work.txt && git commit -qm work && "
        'git reflog expire --expire=now --all && rm -rf "$(git rev-parse '
        '--git-common-dir)/worktrees/other"'
    )
    result = await _run(make_executor(mode="workspace-write"), plant, where)
    assert result.exit_code == 0, result.stderr.text
    assert sorted(p.name for p in (common / "worktrees").iterdir()) == admins
    assert host_git(other, "status", "--short") == ""  # still a checkout of its repository
    log = host_git(where, "log", "-1", "--format=%s").strip()
    assert log == "work", result.sandbox
    assert result.sandbox is not None
    reasons = [d.reason for d in result.sandbox.denials]
    assert any("stays registered" in r for r in reasons), reasons
    fsck_clean(checkout)


@pytest.mark.parametrize("spelling", ["/proc/self/root", "a link and .."])
async def test_a_worktree_gitdir_the_executor_would_read_elsewhere_is_refused(
    spelling: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A new linked worktree's `gitdir` spelled `/proc/self/root<ws>/wt/.git`, or
    # `<ws>/L/../wt/.git` with `L` a link inside the workspace: host git resolves it into
    # the workspace, so the import took it, but the executor's own protections (the missing
    # worktree held, a link left at a worktree's path removed) read it lexically and saw
    # another path. A later command made the worktree a link out of the roots, and the
    # host's `git worktree repair` / `remove --force` wrote and deleted there (red team).
    repo = make_repo(workspace / "repo")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data").write_text("precious\n")
    if spelling == "/proc/self/root":
        named, wt = f"/proc/self/root{repo}/wt/.git", "wt"
    else:
        named, wt = f"{repo}/L/../wt/.git", "d/wt"
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        f"mkdir -p d/e && ln -s d/e L && git worktree add -q {wt} -b side"
        f" && printf '%s\\n' '{named}' > .git/worktrees/wt/gitdir",
        repo,
    )
    assert result.exit_code == 0, result.stderr.text
    assert _outcome(result) is GitImportStatus.REFUSED
    assert result.sandbox is not None
    refused = [r for o in result.sandbox.git for r in o.refused]
    assert any("worktrees/wt/gitdir" in r for r in refused), refused
    gitdir = repo / ".git" / "worktrees" / "wt" / "gitdir"
    assert not gitdir.exists() or gitdir.read_text() != f"{named}\n"
    relinked = await _run(ex, f"rm -rf {wt} && ln -s {victim} {wt}", repo)
    assert relinked.exit_code == 0, relinked.stderr.text
    host_git(repo, "worktree", "repair", check=False)
    host_git(repo, "worktree", "remove", "--force", "wt", check=False)
    assert sorted(os.listdir(victim)) == ["data"]
    fsck_clean(repo)


@pytest.mark.parametrize("target", ["into the workspace", "at nothing"])
async def test_an_outside_worktree_keeps_its_gitdir_and_so_its_branch_and_registration(
    target: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The command re-pointed an outside worktree's `gitdir` into the workspace (or at a
    # path that does not exist): the import took it, so that worktree counted as inside
    # from then on, and a later command moved its checked-out branch (the user's `git
    # reset --hard` there wrote the command's executable outside every root), or the
    # host's `git worktree prune` dropped its repository with what it had staged (red team).
    repo = make_repo(workspace / "repo")
    outside = tmp_path / "outside-wt"
    host_git(repo, "worktree", "add", "-q", "-b", "feat", str(outside))
    (outside / "staged.txt").write_text("the user's\n")
    host_git(outside, "add", "staged.txt")
    gitdir = repo / ".git" / "worktrees" / "outside-wt" / "gitdir"
    before = gitdir.read_bytes()
    new = repo / ("decoy" if target == "into the workspace" else "nowhere") / ".git"
    if target == "into the workspace":  # a checkout there: `git worktree prune` keeps it
        new.parent.mkdir()
        new.write_text(f"gitdir: {gitdir.parent}\n")
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, f"printf '%s\\n' {new} > .git/worktrees/outside-wt/gitdir", repo)
    assert result.exit_code == 0, result.stderr.text
    assert gitdir.read_bytes() == before
    assert result.sandbox is not None
    reasons = [d.reason for d in result.sandbox.denials if d.target.endswith("gitdir")]
    assert any("keeps its gitdir" in r for r in reasons), result.sandbox.denials
    host_git(repo, "worktree", "prune")
    assert host_git(outside, "diff", "--cached", "--name-only").split() == ["staged.txt"]
    branch = host_git(outside, "rev-parse", "feat").strip()
    moved = await _run(ex, f"B=feat && {_EVIL_COMMIT} && git update-ref refs/heads/feat $c", repo)
    assert moved.exit_code == 0, moved.stderr.text
    assert _outcome(moved) is GitImportStatus.CONFLICT
    assert host_git(outside, "rev-parse", "feat").strip() == branch
    host_git(outside, "reset", "-q", "--hard", check=False)
    assert not (outside / "run-me.sh").exists()
    fsck_clean(repo)


async def test_the_main_checkout_of_a_separate_git_dir_outside_the_roots_keeps_branch_and_index(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # `git init --separate-git-dir`: the main checkout outside the roots, its `.git` a file,
    # no `core.worktree`; the workspace a linked worktree of it. Git records no place for
    # that checkout, and the import took it as inside: the command moved its branch and
    # wrote its index, and the user's `git reset --hard` there wrote the command's
    # executable outside every root (red team). Unknown is outside now.
    store = tmp_path / "store.git"
    main = tmp_path / "main-checkout"
    host_git(tmp_path, "init", "-q", "-b", "main", f"--separate-git-dir={store}", str(main))
    (main / "f0.txt").write_text("file 0\n")
    host_git(main, "add", ".")
    host_git(main, "commit", "-qm", "start")
    wt = workspace / "wt"
    host_git(main, "worktree", "add", "-q", "-b", "side", str(wt))
    before = host_git(main, "rev-parse", "main").strip()
    index = (store / "index").read_bytes()
    command = (
        f"B=main && {_EVIL_COMMIT} && git update-ref refs/heads/main $c"
        " && GIT_INDEX_FILE=$(git rev-parse --git-common-dir)/index git read-tree $c"
    )
    result = await _run(make_executor(mode="workspace-write"), command, wt)
    assert result.exit_code == 0, result.stderr.text
    assert _outcome(result) in (GitImportStatus.REFUSED, GitImportStatus.CONFLICT)
    assert host_git(main, "rev-parse", "main").strip() == before
    assert (store / "index").read_bytes() == index
    host_git(main, "reset", "-q", "--hard", check=False)
    assert not (main / "run-me.sh").exists()
    assert (main / "f0.txt").read_text() == "file 0\n"
    fsck_clean(main)


async def test_a_bare_repository_has_no_checkout_and_takes_its_head(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # A bare repository (a local remote, named `remote.git`: not `.git`, no `core.worktree`)
    # has no checkout outside the roots to protect: its `HEAD` is the command's to change.
    repo = make_repo(workspace / "repo")
    bare = workspace / "remote.git"
    host_git(workspace, "clone", "-q", "--bare", str(repo), str(bare))
    host_git(bare, "branch", "other")
    result = await _run(
        make_executor(mode="workspace-write"), "git symbolic-ref HEAD refs/heads/other", bare
    )
    assert result.exit_code == 0, result.stderr.text
    assert _outcome(result) is GitImportStatus.APPLIED
    assert host_git(bare, "symbolic-ref", "HEAD").strip() == "refs/heads/other"
    fsck_clean(bare)


def _bisecting(checkout: Path) -> None:
    host_git(checkout, "bisect", "start", "side", "side~2")


def _rebasing(checkout: Path) -> None:
    host_git(
        checkout, "rebase", "-q", "-i", "side~1", env={"GIT_SEQUENCE_EDITOR": "sed -i 1ibreak"}
    )


def _applying(checkout: Path) -> None:
    host_git(checkout, "rebase", "-q", "--apply", "main", check=False)  # stops on a conflict


@pytest.mark.parametrize(
    "state",
    [("bisect", _bisecting), ("rebase-merge", _rebasing), ("rebase-apply", _applying)],
    ids=lambda s: s[0],
)
async def test_a_branch_bisected_or_rebased_outside_the_roots_is_never_moved(
    state: tuple[str, Callable[[Path], None]],
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
) -> None:
    # A worktree outside the roots bisecting or rebasing `side` (its HEAD detached):
    # git counts the branch as checked out, the import did not and moved it, and the
    # user's `git bisect reset` there checked out the command's executable (red team).
    repo = make_repo(workspace / "repo")
    outside = tmp_path / "outside-wt"
    host_git(repo, "worktree", "add", "-q", "-b", "side", str(outside))
    for i in (1, 2):
        (outside / "f0.txt").write_text(f"side {i}\n")
        host_git(outside, "commit", "-qam", f"side {i}")
    (repo / "f0.txt").write_text("main\n")
    host_git(repo, "commit", "-qam", "main")  # `rebase --apply main` conflicts on it
    state[1](outside)
    assert host_git(outside, "symbolic-ref", "-q", "HEAD", check=False) == ""  # detached
    before = host_git(repo, "rev-parse", "side").strip()
    command = f"B=side && {_EVIL_COMMIT} && git update-ref refs/heads/side $c"
    result = await _run(make_executor(mode="workspace-write"), command, repo)
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    [outcome] = result.sandbox.git
    assert outcome.status is GitImportStatus.CONFLICT, outcome
    assert [c.name for c in outcome.conflicts] == ["refs/heads/side"]
    assert host_git(repo, "rev-parse", "side").strip() == before
    host_git(outside, "bisect", "reset", check=False)
    host_git(outside, "rebase", "--abort", check=False)
    host_git(outside, "checkout", "-q", "side", check=False)
    assert not (outside / "run-me.sh").exists()
    fsck_clean(repo)


async def test_a_host_reflog_redated_to_1970_still_keeps_its_commits_through_gc(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # The command kept every entry of the host's reflogs but dated them 1970: the ids were
    # all still there, so no keep-ref, and the host's next `git gc` expired the entries and
    # pruned the commit only they named (red team). Entries are compared, dates with them.
    repo = make_repo(workspace / "repo")
    (repo / "w.txt").write_text("the user's work\n")
    host_git(repo, "add", "w.txt")
    host_git(repo, "commit", "-qm", "host work")
    work = host_git(repo, "rev-parse", "HEAD").strip()
    host_git(repo, "reset", "-q", "--hard", "HEAD~")  # now only in the reflogs
    redate = (
        "for f in .git/logs/HEAD .git/logs/refs/heads/main; do"
        ' sed -E "s/> [0-9]+ ([+-][0-9]{4})/> 100000 \\1/" $f > $f.new'
        " && cat $f.new > $f && rm $f.new; done"
    )
    result = await _run(make_executor(mode="workspace-write"), redate, repo)
    assert result.exit_code == 0, result.stderr.text
    assert _outcome(result) is GitImportStatus.APPLIED
    host_git(repo, "gc", "-q")  # expires the entries dated 1970
    host_git(repo, "gc", "-q", "--prune=now")
    host_git(repo, "cat-file", "-e", work)  # still in the host's store
    kept = host_git(repo, "for-each-ref", "--format=%(refname)", "refs/bash-sandbox/").split()
    assert result.sandbox is not None and set(kept) <= set(result.sandbox.git[0].applied)
    fsck_clean(repo)


@pytest.mark.parametrize("value", ["../..", "../../hooks", ".."])
async def test_a_new_submodules_worktree_inside_the_superprojects_git_dir_is_dropped(
    make_executor: ExecutorFactory, tmp_path: Path, workspace: Path, value: str
) -> None:
    # A submodule the command added, its new git dir's `core.worktree` pointed at the
    # superproject's `.git`: the import kept it (a real directory inside the worktree), and
    # the host's `git submodule foreach git reset --hard` checked the command's
    # `hooks/pre-commit` out into `.git/hooks`, which the next `git commit` ran (red team).
    repo = make_repo(workspace / "repo")
    marker = tmp_path / "pwned"
    command = (
        "set -e; mkdir src && cd src && git init -q -b main && mkdir hooks"
        f" && printf '#!/bin/sh\\ntouch {marker}\\n' > hooks/pre-commit"
        " && chmod +x hooks/pre-commit && mkdir -p objects && echo x > objects/x"
        " && git add hooks objects && git commit -qm payload && cd .."
        " && git -c protocol.file.allow=always submodule add -q ./src mod 2>/dev/null"
        " && git commit -qm 'add submodule' && rm -rf src mod/hooks mod/objects"
        f" && git config -f .git/modules/mod/config core.worktree {value}"
    )
    result = await _run(make_executor(mode="workspace-write"), command, repo)
    if result.exit_code != 0 and os.geteuid() != 0:
        pytest.xfail("git submodule add inside the sandbox fails as an unprivileged user")
    assert result.exit_code == 0, result.stderr.text
    module = repo / ".git" / "modules" / "mod"
    assert (module / "HEAD").exists()  # imported, as a new repository
    kept = host_git(module, "config", "--file", "config", "--get", "core.worktree", check=False)
    assert kept.strip() != value
    hooks_before = sorted(os.listdir(repo / ".git" / "hooks"))
    host_git(repo, "submodule", "foreach", "-q", "git reset -q --hard", check=False)
    host_git(repo / "mod", "checkout", "--", ".", check=False)
    (repo / "f0.txt").write_text("edited\n")
    host_git(repo, "commit", "-qam", "edit", check=False)
    assert not marker.exists()
    assert sorted(os.listdir(repo / ".git" / "hooks")) == hooks_before
    assert not (repo / ".git" / "objects" / "x").exists()
    fsck_clean(repo)


async def test_a_submodule_added_in_the_sandbox_keeps_its_worktree_on_the_host(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    repo = make_repo(workspace / "repo")
    marker = workspace.parent / "pwned"
    command = (
        "set -e; mkdir src && cd src && git init -q -b main && echo a > a && git add a"
        " && git commit -qm a && cd .."
        " && git -c protocol.file.allow=always submodule add -q ./src mod 2>/dev/null"
        " && git commit -qm sub && cfg=.git/modules/mod/config"
        f" && git config -f $cfg core.fsmonitor 'touch {marker}'"
        f" && git config -f $cfg remote.origin.uploadpack 'touch {marker}; git-upload-pack'"
        " && git config -f $cfg remote.evil.url 'ext::sh -c touch% /tmp/x'"
    )
    result = await _run(make_executor(mode="workspace-write"), command, repo)
    if result.exit_code != 0 and os.geteuid() != 0:
        pytest.xfail("git submodule add inside the sandbox fails as an unprivileged user")
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    assert {o.status for o in result.sandbox.git} == {GitImportStatus.APPLIED}
    module = repo / ".git" / "modules" / "mod"
    worktree = host_git(module, "config", "--file", "config", "--get", "core.worktree")
    assert worktree.strip() == "../../../mod"
    assert host_git(repo / "mod", "log", "--format=%s").split() == ["a"]
    assert host_git(repo, "submodule", "status").split()[1] == "mod"
    # Its remote and tracking came back (data keys only): the user's pull works, and runs
    # nothing the command configured.
    assert host_git(repo / "mod", "remote").split() == ["origin"]
    assert host_git(repo / "mod", "rev-parse", "--abbrev-ref", "main@{upstream}").strip() == (
        "origin/main"
    )
    host_git(repo / "mod", "-c", "protocol.file.allow=always", "pull", "-q")
    host_git(repo / "mod", "status")
    assert not marker.exists()


SKIP_CRAFT = r"""
import hashlib, struct, subprocess, sys
blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], input=b"x\n",
                      capture_output=True, check=True).stdout.strip().decode()
def entry(path, skip):
    e = struct.pack(">10I", 0, 0, 0, 0, 0, 0, 0o100644, 0, 0, 2) + bytes.fromhex(blob)
    e += struct.pack(">H", len(path) | (0x4000 if skip else 0))
    e += (struct.pack(">H", 0x4000) if skip else b"") + path.encode()
    return e + b"\0" * (8 - len(e) % 8)
body = b"DIRC" + struct.pack(">II", 3, 2) + entry("a", True) + entry("a/b", False)
open(".git/index", "wb").write(body + hashlib.sha1(body).digest())
"""


async def test_an_index_git_cannot_mark_sparse_is_refused_and_its_layer_not_kept(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # A skip-worktree `a` beside `a/b`: the rebuilt index drops `a`, and marking it sparse
    # failed with an exception, so the import failed as a whole and kept its upper layer
    # (the command's objects with it) on every run, past the bound of kept layers (red team).
    repo = make_repo(workspace / "repo")
    host_git(repo, "config", "core.sparseCheckout", "true")  # new skip-worktree bits kept
    (repo / "craft.py").write_text(SKIP_CRAFT)
    index_before = (repo / ".git" / "index").read_bytes()
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, "python3 craft.py && git ls-files -t", repo)
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    [outcome] = result.sandbox.git
    assert outcome.status is GitImportStatus.REFUSED
    assert any("git refuses its entries" in r for r in outcome.refused), outcome
    assert not any("import failed" in r for r in outcome.refused), outcome
    assert (repo / ".git" / "index").read_bytes() == index_before
    fsck_clean(repo)
