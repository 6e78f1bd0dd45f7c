"""The import's intent (`git_import.begin`): written durably before the command starts, in
place on a reused upper (one page, `fdatasync`), by a new file and a rename otherwise; read
back whole in every case, and an intent torn by a power loss (a command that never started)
skipped by the recovery without loss. Checked on the files themselves and through host git."""

from __future__ import annotations

import os
from pathlib import Path

from bash_sandbox.git_import import begin, import_changes, load_snapshot, recover_overlay
from bash_sandbox.git_import.importer import IMPORT_DIR, INTENT
from tests.workflows.workspaces import git_host

PAGE = 4096


def _repo(tmp_path: Path) -> str:
    work = tmp_path / "repo"
    work.mkdir()
    git_host(work, "init", "-q", "-b", "main")
    (work / "a.txt").write_text("a\n")
    git_host(work, "add", "a.txt")
    git_host(work, "commit", "-qm", "first")
    return str(work / ".git")


def _upper(tmp_path: Path) -> str:
    upper = tmp_path / "state" / "git" / "1" / "upper"
    upper.mkdir(parents=True)
    return str(upper)


def _intent(upper: str) -> Path:
    return Path(os.path.dirname(upper)) / IMPORT_DIR / INTENT


def test_a_small_intent_is_one_page_and_rewritten_in_place(tmp_path: Path) -> None:
    gitdir, upper = _repo(tmp_path), _upper(tmp_path)
    first = begin(gitdir, upper)
    path = _intent(upper)
    made = path.stat()
    assert made.st_size == PAGE
    assert load_snapshot(upper) == first
    # The host moves main; the next spawn's intent (same upper) replaces it in place.
    git_host(Path(gitdir).parent, "commit", "-q", "--allow-empty", "-m", "second")
    second = begin(gitdir, upper)
    again = path.stat()
    assert (again.st_ino, again.st_size) == (made.st_ino, PAGE)
    assert load_snapshot(upper) == second
    assert second.refs != first.refs and second.run_id != first.run_id
    assert sorted(os.listdir(path.parent)) == [INTENT]  # no temporary file left


def test_an_intent_larger_than_a_page_is_a_new_file_renamed_into_place(tmp_path: Path) -> None:
    gitdir, upper = _repo(tmp_path), _upper(tmp_path)
    begin(gitdir, upper)
    path = _intent(upper)
    page = path.stat().st_ino
    for i in range(80):  # the refs no longer fit in a page
        git_host(Path(gitdir).parent, "branch", f"topic-with-a-long-name-{i:04d}")
    big = begin(gitdir, upper)
    assert path.stat().st_size > PAGE
    assert path.stat().st_ino != page  # not written over: renamed into place
    assert load_snapshot(upper) == big
    assert big.refs is not None and len(big.refs) > 80
    assert sorted(os.listdir(path.parent)) == [INTENT]


def test_an_intent_of_another_size_there_is_replaced_whole(tmp_path: Path) -> None:
    gitdir, upper = _repo(tmp_path), _upper(tmp_path)
    path = _intent(upper)
    path.parent.mkdir()
    path.write_text('{"an older intent": true}')
    snap = begin(gitdir, upper)
    assert path.stat().st_size == PAGE
    assert load_snapshot(upper) == snap


def test_a_torn_intent_is_skipped_by_the_recovery_and_loses_nothing(tmp_path: Path) -> None:
    """Power lost while a spawn rewrote its intent: the command never started, so there is
    nothing of it to import; the recovery must neither fail nor touch the host."""
    gitdir, upper = _repo(tmp_path), _upper(tmp_path)
    begin(gitdir, upper)
    path = _intent(upper)
    torn = bytearray(path.read_bytes())
    torn[100:600] = b"\0" * 500  # a half-written page
    path.write_bytes(bytes(torn))
    before = git_host(Path(gitdir).parent, "for-each-ref")
    assert load_snapshot(upper) is None
    assert recover_overlay(upper) is True
    assert not path.exists()
    assert git_host(Path(gitdir).parent, "for-each-ref") == before
    git_host(Path(gitdir).parent, "fsck", "--strict")


def test_an_in_place_intent_still_imports_the_commands_commit(tmp_path: Path) -> None:
    """The rewritten intent is the one the import compares with: a commit the command made on
    top of the second snapshot lands on the host."""
    gitdir, upper = _repo(tmp_path), _upper(tmp_path)
    # `main` is checked out there: an import moves it only when that worktree is in a root.
    roots = [str(Path(gitdir).parent.resolve())]
    begin(gitdir, upper, roots)
    git_host(Path(gitdir).parent, "commit", "-q", "--allow-empty", "-m", "host moved")
    snap = begin(gitdir, upper, roots)  # in place: the host's new main is the base
    assert snap.refs is not None
    # The command's commit, made as an overlay would hold it: in a clone of the host repo
    # whose objects and ref are then put in the upper layer.
    clone = tmp_path / "clone"
    git_host(tmp_path, "clone", "-q", str(Path(gitdir).parent), str(clone))
    git_host(clone, "commit", "-q", "--allow-empty", "-m", "the command's commit")
    head = git_host(clone, "rev-parse", "HEAD").strip()
    objects = Path(upper) / "objects"
    for obj in (clone / ".git" / "objects").rglob("*"):
        if obj.is_file() and obj.parent.name != "pack" and len(obj.parent.name) == 2:
            target = objects / obj.parent.name / obj.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(obj.read_bytes())
    (Path(upper) / "refs" / "heads").mkdir(parents=True)
    (Path(upper) / "refs" / "heads" / "main").write_text(head + "\n")
    loaded = load_snapshot(upper)
    assert loaded == snap
    import_changes(loaded)
    assert git_host(Path(gitdir).parent, "rev-parse", "main").strip() == head
    git_host(Path(gitdir).parent, "fsck", "--strict")
