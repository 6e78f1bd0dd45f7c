"""The git import as one transaction: a crash at every write point, a killed harness, host
locks, host commits, a full disk, oversized and sparse state. Each checked with host git:
`git fsck --full` clean and the command's commit reachable (a branch or a keep-ref)."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bash_sandbox import state as executor_state
from bash_sandbox.git_import import (
    KEEP_NAMESPACE,
    WRITE_POINTS,
    import_changes,
    load_snapshot,
    recover,
)
from bash_seam import GitImportStatus
from tests.sandbox.conftest import private_tmpfs
from tests.sandbox.git_import_harness import (
    Overlay,
    commits_on_both_sides,
    fsck_clean,
    host_git,
    make_repo,
    reachable,
)

# A commit on a new branch the command switches to, a staged file, a message file.
COMMAND = (
    "git switch -q -c feature && echo two > two.txt && git add two.txt && "
    "git commit -qm two && echo staged > staged.txt && git add staged.txt"
)


@pytest.fixture(params=["ext4", "tmpfs"])
def state_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    if request.param == "ext4":
        yield tmp_path / "state"
    else:
        with private_tmpfs(tmp_path / "state-tmpfs") as path:
            yield path


def _command_commit(ov: Overlay) -> str:
    ov.run(COMMAND)
    return (ov.upper / "refs" / "heads" / "feature").read_text().strip()


def _leftovers(repo: Path) -> list[str]:
    git = repo / ".git"
    names = [p.name for p in git.rglob("*") if p.name.startswith(".bash-sandbox")]
    return names + [n for n in ("index.lock", "HEAD.lock") if (git / n).exists()]


def test_a_commit_branch_and_staged_file_land_as_one_transaction(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state")
    commit = _command_commit(ov)
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    result = import_changes(snap)
    assert result.outcome is not None and result.outcome.status is GitImportStatus.APPLIED
    assert host_git(repo, "rev-parse", "feature").strip() == commit
    assert host_git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/feature"
    assert "staged.txt" in host_git(repo, "diff", "--cached", "--name-only")
    assert host_git(repo, "for-each-ref", KEEP_NAMESPACE) == ""  # dropped once applied
    assert _leftovers(repo) == []
    fsck_clean(repo)


@pytest.mark.parametrize("point", WRITE_POINTS)
def test_a_crash_at_every_write_point_loses_nothing(
    point: str, tmp_path: Path, state_dir: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, state_dir)
    commit = _command_commit(ov)
    main = host_git(repo, "rev-parse", "main").strip()
    assert ov.import_in_child(crash=point) == 86, f"the import never reached {point}"
    # Right after the crash, before any recovery: clean, and the commit is on the host.
    fsck_clean(repo)
    assert reachable(repo, commit)
    # The next executor's sweep: rolled forward or back, then safe to remove.
    assert recover(str(state_dir))
    fsck_clean(repo)
    assert reachable(repo, commit)
    assert _leftovers(repo) == []
    head = host_git(repo, "symbolic-ref", "HEAD").strip()
    if head == "refs/heads/feature":  # rolled forward: all of it
        assert host_git(repo, "rev-parse", "feature").strip() == commit
        assert "staged.txt" in host_git(repo, "diff", "--cached", "--name-only")
    else:  # rolled back: none of it, the commit kept
        assert head == "refs/heads/main"
        assert host_git(repo, "rev-parse", "main").strip() == main
        assert host_git(repo, "diff", "--cached", "--name-only") == ""
        assert host_git(repo, "for-each-ref", KEEP_NAMESPACE) != ""


def test_random_kills_of_the_harness_during_the_import_lose_nothing(tmp_path: Path) -> None:
    rng = random.Random(21)
    for round_ in range(4):
        repo = make_repo(tmp_path / f"repo{round_}")
        state = tmp_path / f"state{round_}"
        ov = Overlay(repo, state)
        commit = _command_commit(ov)
        code = (
            "from bash_sandbox.git_import import import_changes, load_snapshot\n"
            f"import_changes(load_snapshot({str(ov.upper)!r}))\n"
        )
        child = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(rng.uniform(0.05, 0.4))
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        # A git child of the killed harness may still finish its own step: wait for it.
        time.sleep(0.3)
        fsck_clean(repo)
        assert recover(str(state))
        fsck_clean(repo)
        assert reachable(repo, commit)
        assert _leftovers(repo) == []


@pytest.mark.parametrize("lock", ["index.lock", "refs/heads/main.lock", "HEAD.lock"])
def test_a_lock_the_host_holds_is_a_conflict_and_nothing_is_applied(
    lock: str, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state")
    ov.run("echo more >> f0.txt && git commit -qam more && echo x > x && git add x")
    commit = (ov.upper / "refs" / "heads" / "main").read_text().strip()
    before = host_git(repo, "rev-parse", "main").strip()
    index_before = (repo / ".git" / "index").read_bytes()
    held = repo / ".git" / lock
    held.write_bytes(b"the host's git is mid-operation\n")
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None and outcome.status is GitImportStatus.CONFLICT, outcome
    assert outcome.kept_at is not None and outcome.applied == ()
    assert held.read_bytes() == b"the host's git is mid-operation\n"  # untouched
    held.unlink()
    assert host_git(repo, "rev-parse", "main").strip() == before
    assert (repo / ".git" / "index").read_bytes() == index_before
    assert host_git(repo, "rev-parse", f"{outcome.kept_at}/heads/main").strip() == commit
    fsck_clean(repo)


def test_a_host_commit_during_the_command_is_a_conflict_and_both_commits_stay(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    ours, theirs, outcome = commits_on_both_sides(Overlay(repo, tmp_path / "state"), repo)
    assert outcome is not None and outcome.status is GitImportStatus.CONFLICT
    # The ref, and the index the host staged into meanwhile.
    assert [c.name for c in outcome.conflicts] == ["refs/heads/main", "index"]
    assert outcome.conflicts[0].host == theirs and outcome.conflicts[0].command == ours
    assert host_git(repo, "rev-parse", "main").strip() == theirs
    assert reachable(repo, ours)
    fsck_clean(repo)


def test_a_full_disk_applies_nothing_and_leaves_no_partial_file(tmp_path: Path) -> None:
    with private_tmpfs(tmp_path / "small", "2m") as mounted:
        repo = make_repo(mounted / "repo")
        ov = Overlay(repo, tmp_path / "state")
        # Incompressible: 3 MiB of it cannot fit the 2 MiB filesystem the host repo is on
        # (the object goes to the upper layer, off that filesystem; no work tree file).
        ov.run(
            "b=$(head -c 3145728 /dev/urandom | git hash-object -w --stdin) && "
            "git update-index --add --cacheinfo 100644,$b,big && git commit -qm big"
        )
        before = host_git(repo, "rev-parse", "main").strip()
        snap = load_snapshot(str(ov.upper))
        assert snap is not None
        outcome = import_changes(snap).outcome
        assert outcome is not None and outcome.status is GitImportStatus.REFUSED
        assert any("objects" in r for r in outcome.refused), outcome
        assert host_git(repo, "rev-parse", "main").strip() == before
        assert _leftovers(repo) == []
        partial = [p.name for p in (repo / ".git" / "objects").rglob("*tmp*")]
        assert partial == []
        fsck_clean(repo)


def test_a_sparse_pack_is_refused_without_reading_it(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state")
    ov.run("echo more >> f0.txt && git commit -qam more")
    pack = ov.upper / "objects" / "pack" / ("pack-" + "1" * 40 + ".pack")
    pack.parent.mkdir(parents=True, exist_ok=True)
    with open(pack, "wb") as fh:
        fh.truncate(768 << 20)
    before_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_rss
    assert outcome is not None and outcome.status is GitImportStatus.REFUSED
    assert any("sparse" in r for r in outcome.refused)
    assert grown_kib < 64 * 1024, f"the import grew the executor by {grown_kib} KiB"
    assert not list((repo / ".git" / "objects" / "pack").glob("pack-1111*"))
    fsck_clean(repo)


def test_git_state_over_the_cap_is_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state")
    ov.run("head -c 200000 /dev/urandom > big && git add big && git commit -qm big")
    before = host_git(repo, "rev-parse", "main").strip()
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap, cap=100_000).outcome
    assert outcome is not None and outcome.status is GitImportStatus.REFUSED
    assert "cap" in outcome.refused[0]
    assert host_git(repo, "rev-parse", "main").strip() == before


def test_links_fifos_and_alternates_among_the_objects_are_never_read(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    secret = tmp_path / "secret"
    secret.write_text("host secret\n")
    ov = Overlay(repo, tmp_path / "state")
    commit = _command_commit(ov)
    pack = ov.upper / "objects" / "pack"
    pack.mkdir(parents=True, exist_ok=True)
    (pack / ("pack-" + "2" * 40 + ".pack")).symlink_to(secret)
    os.mkfifo(pack / ("pack-" + "2" * 40 + ".idx"))  # opening it would block the import
    (ov.upper / "objects" / "info").mkdir(exist_ok=True)
    (ov.upper / "objects" / "info" / "alternates").write_text(f"{tmp_path}/elsewhere\n")
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    result = import_changes(snap)
    assert result.outcome is not None and result.outcome.status is GitImportStatus.APPLIED
    assert host_git(repo, "rev-parse", "feature").strip() == commit
    refused = {rel for rel, _why in result.denials}
    assert "objects/info/alternates" in refused
    assert {f"objects/pack/pack-{'2' * 40}.pack", f"objects/pack/pack-{'2' * 40}.idx"} <= refused
    assert not (repo / ".git" / "objects" / "info" / "alternates").exists()
    fsck_clean(repo)


def test_the_sweep_of_a_dead_executor_imports_its_commits_before_removing_its_state(
    tmp_path: Path,
) -> None:
    from bash_sandbox.state import sweep_stale

    repo = make_repo(tmp_path / "repo")
    parent = tmp_path / "parent"
    dead = parent / "exec-dead"
    ov = Overlay(repo, dead)
    (dead / "lock").write_text("")  # nobody holds it: its executor is gone
    commit = _command_commit(ov)  # the command ran; its executor died before importing
    assert not reachable(repo, commit)
    sweep_stale(str(parent))
    assert not dead.exists()
    assert reachable(repo, commit)  # kept at a keep-ref, not applied
    assert host_git(repo, "rev-parse", "main").strip() != commit
    assert host_git(repo, "for-each-ref", KEEP_NAMESPACE) != ""
    fsck_clean(repo)


def test_a_branch_switch_on_the_host_during_the_command_applies_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state")
    ov.run("echo new > new.txt && git add new.txt && git commit -qm new")
    ours = (ov.upper / "refs" / "heads" / "main").read_text().strip()
    before = host_git(repo, "rev-parse", "main").strip()
    host_git(repo, "switch", "-q", "-c", "elsewhere")
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None and outcome.status is GitImportStatus.CONFLICT
    assert "HEAD" in [c.name for c in outcome.conflicts]
    assert host_git(repo, "rev-parse", "main").strip() == before
    assert host_git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/elsewhere"
    assert host_git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    assert reachable(repo, ours)
    fsck_clean(repo)


def test_a_fetch_moves_remote_refs_and_leaves_the_remotes_head_symbolic(tmp_path: Path) -> None:
    origin = make_repo(tmp_path / "origin")
    subprocess.run(
        ["git", "clone", "-q", str(origin), str(tmp_path / "repo")],
        env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"},
        check=True,
    )
    repo = tmp_path / "repo"
    (origin / "later.txt").write_text("later\n")
    host_git(origin, "add", "later.txt")
    host_git(origin, "commit", "-qm", "later")
    ov = Overlay(repo, tmp_path / "state")
    ov.run("git fetch -q origin && git merge -q --ff-only origin/main")
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None and outcome.status is GitImportStatus.APPLIED, outcome
    assert host_git(repo, "log", "-1", "--format=%s", "origin/main").strip() == "later"
    assert host_git(repo, "log", "-1", "--format=%s", "main").strip() == "later"
    assert host_git(repo, "symbolic-ref", "refs/remotes/origin/HEAD").strip() == (
        "refs/remotes/origin/main"
    )
    fsck_clean(repo)


def test_a_gitlink_added_in_an_index_v4_is_reported(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state")
    head = host_git(repo, "rev-parse", "HEAD").strip()
    ov.run(
        "git update-index --index-version 4"
        f" && git update-index --add --cacheinfo 160000,{head},vendor/x"
    )
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    result = import_changes(snap)
    assert result.new_gitlinks == ["vendor/x"]
    assert result.outcome is not None and result.outcome.status is GitImportStatus.APPLIED
    assert "160000" in host_git(repo, "ls-files", "-s", "vendor/x")
    fsck_clean(repo)


def test_the_skip_worktree_bits_of_a_sparse_checkout_survive_the_rebuilt_index(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo", files=2)
    # A sparse checkout: the bits the command's git sets are kept (elsewhere new ones hide
    # its edits from host git, round 15), on files left out of the worktree as git does.
    host_git(repo, "config", "core.sparseCheckout", "true")
    ov = Overlay(repo, tmp_path / "state")
    ov.run(
        "git update-index --skip-worktree f1.txt && rm f1.txt && echo n > n.txt && git add n.txt"
    )
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None and outcome.status is GitImportStatus.APPLIED
    tags = host_git(repo, "ls-files", "-t").split("\n")
    assert tags[:3] == ["H f0.txt", "S f1.txt", "H n.txt"]
    fsck_clean(repo)


def test_an_intent_to_add_stays_one_and_is_not_staged_empty(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state")
    ov.run("echo later > later.txt && git add -N later.txt && echo s > s.txt && git add s.txt")
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None and outcome.status is GitImportStatus.APPLIED
    # Staged: only s.txt; later.txt is a new file not yet added (git's own `-N` listing).
    assert host_git(repo, "diff", "--cached", "--name-only").split() == ["s.txt"]
    assert host_git(repo, "diff", "--name-only").split() == ["later.txt"]
    fsck_clean(repo)


def _flushes_by_command(trace: Path) -> list[tuple[str, str, int]]:
    """(git directory, subcommand, hardware flushes) of each git process in a trace2 event
    log (GIT_TRACE2_EVENT: one JSON object a line, each naming its process's session)."""
    started: dict[str, list[str]] = {}
    flushes: dict[str, int] = {}
    for line in trace.read_text().splitlines():
        event = json.loads(line)
        sid = event.get("sid", "")
        if event.get("event") == "start":
            started[sid] = event.get("argv", [])
        elif event.get("event") == "data" and event.get("key") == "fsync/hardware-flush":
            flushes[sid] = flushes.get(sid, 0) + int(event.get("value", 0))
    out = []
    for sid, argv in started.items():
        gitdir = next((a.split("=", 1)[1] for a in argv if a.startswith("--git-dir=")), "")
        command = next((a for a in argv[1:] if a in {"update-ref", "fetch", "update-index"}), "")
        if command:
            out.append((gitdir, command, flushes.get(sid, 0)))
    return out


def test_the_host_receives_durably_and_the_scratch_view_flushes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bash_sandbox.git_import import gitcmd

    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state")
    commit = _command_commit(ov)
    trace = tmp_path / "trace2.txt"
    monkeypatch.setenv("GIT_TRACE2_EVENT", str(trace))
    monkeypatch.setattr(gitcmd, "_KEPT_ENV", (*gitcmd._KEPT_ENV, "GIT_TRACE2_EVENT"))
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    result = import_changes(snap)
    assert result.outcome is not None and result.outcome.status is GitImportStatus.APPLIED
    assert host_git(repo, "rev-parse", "feature").strip() == commit
    runs = _flushes_by_command(trace)
    host = [(c, n) for d, c, n in runs if d == str(repo / ".git")]
    view = [(c, n) for d, c, n in runs if d != str(repo / ".git")]
    # What the host's repository receives is flushed: the objects, the refs the import
    # applies (the keep-refs' deletion afterwards flushes nothing in git itself).
    assert sum(n for c, n in host if c == "fetch") > 0, host
    assert any(c == "update-ref" and n > 0 for c, n in host), host
    # The import's scratch view: its carrier refs are written, never flushed.
    assert ("update-ref", 0) in view, view


def test_a_full_disk_keeps_the_commits_until_a_later_sweep_imports_them(tmp_path: Path) -> None:
    # The host's disk is full when the command's commit is imported: git refuses the objects
    # and nothing is applied. The upper layer is then their only copy: it leaves the
    # executor's state for a directory of its own (`exec-kept-*`), which a later executor's
    # sweep imports into keep-refs once the disk has room, and only then removes.
    with private_tmpfs(tmp_path / "small", "8m") as mounted:
        repo = make_repo(mounted / "repo")
        filler = mounted / "filler"
        filler.write_bytes(b"\0" * (6 << 20))  # what is left cannot hold a 3 MiB object
        parent = tmp_path / "state"
        ov = Overlay(repo, parent / "exec-gone")
        ov.run(
            "b=$(head -c 3145728 /dev/urandom | git hash-object -w --stdin) && "
            "git update-index --add --cacheinfo 100644,$b,big && git commit -qm precious"
        )
        commit = (ov.upper / "refs" / "heads" / "main").read_text().strip()  # the command's
        snap = load_snapshot(str(ov.upper))
        assert snap is not None
        result = import_changes(snap)
        assert result.outcome is not None and result.outcome.status is GitImportStatus.REFUSED
        assert result.unimported
        base = ov.upper.parent
        executor_state._keep_unimported(str(base), str(parent))
        [kept] = parent.glob("exec-kept-*")
        assert not base.exists() and (kept / "git" / "1" / "upper").is_dir()
        # A sweep while the disk is still full: kept, and marked for a later try.
        executor_state.sweep_stale(str(parent))
        marker = kept / "recovery-failed"
        assert kept.is_dir() and marker.exists()
        # Within the retry interval a sweep does not try again (every executor start sweeps).
        past = time.time() - 5
        os.utime(marker, (past, past))
        executor_state.sweep_stale(str(parent))
        assert marker.stat().st_mtime == pytest.approx(past, abs=1)
        # Room again, the interval over: imported into keep-refs, and only then removed.
        filler.unlink()
        os.utime(marker, (past - 3600, past - 3600))
        executor_state.sweep_stale(str(parent))
        assert not kept.exists()
        assert host_git(repo, "for-each-ref", KEEP_NAMESPACE).strip()
        assert reachable(repo, commit), "the command's commit is in no ref of the host"
        fsck_clean(repo)


def _plant_wrong_hash(ov: Overlay, run: int) -> str:
    """The command commits a blob stored under another content's hash: git's checks refuse
    it at the host's fetch whatever the room. Returns the command's commit."""
    oid = subprocess.run(
        ["git", "hash-object", "--stdin"],
        input=f"reviewed {run}\n".encode(),
        capture_output=True,
        check=True,
    ).stdout.decode()
    oid = oid.strip()
    ov.run(
        'python3 -c "import os, sys, zlib; oid = sys.argv[1];'
        " d = os.path.join('.git/objects', oid[:2]); os.makedirs(d, exist_ok=True);"
        " open(os.path.join(d, oid[2:]), 'wb').write(zlib.compress(b'blob 5\\0evil\\n'))\""
        f" {oid} && git update-index --add --cacheinfo 100644,{oid},f{run} &&"
        f" git commit -qm planted{run}"
    )
    return (ov.upper / "refs" / "heads" / "main").read_text().strip()


def _fill_disk(ov: Overlay, run: int) -> str:
    ov.run(
        "b=$(head -c 3145728 /dev/urandom | git hash-object -w --stdin) && "
        f"git update-index --add --cacheinfo 100644,$b,big{run} && git commit -qm run{run}"
    )
    return (ov.upper / "refs" / "heads" / "main").read_text().strip()


def _import_three(
    repo: Path, parent: Path, command: Callable[[Overlay, int], str]
) -> list[tuple[str, Any]]:
    """Three commands' imports refused by the host, each upper layer kept when the import
    says so (as `ExecutorState.recycle_upper` does)."""
    results = []
    for run in range(3):
        ov = Overlay(repo, parent / f"exec-gone{run}")
        commit = command(ov, run)
        snap = load_snapshot(str(ov.upper))
        assert snap is not None
        result = import_changes(snap)
        assert result.outcome is not None
        assert result.outcome.status is GitImportStatus.REFUSED, result.outcome
        if result.unimported:
            executor_state._keep_unimported(str(ov.upper.parent), str(parent))
        results.append((commit, result))
    return results


def test_layers_git_refuses_with_room_are_kept_up_to_a_bound_and_never_dropped_by_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Objects git refuses for what they are, with room on the host's disk: a command could
    # leave one kept layer per run, each retried a minute. At most KEPT_MAX are kept; a
    # first import past it is refused as before the layers were kept, and says so; a sweep
    # at the bound never drops one that is kept.
    monkeypatch.setattr(executor_state, "KEPT_MAX", 2)
    repo = make_repo(tmp_path / "repo")
    parent = tmp_path / "state"
    results = _import_three(repo, parent, _plant_wrong_hash)
    assert [r.unimported for _, r in results] == [True, True, False]
    third = results[2][1].outcome
    assert any("not kept: 2 imports" in why for why in third.refused), third.refused
    assert len(list(parent.glob("exec-kept-*"))) == 2
    executor_state.sweep_stale(str(parent))  # still refused: both stay, marked
    kept = list(parent.glob("exec-kept-*"))
    assert len(kept) == 2 and all((k / "recovery-failed").exists() for k in kept)
    for commit, _ in results:
        assert not reachable(repo, commit)
    fsck_clean(repo)


def test_layers_a_full_disk_refuses_are_kept_past_the_bound_and_all_land_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The disk's refusals are kept whatever the bound (no commit lost to a full disk): three
    # under a bound of 2, and once there is room every one lands in keep-refs.
    monkeypatch.setattr(executor_state, "KEPT_MAX", 2)
    with private_tmpfs(tmp_path / "small", "16m") as mounted:
        repo = make_repo(mounted / "repo")
        filler = mounted / "filler"
        filler.write_bytes(b"\0" * (14 << 20))  # room for all three once it goes
        parent = tmp_path / "state"
        results = _import_three(repo, parent, _fill_disk)
        assert [r.unimported for _, r in results] == [True, True, True]
        assert len(list(parent.glob("exec-kept-*"))) == 3
        filler.unlink()
        executor_state.sweep_stale(str(parent))
        assert list(parent.glob("exec-kept-*")) == []
        assert all(reachable(repo, commit) for commit, _ in results)
        fsck_clean(repo)


@pytest.mark.parametrize(
    "change",
    [
        {"admin": "", "rel": "config"},
        {"admin": "../../outside", "rel": "canary"},
        {"admin": "", "rel": "../../outside/canary"},
        {"admin": "hooks", "rel": "pre-commit"},
        {"admin": "worktrees/..", "rel": "HEAD"},
        {"admin": "", "rel": "HEAD", "elsewhere": True},
    ],
    ids=["config", "admin-dots", "rel-dots", "hooks", "worktree-dots", "source-outside"],
)
def test_a_planted_journal_is_refused_and_writes_nothing(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    # A command that could write an executor's state (another TMPDIR's base inside its
    # workspace) planted a committed journal; the next executor's start recovered it and
    # wrote any file it named, and replaced a repository's config (found by a red team,
    # then `git status` there ran the planted fsmonitor). A journal names only what an
    # import writes, below the repository, from its own work dir; else nothing is applied.
    repo = make_repo(tmp_path / "victim")
    gitdir = repo / ".git"
    config_before = (gitdir / "config").read_bytes()
    head_before = (gitdir / "HEAD").read_bytes()
    outside = tmp_path / "outside"
    outside.mkdir()
    state = tmp_path / "state"
    work = state / "git" / "1" / "import" / "work"
    work.mkdir(parents=True)
    (state / "git" / "1" / "upper").mkdir()
    payload = (tmp_path / "payload") if change.pop("elsewhere", False) else (work / "payload")
    payload.write_text('[core]\n\tfsmonitor = "touch pwned; false"\n')
    journal = {
        "gitdir": str(gitdir), "run_id": "x", "keep_prefix": "refs/bash-sandbox/x",
        "keep_refs": {}, "refs": [], "heads": [], "indexes": [], "old_heads": {},
        "files": [{**change, "source": str(payload), "is_dir": False}], "committed": True,
    }  # fmt: skip
    (work / "journal.json").write_text(json.dumps(journal))
    recover(str(state))
    assert (gitdir / "config").read_bytes() == config_before
    assert (gitdir / "HEAD").read_bytes() == head_before
    assert os.listdir(outside) == []
    assert not (gitdir / "hooks" / "pre-commit").exists()
    fsck_clean(repo)


def test_an_import_a_full_disk_stops_before_the_fetch_keeps_the_commits(tmp_path: Path) -> None:
    # The executor's state fills up (the rebuilt index is written there before any object
    # reaches the host): the import fails, and so does the keep-only retry. The upper layer
    # is the only copy of the command's commit: it must be marked and kept, never recycled.
    from bash_sandbox.git_plane import merge_back
    from bash_sandbox.view import GitOverlay

    repo = make_repo(tmp_path / "repo")
    with private_tmpfs(tmp_path / "small", "16m") as mounted:
        parent = mounted / "state"
        ov = Overlay(repo, parent / "exec-gone")
        ov.run(
            "mkdir d && for i in $(seq 1500); do echo $i > d/f$i; done && "
            "git add d && git commit -qm precious"
        )
        commit = (ov.upper / "refs" / "heads" / "main").read_text().strip()
        filler = mounted / "filler"
        # Every block left, then some: the disk is full (16 MiB: bounded by 64 writes).
        with open(filler, "wb") as fh, pytest.raises(OSError):
            for _ in range(1024):
                fh.write(b"\0" * (1 << 16))
                fh.flush()
        report = merge_back(GitOverlay(str(repo / ".git"), str(ov.upper), str(ov.work)), 0)
        [outcome] = report.outcomes
        assert outcome.status is GitImportStatus.REFUSED, outcome
        assert "the import failed" in outcome.refused[0], outcome
        assert "git state is kept" in outcome.refused[0], outcome
        assert not reachable(repo, commit)  # nothing landed: not applied, not lost either
        # What the executor does with the layer now: kept out of its state, not recycled.
        state = executor_state.ExecutorState.__new__(executor_state.ExecutorState)
        state.path = str(parent / "exec-gone")
        executor_state.ExecutorState.recycle_upper(
            state, executor_state.GitUpper(str(ov.upper), str(ov.work)), ()
        )
        [kept] = parent.glob("exec-kept-*")
        # Room again: a later executor's sweep imports the commit into keep-refs.
        filler.unlink()
        for marker in kept.glob("recovery-failed"):
            os.utime(marker, (0, 0))
        executor_state.sweep_stale(str(parent))
        assert not kept.exists()
        assert reachable(repo, commit), "the command's commit is in no ref of the host"
        assert host_git(repo, "for-each-ref", KEEP_NAMESPACE).strip()
        fsck_clean(repo)


@pytest.mark.parametrize("host_step", ["add", "commit"])
def test_a_host_index_change_while_the_objects_are_fetched_is_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_step: str
) -> None:
    # The command only stages (no ref of its own moves). The host's `git add` or `git commit`
    # lands after the plan compared the index and before the rebuilt one is installed (the
    # fetch of a large object takes that long): installing it would drop the host's work.
    from bash_sandbox.git_import import importer

    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state" / "exec-x")
    ov.run("echo staged > staged.txt && git add staged.txt")
    (repo / "host.txt").write_text("host work\n")

    def host_acts(point: str) -> None:
        if point == "objects":  # right after the fetch, before the locks
            if host_step == "add":
                host_git(repo, "add", "host.txt")
            else:
                host_git(repo, "add", "host.txt")
                host_git(repo, "commit", "-qm", "host commit")

    monkeypatch.setattr(importer, "crash_point", host_acts)
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    result = import_changes(snap)
    assert result.outcome is not None
    assert result.outcome.status is GitImportStatus.CONFLICT, result.outcome
    # The host's work is all there: staged (or committed), and nothing reverted it.
    assert "host.txt" in host_git(repo, "ls-files")
    assert host_git(repo, "diff", "--cached", "--name-status", "HEAD").strip() in (
        "",
        "A\thost.txt",
    )
    assert not (repo / ".git" / "index.lock").exists()
    fsck_clean(repo)


@pytest.mark.parametrize("host_step", ["nothing", "moves main again", "stages a file"])
def test_a_commit_on_the_hosts_new_tip_fast_forwards_unless_the_host_acts_during_the_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_step: str
) -> None:
    # The host commits after the snapshot; the command sees that commit through the overlay
    # and commits on it: a fast-forward of `main`, applied. One more host move of `main`,
    # or a file the host stages, between the fetch and the ref transaction is a conflict:
    # the compare-and-swap is on the host's value, the index compared under git's lock.
    from bash_sandbox.git_import import importer

    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state" / "exec-x")
    (repo / "host.txt").write_text("host\n")
    host_git(repo, "add", "host.txt")
    host_git(repo, "commit", "-qm", "host")
    tip = host_git(repo, "rev-parse", "main").strip()
    made = "echo c > c.txt && git add c.txt && git commit -qm command && git rev-parse @ @~"
    ours, parent = ov.run(made).split()
    assert parent == tip  # the command built on the host's commit
    again = host_git(repo, "commit-tree", "-p", tip, "-m", "again", f"{tip}^{{tree}}").strip()

    def host_acts(point: str) -> None:
        if point == "objects" and host_step == "moves main again":
            host_git(repo, "update-ref", "refs/heads/main", again)
        elif point == "objects" and host_step == "stages a file":
            (repo / "staged.txt").write_text("host work\n")
            host_git(repo, "add", "staged.txt")

    monkeypatch.setattr(importer, "crash_point", host_acts)
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None
    if host_step == "nothing":
        assert outcome.status is GitImportStatus.APPLIED, outcome
        assert host_git(repo, "rev-parse", "main").strip() == ours
        assert host_git(repo, "status", "--porcelain") == ""
    else:
        assert outcome.status is GitImportStatus.CONFLICT, outcome
        assert host_git(repo, "rev-parse", "main").strip() == (
            again if host_step == "moves main again" else tip
        )
        assert reachable(repo, ours)
        staged = host_git(repo, "diff", "--cached", "--name-only").split()
        assert staged == (["staged.txt"] if host_step == "stages a file" else [])
    assert not (repo / ".git" / "index.lock").exists()
    fsck_clean(repo)


def test_a_fast_forward_whose_host_index_is_not_the_tips_tree_is_a_conflict(
    tmp_path: Path,
) -> None:
    # The host moved `main` without its index (`git update-ref`): the index the command saw
    # was not the new tip's, so it is not taken, nor is `main` moved without it.
    repo = make_repo(tmp_path / "repo")
    start = host_git(repo, "rev-parse", "main").strip()
    host_git(repo, "switch", "-q", "-c", "other")
    (repo / "other.txt").write_text("other\n")
    host_git(repo, "add", "other.txt")
    host_git(repo, "commit", "-qm", "other")
    host_git(repo, "switch", "-q", "main")
    ov = Overlay(repo, tmp_path / "state" / "exec-x")
    index = (repo / ".git" / "index").read_bytes()
    tip = host_git(repo, "commit-tree", "-p", start, "-m", "host", "other^{tree}").strip()
    host_git(repo, "update-ref", "refs/heads/main", tip)
    made = "echo c > c.txt && git add c.txt && git commit -qm command && git rev-parse @ @~"
    ours, parent = ov.run(made).split()
    assert parent == tip
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None
    assert outcome.status is GitImportStatus.CONFLICT, outcome
    # The command's commit, on the moved tip with the index it saw, deletes `other.txt`:
    # not a fast-forward of the host's work (round 15), so `main` is the conflict.
    assert [c.name for c in outcome.conflicts] == ["refs/heads/main"]
    assert host_git(repo, "rev-parse", "main").strip() == tip
    assert (repo / ".git" / "index").read_bytes() == index
    assert reachable(repo, ours)
    fsck_clean(repo)


def _staged_then_the_user_commits(tmp_path: Path) -> tuple[Path, Overlay]:
    """A repository whose command staged `cmd.txt` (its index copied up), and whose user
    then committed `user.txt` on the host."""
    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state" / "exec-x")
    ov.run("echo cmd > cmd.txt && git add cmd.txt")
    (repo / "user.txt").write_text("important\n")
    host_git(repo, "add", "user.txt")
    host_git(repo, "commit", "-qm", "user")
    return repo, ov


def test_a_commit_on_a_tip_the_user_moved_with_an_index_staged_before_is_a_conflict(
    tmp_path: Path,
) -> None:
    # Round 15: the command staged (its index copied up), the user committed `user.txt` on
    # the host, then the command committed: its parent was the user's commit (refs are read
    # through the live git dir), its tree the stale index, so the "fast-forward" deleted the
    # user's file, and the command's index replaced the user's.
    repo, ov = _staged_then_the_user_commits(tmp_path)
    user = host_git(repo, "rev-parse", "main").strip()
    index = (repo / ".git" / "index").read_bytes()
    ours, parent = ov.run("git commit -qm command && git rev-parse @ @~").split()
    assert parent == user
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None
    assert outcome.status is GitImportStatus.CONFLICT, outcome
    assert "refs/heads/main" in [c.name for c in outcome.conflicts]
    assert host_git(repo, "rev-parse", "main").strip() == user
    assert host_git(repo, "ls-tree", "--name-only", "main").split() == ["f0.txt", "user.txt"]
    assert (repo / ".git" / "index").read_bytes() == index
    assert reachable(repo, ours)
    fsck_clean(repo)


@pytest.mark.parametrize("case", ["both edited one file", "the branch was unborn"])
def test_a_stale_index_committed_on_the_users_tip_is_a_conflict_however_it_differs(
    case: str, tmp_path: Path
) -> None:
    # Round 16: the rule compared only with the start entry, so a file both edited (the
    # command's line 1, the user's line 3) lost the user's line; and a branch with no
    # commit at the start skipped the rule (the user's first commit deleted at the tip).
    repo = tmp_path / "repo"
    if case == "the branch was unborn":
        repo.mkdir()
        host_git(repo, "init", "-q", "-b", "main")
    else:
        make_repo(repo)
        (repo / "a.txt").write_text("line1\nline2\nline3\n")
        host_git(repo, "add", "a.txt")
        host_git(repo, "commit", "-qm", "a")
    ov = Overlay(repo, tmp_path / "state" / "exec-x")
    if case == "the branch was unborn":
        ov.run("echo cmd > cmd.txt && git add cmd.txt")
        (repo / "user.py").write_text("print('the user')\n")
        host_git(repo, "add", "user.py")
    else:
        ov.run("sed -i 1s/line1/LINE1-cmd/ a.txt && git add a.txt")
        (repo / "a.txt").write_text("line1\nline2\nLINE3-user\n")
        host_git(repo, "add", "a.txt")
    host_git(repo, "commit", "-qm", "user")
    user = host_git(repo, "rev-parse", "main").strip()
    kept = host_git(repo, "ls-tree", "-r", "main")
    ours, parent = ov.run("git commit -qm command && git rev-parse @ @~").split()
    assert parent == user
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None
    assert outcome.status is GitImportStatus.CONFLICT, outcome
    assert host_git(repo, "rev-parse", "main").strip() == user
    assert host_git(repo, "ls-tree", "-r", "main") == kept
    assert reachable(repo, ours)
    fsck_clean(repo)


@pytest.mark.parametrize("log", ["HEAD", "main"])
def test_a_reflog_both_wrote_keeps_the_hosts_entries_and_adds_the_commands(
    log: str, tmp_path: Path
) -> None:
    # Round 17: the command's copy of a reflog replaced the host's, written meanwhile: a
    # detached experiment's commit (`HEAD`) or a reset-away one (`main`) lost from the
    # user's `git reflog`, their way back to it.
    repo = make_repo(tmp_path / "repo")
    ov = Overlay(repo, tmp_path / "state" / "exec-x")
    if log == "HEAD":
        ov.run("git checkout -q -b feat")
        host_git(repo, "checkout", "-q", "--detach")
        (repo / "exp.txt").write_text("experiment\n")
        host_git(repo, "add", "exp.txt")
        host_git(repo, "commit", "-qm", "host experiment")
        host_git(repo, "checkout", "-q", "main")
    else:
        ov.run("git commit -q --allow-empty -m first")
        host_git(repo, "commit", "-q", "--allow-empty", "-m", "user wip")
        host_git(repo, "reset", "-q", "--hard", "HEAD~")
    theirs = host_git(repo, "log", "-g", "--format=%H", log).split()
    ov.run("git commit -q --allow-empty -m cmdg")
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    import_changes(snap)
    after = host_git(repo, "log", "-g", "--format=%H %gs", log)
    assert all(h in after for h in theirs), after  # every host entry's commit is there
    assert "commit: cmdg" in after
    fsck_clean(repo)


def test_an_index_staged_before_the_users_commit_is_not_taken_with_a_good_commit(
    tmp_path: Path,
) -> None:
    # `git commit <path>` builds its commit from HEAD (the user's, with `user.txt`) but
    # writes the path into the stale index, which lacks `user.txt`: a conflict (the import
    # is one transaction), the command's commit kept, the host's index and branch stay.
    repo, ov = _staged_then_the_user_commits(tmp_path)
    index = (repo / ".git" / "index").read_bytes()
    user = host_git(repo, "rev-parse", "main").strip()
    ours = ov.run("git commit -qm command cmd.txt && git rev-parse @").strip()
    assert "user.txt" in ov.run("git ls-tree --name-only @").split()
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None
    assert host_git(repo, "rev-parse", "main").strip() == user
    assert reachable(repo, ours)
    assert outcome.status is GitImportStatus.CONFLICT, outcome
    assert [c.name for c in outcome.conflicts] == ["index"]
    assert (repo / ".git" / "index").read_bytes() == index
    assert "user.txt" in host_git(repo, "ls-files").split()
    fsck_clean(repo)


# The command moves `feat`, and rewrites the reflogs of `HEAD` and `main` (a commit made on
# `main` and reset away: `tmp`, named only by those reflogs). Prints `tmp`'s id.
_REFLOG_COMMAND = (
    "git checkout -q feat && git commit -q --allow-empty -m cmd && git checkout -q main"
    " && git commit -q --allow-empty -m tmp && git rev-parse HEAD && git reset -q --hard HEAD~"
)


def _host_commits_and_resets(repo: Path) -> str:
    """The user commits on `main` and resets it away: that commit is named only by the
    host's reflogs of `HEAD` and `main`. Returns its id."""
    (repo / "x.txt").write_text("the user's\n")
    host_git(repo, "add", "x.txt")
    host_git(repo, "commit", "-qm", "host x")
    commit = host_git(repo, "rev-parse", "HEAD").strip()
    host_git(repo, "reset", "-q", "--hard", "HEAD~")
    return commit


@pytest.mark.parametrize("when", ["refs", "files", "during the import"])
def test_reflogs_the_host_wrote_after_the_plan_are_never_written_over(
    when: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The harness was killed once the refs moved (or after the first file); the user then
    # committed and reset before any executor started again; the recovery wrote the
    # journal's reflogs over the user's, and the user's commit was left to `git gc` (red
    # team). Or the same happens while the import runs. The host's reflog is kept, and so
    # is every commit: the user's through it, the command's through its keep-refs.
    from bash_sandbox.git_import import transaction

    repo = make_repo(tmp_path / "repo")
    host_git(repo, "branch", "feat")
    state = tmp_path / "state"
    ov = Overlay(repo, state)
    tmp = ov.run(_REFLOG_COMMAND).strip()
    ours = (ov.upper / "refs" / "heads" / "feat").read_text().strip()
    if when == "during the import":
        host_commit: list[str] = []

        def host_acts(point: str) -> None:
            if point == "refs":  # the refs moved, the files not written yet
                host_commit.append(_host_commits_and_resets(repo))

        monkeypatch.setattr(transaction, "crash_point", host_acts)
        snap = load_snapshot(str(ov.upper))
        assert snap is not None
        outcome = import_changes(snap).outcome
        assert outcome is not None and outcome.status is GitImportStatus.PARTIAL, outcome
        assert any("logs/HEAD: the host changed it" in r for r in outcome.refused), outcome
        assert outcome.kept_at is not None
        [x] = host_commit
    else:
        assert ov.import_in_child(crash=when) == 86
        x = _host_commits_and_resets(repo)
        assert recover(str(state))
    logs = repo / ".git" / "logs"
    assert x in (logs / "HEAD").read_text() and x in (logs / "refs/heads/main").read_text()
    assert host_git(repo, "rev-parse", "feat").strip() == ours  # the rest rolled forward
    host_git(repo, "gc", "-q", "--prune=now")
    for commit in (x, ours, tmp):
        host_git(repo, "cat-file", "-e", commit)  # still in the host's store
    assert reachable(repo, tmp)  # the command's, named only by the reflogs not written
    assert _leftovers(repo) == []
    fsck_clean(repo)


def test_a_state_directory_swapped_in_survives_a_kill_between_its_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A state directory is replaced by moving the host's aside and renaming ours in: killed
    # between the two, the host has none; the recovery finds ours complete and finishes.
    repo = make_repo(tmp_path / "repo")
    for i in (1, 2):
        (repo / f"c{i}.txt").write_text(f"{i}\n")
        host_git(repo, "add", ".")
        host_git(repo, "commit", "-qm", f"c{i}")
    host_git(repo, "rebase", "-q", "-i", "HEAD~2", env={"GIT_SEQUENCE_EDITOR": "sed -i 1ibreak"})
    ov = Overlay(repo, tmp_path / "state")
    ov.run("sed -i 1ibreak .git/rebase-merge/git-rebase-todo")  # one more stop
    wanted = (ov.upper / "rebase-merge" / "git-rebase-todo").read_bytes()
    real_rename = os.rename

    def killed_after_the_first(src: Any, dst: Any, **kw: Any) -> None:
        real_rename(src, dst, **kw)
        if str(dst).startswith(".bash-sandbox-") and "-old-" in str(dst):
            raise SystemExit("killed")

    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    with monkeypatch.context() as patched, pytest.raises(SystemExit):
        patched.setattr(os, "rename", killed_after_the_first)
        import_changes(snap)
    assert not (repo / ".git" / "rebase-merge").exists()  # killed mid-swap
    assert recover(str(tmp_path / "state"))
    assert (repo / ".git" / "rebase-merge" / "git-rebase-todo").read_bytes() == wanted
    assert _leftovers(repo) == []
    fsck_clean(repo)


def test_a_host_rewind_during_the_command_is_not_undone_as_a_fast_forward(
    tmp_path: Path,
) -> None:
    # The host drops its last commit (`git reset --hard HEAD~`) while the command runs; the
    # command, its index still holding that commit's file, commits on the host's new tip:
    # a descendant of the host's value, applied as a fast-forward, which brought the
    # dropped file back (red team). The host moved `main` back, not forward: a conflict.
    repo = make_repo(tmp_path / "repo")
    (repo / "bad.txt").write_text("to be dropped\n")
    host_git(repo, "add", "bad.txt")
    host_git(repo, "commit", "-qm", "s")
    ov = Overlay(repo, tmp_path / "state")
    ov.run("git add -A")  # the command's index: `s`'s tree
    host_git(repo, "reset", "-q", "--hard", "HEAD~")
    rewound = host_git(repo, "rev-parse", "main").strip()
    index = (repo / ".git" / "index").read_bytes()
    ours, parent = ov.run("git commit -q --allow-empty -m cmd && git rev-parse @ @~").split()
    assert parent == rewound  # built on the host's value: a descendant of it
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None and outcome.status is GitImportStatus.CONFLICT, outcome
    assert "refs/heads/main" in [c.name for c in outcome.conflicts]
    assert host_git(repo, "rev-parse", "main").strip() == rewound
    assert (repo / ".git" / "index").read_bytes() == index
    assert not (repo / "bad.txt").exists() and host_git(repo, "status", "--porcelain") == ""
    assert reachable(repo, ours)
    fsck_clean(repo)


@pytest.mark.parametrize("checkout", ["in the roots", "outside the roots"])
def test_a_separate_git_dirs_checkout_is_inside_only_where_the_survey_finds_it(
    checkout: str, tmp_path: Path
) -> None:
    # `git init --separate-git-dir`: git records no place for the main checkout (its `.git`
    # is a file; no `core.worktree`). It was taken as inside; a command in a linked worktree
    # of a checkout outside the roots then moved that checkout's HEAD and index. Now only a
    # gitfile in the roots naming the git dir (`main_checkout_inside`) makes it inside.
    from bash_sandbox.git_discovery import snapshot
    from bash_sandbox.git_import import main_checkout_inside

    ws = tmp_path / "ws"
    ws.mkdir()
    store = tmp_path / "store.git"
    main = (ws if checkout == "in the roots" else tmp_path) / "main"
    host_git(tmp_path, "init", "-q", "-b", "main", f"--separate-git-dir={store}", str(main))
    (main / "f0.txt").write_text("file 0\n")
    host_git(main, "add", ".")
    host_git(main, "commit", "-qm", "start")
    host_git(main, "worktree", "add", "-q", "-b", "side", str(ws / "wt"))
    roots = [str(ws)]
    dotgits = [
        snapshot(str(ws / "wt" / ".git")),
        *([snapshot(str(main / ".git"))] if checkout == "in the roots" else []),
    ]
    inside = main_checkout_inside(str(store), dotgits, roots)
    assert inside is (checkout == "in the roots")
    head, index = (store / "HEAD").read_bytes(), (store / "index").read_bytes()
    ov = Overlay(ws / "wt", tmp_path / "state", gitdir=store, roots=roots, main_inside=inside)
    ov.run(
        "C=$(git rev-parse --git-common-dir) && b=$(echo new | git hash-object -w --stdin) &&"
        " GIT_INDEX_FILE=$C/index git update-index --add --cacheinfo 100644,$b,new.txt &&"
        " git --git-dir=$C symbolic-ref HEAD refs/heads/side"
    )
    snap = load_snapshot(str(ov.upper))
    assert snap is not None
    outcome = import_changes(snap).outcome
    assert outcome is not None
    if checkout == "in the roots":
        assert outcome.status is GitImportStatus.APPLIED, outcome
        assert host_git(main, "symbolic-ref", "HEAD").strip() == "refs/heads/side"
        assert "new.txt" in host_git(main, "ls-files")
    else:
        assert outcome.status is GitImportStatus.REFUSED, outcome
        assert (store / "HEAD").read_bytes() == head
        assert (store / "index").read_bytes() == index
    fsck_clean(main)
