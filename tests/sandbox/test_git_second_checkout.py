"""A separate git dir's main checkout counts as inside the roots only where the user's own
`.git` names it: never through a gitfile or link a command plants (one call's, or a running
background command's while another call starts). Real bwrap and Landlock; every check made
with host git from outside."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bash_seam import BashExecRequest, BashProcess, BashRunResult, GitImportStatus
from tests.sandbox.conftest import ExecutorFactory
from tests.sandbox.git_import_harness import GIT_ENV, fsck_clean, host_git, make_repo


async def _run(ex: object, command: str, cwd: Path) -> BashRunResult:
    spec = ex.resolve(BashExecRequest(command=command, workdir=str(cwd), env=GIT_ENV))  # type: ignore[attr-defined]
    result: BashRunResult = await ex.run(spec)  # type: ignore[attr-defined]
    return result


async def _start(ex: object, command: str, cwd: Path) -> BashProcess:
    spec = ex.resolve(BashExecRequest(command=command, workdir=str(cwd), env=GIT_ENV))  # type: ignore[attr-defined]
    process: BashProcess = await ex.start(spec)  # type: ignore[attr-defined]
    return process


async def _until(path: Path) -> None:
    for _ in range(400):
        if path.exists():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def _separate(tmp_path: Path, main: Path) -> Path:
    """`git init --separate-git-dir`: the git dir beside, its checkout at ``main``."""
    store = tmp_path / "store.git"
    host_git(tmp_path, "init", "-q", "-b", "main", f"--separate-git-dir={store}", str(main))
    (main / "f0.txt").write_text("file 0\n")
    host_git(main, "add", ".")
    host_git(main, "commit", "-qm", "start")
    return store


def _outside_layout(tmp_path: Path, workspace: Path) -> tuple[Path, Path, Path, str, bytes]:
    """A separate git dir with its main checkout outside the roots and a linked worktree
    `wt` in the workspace: (main, store, wt, main's tip, the main index's bytes)."""
    main = tmp_path / "main-checkout"
    store = _separate(tmp_path, main)
    wt = workspace / "wt"
    host_git(main, "worktree", "add", "-q", "-b", "side", str(wt))
    return (
        main,
        store,
        wt,
        host_git(main, "rev-parse", "main").strip(),
        (store / "index").read_bytes(),
    )


def _evil(store: Path, work: Path, marker: Path) -> str:
    """Stage an executable in ``store``'s main index and commit it on `main`, through a
    checkout the command names itself."""
    g = f"git --git-dir={store} --work-tree={work}"
    return (
        f"mkdir -p {work} && cd {work} && printf '#!/bin/sh\\ntouch {marker}\\n' > run-me.sh"
        f" && chmod +x run-me.sh && {g} add run-me.sh && {g} commit -qm evil"
    )


def _outside_unchanged(main: Path, head: str, index: bytes, store: Path, marker: Path) -> None:
    assert host_git(main, "rev-parse", "main").strip() == head
    assert (store / "index").read_bytes() == index
    host_git(main, "checkout", "--", ".", check=False)
    host_git(main, "reset", "-q", "--hard", check=False)
    assert not (main / "run-me.sh").exists()
    assert not marker.exists()
    fsck_clean(main)


async def test_a_gitfile_a_call_plants_naming_the_git_dir_is_removed_and_the_outside_checkout_kept(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The workspace a linked worktree of a separate git dir whose main checkout is outside
    # the roots. Call 1 wrote `x/.git` naming the git dir itself; it was kept (its target is
    # overlaid), the next survey took `x` for the main checkout, and call 2's import wrote
    # that outside checkout's index and branch (red team).
    main, store, wt, head, index = _outside_layout(tmp_path, workspace)
    marker = tmp_path / "pwned"
    ex = make_executor(mode="workspace-write")
    plant = await _run(ex, f"mkdir -p x && printf 'gitdir: {store}\\n' > x/.git", wt)
    assert plant.exit_code == 0, plant.stderr.text
    assert not (wt / "x" / ".git").exists()
    assert plant.sandbox is not None
    assert any("second main checkout" in w for w in plant.sandbox.warnings)
    result = await _run(ex, _evil(store, wt / "x", marker), wt)
    assert result.exit_code == 0, result.stderr.text
    _outside_unchanged(main, head, index, store, marker)


async def test_a_gitfile_a_running_command_plants_is_no_checkout_for_another_call(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The same gitfile planted by a background command still running when the next call
    # starts: its command has not settled, so nothing has removed it yet.
    main, store, wt, head, index = _outside_layout(tmp_path, workspace)
    marker, planted, go = tmp_path / "pwned", workspace / "planted", workspace / "go"
    ex = make_executor(mode="workspace-write")
    background = await _start(
        ex,
        f"mkdir -p x && printf 'gitdir: {store}\\n' > x/.git && touch {planted}"
        f" && for i in $(seq 400); do [ -e {go} ] && break; sleep 0.05; done",
        wt,
    )
    await _until(planted)
    result = await _run(ex, _evil(store, wt / "x", marker), wt)
    assert result.exit_code == 0, result.stderr.text
    go.touch()
    await background.wait()
    assert not (wt / "x" / ".git").exists()  # removed once its command settled
    _outside_unchanged(main, head, index, store, marker)


async def test_a_separate_git_dir_in_the_roots_whose_checkout_is_outside_keeps_it(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The git dir itself inside the workspace (the search lists it as a repository), its
    # main checkout outside: the git dir is no checkout of itself.
    main = tmp_path / "main-checkout"
    store = workspace / "store.git"
    host_git(tmp_path, "init", "-q", "-b", "main", f"--separate-git-dir={store}", str(main))
    (main / "f0.txt").write_text("file 0\n")
    host_git(main, "add", ".")
    host_git(main, "commit", "-qm", "start")
    head, index = host_git(main, "rev-parse", "main").strip(), (store / "index").read_bytes()
    marker = tmp_path / "pwned"
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, _evil(store, workspace / "x", marker), workspace)
    assert result.exit_code == 0, result.stderr.text
    _outside_unchanged(main, head, index, store, marker)


@pytest.mark.parametrize("store_at", ["outside, a linked worktree in the root", "in the root"])
async def test_the_users_separate_git_dir_checkout_in_the_root_takes_commits_while_a_command_runs(
    store_at: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # What stays allowed: the user's own `git init --separate-git-dir` checkout in the
    # workspace (its `.git` a file there before any command) is inside, alone and while a
    # background command of the same executor runs; so is a plain `.git` directory.
    main = workspace / "main"
    store = _separate(workspace if store_at == "in the root" else tmp_path, main)
    if store_at != "in the root":
        # Overlaid (so writable) through the linked worktree that points back at it.
        host_git(main, "worktree", "add", "-q", "-b", "side", str(workspace / "wt"))
    plain = make_repo(workspace / "plain")
    ready, go = workspace / "ready", workspace / "go"
    ex = make_executor(mode="workspace-write")
    first = await _run(ex, "echo one > one.txt && git add one.txt && git commit -qm one", main)
    assert first.exit_code == 0, first.stderr.text
    assert host_git(main, "log", "-1", "--format=%s").strip() == "one"
    background = await _start(
        ex, f"touch {ready} && for i in $(seq 400); do [ -e {go} ] && break; sleep 0.05; done", main
    )
    await _until(ready)
    for repo in (main, plain):
        result = await _run(ex, "echo two > two.txt && git add two.txt && git commit -qm two", repo)
        assert result.exit_code == 0, result.stderr.text
        assert result.sandbox is not None and result.sandbox.git, result.sandbox
        assert result.sandbox.git[0].status is GitImportStatus.APPLIED, result.sandbox.git
        assert host_git(repo, "log", "-1", "--format=%s").strip() == "two"
        assert host_git(repo, "status", "--porcelain").strip() == ""
        fsck_clean(repo)
    go.touch()
    await background.wait()
    assert (main / ".git").read_text() == f"gitdir: {store}\n"


def _planting(store: Path, planted: Path, go: Path) -> str:
    """A command that plants `x/.git` naming ``store``, says so, and waits for ``go``."""
    return (
        f"mkdir -p x && printf 'gitdir: {store}\\n' > x/.git && touch {planted}"
        f" && for i in $(seq 400); do [ -e {go} ] && break; sleep 0.05; done"
    )


def _cli(backend: str, workspace: Path, command: str, tmpdir: Path | None = None) -> Any:
    """``command`` run by a one-shot `bash-sandbox run` process (another executor)."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "bash_sandbox.cli", "run", "--backend", backend),
            *("--mode", "workspace-write", "--workspace", str(workspace)),
            *("--", command),
        ],
        env={
            **os.environ,
            **GIT_ENV,
            "BASH_SANDBOX_DAEMON": "0",
            **({"TMPDIR": str(tmpdir)} if tmpdir is not None else {}),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    "other", ["executor", "process", "executor on a sub-directory", "process with its own TMPDIR"]
)
async def test_a_gitfile_another_executors_running_command_plants_is_no_checkout(
    other: str, backend: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # Two harnesses on one workspace (two executors, or the CLI beside a library): the
    # plant of one's running command is that one's to remove, and the other's survey took it
    # for the main checkout: its import wrote the outside checkout (red team round 4).
    main, store, wt, head, index = _outside_layout(tmp_path, workspace)
    marker, planted, go = tmp_path / "pwned", workspace / "planted", workspace / "go"
    plant = _planting(store, planted, go)
    cli: subprocess.Popen[bytes] | None = None
    background: BashProcess | None = None
    own_tmp = tmp_path / "own-tmp"
    own_tmp.mkdir()
    if other.startswith("executor"):
        background = await _start(make_executor(mode="workspace-write"), plant, wt)
    else:
        tmpdir = own_tmp if "TMPDIR" in other else None
        cli = _cli(backend, workspace, f"cd wt && {plant}", tmpdir)
    try:
        await _until(planted)
        # The committing executor's workspace is the worktree itself, below the planter's.
        root = {"workspace_root": str(wt)} if "sub-directory" in other else {}
        ex = make_executor(mode="workspace-write", **root)
        result = await _run(ex, _evil(store, wt / "x", marker), wt)
        assert result.exit_code == 0, result.stderr.text
    finally:
        go.touch()
        if background is not None:
            await background.wait()
        if cli is not None:
            cli.wait(timeout=60)
    assert not (wt / "x" / ".git").exists()  # removed by its own executor as it settled
    _outside_unchanged(main, head, index, store, marker)


async def test_a_plant_whose_command_settles_while_the_survey_reads_is_not_trusted(
    backend: str,
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The survey read the `.git` entries (the plant among them), then asked whether another
    # executor's command ran: by then the planter had settled, its plant and record gone,
    # and the stale reading was trusted (red team round 6). A command over these roots that
    # ended after the reading began counts.
    from bash_local.userdir import fixed_bases
    from bash_sandbox import running_spawns

    main, store, wt, head, index = _outside_layout(tmp_path, workspace)
    marker, planted, go = tmp_path / "pwned", workspace / "planted", workspace / "go"
    cli = _cli(backend, workspace, f"cd wt && {_planting(store, planted, go)}")
    real = running_spawns.others_over

    def after_the_planter_settled(owner: int, roots: tuple[str, ...], since: int) -> bool:
        # The planter ends between this survey's reading and its question.
        go.touch()
        for _ in range(600):
            records = [
                n
                for b in fixed_bases()
                for n in os.listdir(os.path.join(b, "running"))
                if n.startswith(f"{cli.pid}:")
            ]
            if not records:
                break
            time.sleep(0.05)
        return real(owner, roots, since)

    try:
        await _until(planted)
        monkeypatch.setattr(running_spawns, "others_over", after_the_planter_settled)
        ex = make_executor(mode="workspace-write", workspace_root=str(wt))
        result = await _run(ex, _evil(store, wt / "x", marker), wt)
        assert result.exit_code == 0, result.stderr.text
    finally:
        go.touch()
        cli.wait(timeout=60)
    _outside_unchanged(main, head, index, store, marker)
