"""The repository search kept current by inotify (`git_tree_watch.py`), on the real kernel:
after every kind of change it answers what a fresh walk finds, and where it cannot be sure
(an overflowed queue, a watch it may not set, a replaced root) it answers with the walk."""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bash_sandbox import git_discovery
from bash_sandbox.git_discovery import find_dotgits
from bash_sandbox.git_tree_watch import GitTreeWatch
from bash_sandbox.linux.dir_watch import DirectoryWatch
from bash_sandbox.linux.inotify import InotifyError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify")


def _fresh_walk(*roots: Path) -> list[str]:
    git_discovery._LISTINGS.clear()  # nothing kept: every directory listed now
    found, unlisted = find_dotgits(tuple(str(r) for r in roots))
    assert unlisted == []
    return sorted(found)


def _kept(tree: GitTreeWatch, *roots: Path) -> list[str]:
    answered = tree.answered
    found, unlisted = tree.find_dotgits(tuple(str(r) for r in roots))
    assert unlisted == []
    assert tree.answered == answered + 1, "answered by the walk, not the kept tree"
    return sorted(found)


def _bare(path: Path, head: str = "ref: refs/heads/main\n") -> None:
    (path / "objects").mkdir(parents=True, exist_ok=True)
    (path / "refs").mkdir(exist_ok=True)
    (path / "HEAD").write_text(head)


def _dirs(ws: Path) -> list[Path]:
    found = [ws]
    for top, subdirs, _ in os.walk(ws):
        subdirs[:] = [d for d in subdirs if d != ".git"]
        found += [Path(top) / d for d in subdirs]
    return found


def _change(rng: random.Random, ws: Path, outside: Path, step: int) -> None:
    """One change of the kinds a command makes, somewhere in ``ws``."""
    dirs = _dirs(ws)
    here = rng.choice(dirs)
    kind = rng.randrange(13)
    name = f"n{step}"
    if kind <= 2:
        (here / name / "x" / "y").mkdir(parents=True)
    elif kind == 3 and here != ws:
        shutil.rmtree(here)
    elif kind == 4 and here != ws:
        there = rng.choice([d for d in dirs if not d.is_relative_to(here)])
        here.rename(there / name)
    elif kind == 5:
        (here / name / ".git").mkdir(parents=True)
    elif kind == 6:
        (here / name).mkdir()
        (here / name / ".git").write_text("gitdir: ../elsewhere\n")
    elif kind == 7:
        (here / name).mkdir()
        os.symlink(str(ws), here / name / ".git")
    elif kind == 8:
        _bare(here / f"{name}.git")
    elif kind == 9:
        # A HEAD rewritten in place: a directory with git's layout becomes (or stops
        # being) a bare repository with no name changing.
        layouts = [d for d in dirs if (d / "HEAD").is_file()]
        if layouts:
            head = rng.choice(layouts) / "HEAD"
            valid = head.read_text().startswith("ref:")
            with open(head, "r+") as fh:
                fh.truncate(0)
                fh.write("not a ref\n" if valid else "ref: refs/heads/main\n")
    elif kind == 10:
        # A tree made elsewhere, moved in whole (its directories never seen being made).
        made = outside / name
        (made / "deep" / "er" / ".git").mkdir(parents=True)
        _bare(made / "deep" / "bare")
        made.rename(here / name)
    elif kind == 11 and here != ws:
        # Another directory under the same name: its parent's listing does not change.
        (outside / name / "other" / ".git").mkdir(parents=True)
        here.rename(outside / f"{name}-was")
        (outside / name).rename(here)
    else:
        dotgits = [d / ".git" for d in dirs if os.path.lexists(d / ".git")]
        if dotgits:
            victim = rng.choice(dotgits)
            if victim.is_dir() and not victim.is_symlink():
                shutil.rmtree(victim)
            else:
                victim.unlink()


def test_the_kept_tree_answers_what_a_fresh_walk_finds_after_every_change(
    tmp_path: Path,
) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "src" / "a").mkdir(parents=True)
    (ws / "node_modules" / "p" / ".git").mkdir(parents=True)
    _bare(ws / "fixtures" / "remote.git")
    outside.mkdir()
    rng = random.Random(25)
    tree = GitTreeWatch()
    try:
        assert _kept(tree, ws) == _fresh_walk(ws)
        for step in range(150):
            _change(rng, ws, outside, step)
            if step % 3 == 0:  # several changes between two searches too
                assert _kept(tree, ws) == _fresh_walk(ws), step
        assert _kept(tree, ws) == _fresh_walk(ws)
        assert tree.walked == 0
    finally:
        tree.close()


def test_an_overflowed_queue_is_answered_by_a_fresh_walk_and_the_tree_rebuilt(
    tmp_path: Path,
) -> None:
    queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if queued > 100_000:
        pytest.skip(f"max_queued_events is {queued}: too many files to overflow it here")
    ws = tmp_path / "ws"
    (ws / "flood").mkdir(parents=True)
    tree = GitTreeWatch()
    try:
        assert _kept(tree, ws) == []
        rebuilt = tree.rebuilt
        # More events than the kernel queues: which names changed is lost.
        for i in range(queued + 100):
            (ws / "flood" / f"f{i}").touch()
        (ws / "flood" / "deep" / "new").mkdir(parents=True)
        (ws / "flood" / "deep" / "new" / ".git").mkdir()
        assert _kept(tree, ws) == [str(ws / "flood" / "deep" / "new" / ".git")]
        assert tree.rebuilt == rebuilt + 1
        (ws / "later" / ".git").mkdir(parents=True)
        assert _kept(tree, ws) == _fresh_walk(ws)
    finally:
        tree.close()


def test_more_directories_than_the_watch_share_are_searched_by_the_walk(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    for i in range(6):
        (ws / f"d{i}" / "sub").mkdir(parents=True)
    (ws / "d3" / "sub" / ".git").mkdir()
    tree = GitTreeWatch(max_watches=5)
    try:
        assert tree.find_dotgits((str(ws),)) == ([str(ws / "d3" / "sub" / ".git")], [])
        (ws / "d4" / "sub" / "x" / ".git").mkdir(parents=True)
        assert sorted(tree.find_dotgits((str(ws),))[0]) == _fresh_walk(ws)
        assert len(_fresh_walk(ws)) == 2
        assert tree.answered == 0 and tree.walked == 2
    finally:
        tree.close()


def test_a_search_budget_smaller_than_the_tree_leaves_the_run_partial(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "a" / "b" / "c").mkdir(parents=True)
    tree = GitTreeWatch()
    try:
        assert _kept(tree, ws) == []
        _, unlisted = tree.find_dotgits((str(ws),), budget=2)
        assert unlisted, "the walk's budget, named"
    finally:
        tree.close()


def test_a_replaced_root_is_searched_again_from_scratch(tmp_path: Path) -> None:
    parent = tmp_path / "p"
    ws = parent / "ws"
    (ws / "old" / ".git").mkdir(parents=True)
    tree = GitTreeWatch()
    try:
        assert _kept(tree, ws) == [str(ws / "old" / ".git")]
        # The root renamed away and another put in its place; then a path above it.
        ws.rename(tmp_path / "ws-before")
        (ws / "new" / ".git").mkdir(parents=True)
        assert _kept(tree, ws) == [str(ws / "new" / ".git")]
        parent.rename(tmp_path / "p-before")
        (ws / "newer" / ".git").mkdir(parents=True)
        assert _kept(tree, ws) == [str(ws / "newer" / ".git")]
    finally:
        tree.close()


def test_nested_roots_and_a_closed_tree_are_searched_by_the_walk(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "inner" / "r" / ".git").mkdir(parents=True)
    tree = GitTreeWatch()
    expected = [str(ws / "inner" / "r" / ".git")]
    try:
        assert tree.find_dotgits((str(ws), str(ws / "inner")))[0] == expected * 2
        assert tree.walked == 1
        assert _kept(tree, ws) == expected
    finally:
        tree.close()
    assert tree.find_dotgits((str(ws),))[0] == expected
    assert tree.walked == 2


def test_a_tree_seen_through_a_bind_mount_is_watched_by_inode(tmp_path: Path) -> None:
    # What a sandbox's bind mount does: the same directories, another mount, another
    # namespace. The watch is on the inodes, so a change through the mount is seen.
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    tree = GitTreeWatch()
    try:
        assert _kept(tree, ws) == []
        script = f"mount --bind {ws} {mnt} && mkdir -p {mnt}/a/b/c/d && git init -q {mnt}/a/b/c/d"
        done = subprocess.run(
            ["unshare", "--mount", "--map-root-user", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"no private mount namespace here: {done.stderr.strip()}")
        assert _kept(tree, ws) == [str(ws / "a" / "b" / "c" / "d" / ".git")]
    finally:
        tree.close()


def test_a_filesystem_whose_changes_may_bypass_this_kernel_is_not_watched() -> None:
    # procfs here; NFS, 9p, virtiofs, FUSE alike: a change made elsewhere makes no event.
    watch = DirectoryWatch()
    try:
        with pytest.raises(InotifyError) as info:
            watch.add("/proc/sys")
        assert info.value.errno == errno.EXDEV
        assert len(watch) == 0
    finally:
        watch.close()


_MOUNT_CHILD = """
import sys
from pathlib import Path
import subprocess
from bash_sandbox.git_tree_watch import GitTreeWatch
from bash_sandbox.linux.dir_watch import DirectoryWatch
from bash_sandbox.linux.inotify import InotifyError
ws = Path(sys.argv[1])
tree = GitTreeWatch()
assert tree.find_dotgits((str(ws),)) == ([], [])
# A mount covers a watched directory: no inotify event says so.
subprocess.run(["mount", "-t", "tmpfs", "none", str(ws / "sub")], check=True)
(ws / "sub" / "x" / ".git").mkdir(parents=True)
found = tree.find_dotgits((str(ws),))
assert found == ([str(ws / "sub" / "x" / ".git")], []), found
assert tree.rebuilt == 1 and tree.walked == 0, (tree.rebuilt, tree.walked)
print("ok")
"""


def test_a_mount_over_a_watched_directory_rebuilds_the_tree(tmp_path: Path) -> None:
    # In a mount namespace of its own (the host's mount table is left alone).
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    # A temp dir of the test's own: as an unprivileged user the namespace's root is the
    # user mapped, and the host's per-uid directory of uid 0 (owned by the real root) is
    # nobody's there.
    private = tmp_path / "tmp"
    private.mkdir()
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--map-root-user",
         sys.executable, "-c", _MOUNT_CHILD, str(ws)],
        capture_output=True, text=True, timeout=60, check=False,
        env=dict(os.environ, TMPDIR=str(private)),
    )  # fmt: skip
    if done.returncode != 0 and "unshare" in done.stderr and "ok" not in done.stdout:
        pytest.skip(f"no private mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
