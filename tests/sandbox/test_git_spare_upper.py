"""A git overlay's upper layer reused by the next spawn only when the command left it exactly
as made (`ExecutorState.recycle_upper`): per Linux backend through the executor, and each
condition of `_emptied` on its own. Checked from the host: the state directory's uppers,
what the next command sees of `.git`, and host git."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.state import GitUpper, _emptied
from tests.sandbox.conftest import ExecutorFactory
from tests.sandbox.test_git_reach import _repo, _run, host_git


def _uppers(ex: SandboxBashExecutor) -> list[str]:
    return sorted(os.listdir(os.path.join(ex._services.state.path, "git")))


async def _kept(ex: SandboxBashExecutor) -> bool:
    """Whether the last spawn's upper was kept as a spare, once the settle threads gave it
    back (kept, or removed)."""
    state = ex._services.state
    for _ in range(500):
        spare = {os.path.basename(os.path.dirname(s.upper)) for s in state._spare}
        if set(_uppers(ex)) == spare:  # nothing left to give back
            return bool(spare)
        await asyncio.sleep(0.01)
    raise AssertionError(f"an upper was neither kept nor removed: {_uppers(ex)}")


async def test_an_upper_left_empty_is_reused_by_the_next_spawn(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    _repo(workspace)
    ex = make_executor(mode="workspace-write")
    for command in ("true", "git log -1 >/dev/null", "ls .git >/dev/null", "true"):
        result = await _run(ex, command, workspace)
        assert result.exit_code == 0, result.stderr.text
        assert await _kept(ex)
        assert _uppers(ex) == ["1"]  # the same directory, every time
    upper = os.path.join(ex._services.state.path, "git", "1")
    assert os.listdir(os.path.join(upper, "upper")) == []
    assert os.listdir(os.path.join(upper, "work")) == []  # emptied for the next mount


async def test_an_upper_the_command_wrote_is_imported_and_never_reused(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    _repo(workspace)
    ex = make_executor(mode="workspace-write")
    assert (await _run(ex, "true", workspace)).exit_code == 0
    assert await _kept(ex)
    commit = "echo b > b.txt && git add b.txt && git commit -qm second"
    result = await _run(ex, commit, workspace)
    assert result.exit_code == 0, result.stderr.text
    assert host_git("log", "-1", "--format=%s", cwd=workspace).stdout.strip() == "second"
    assert not await _kept(ex)
    assert _uppers(ex) == []  # removed, not kept
    after = await _run(ex, "git log -1 --format=%s", workspace)
    assert after.stdout.text.strip() == "second"
    assert await _kept(ex)
    assert _uppers(ex) == ["2"]  # a fresh one


# (An xattr on `.git` was the other change: every xattr write is refused now.)
@pytest.mark.parametrize("change", ["chmod 700 .git"])
async def test_an_upper_whose_root_the_command_changed_is_never_reused(
    make_executor: ExecutorFactory, workspace: Path, change: str
) -> None:
    _repo(workspace)
    ex = make_executor(mode="workspace-write")
    before = await _run(ex, "stat -c %a .git", workspace)
    assert before.exit_code == 0 and await _kept(ex)
    changed = await _run(ex, change, workspace)
    if changed.exit_code != 0:
        pytest.skip(f"the overlay refused the change here: {changed.stderr.text}")
    assert not await _kept(ex)
    after = await _run(ex, "stat -c %a .git; getfattr -d .git 2>/dev/null; true", workspace)
    assert after.stdout.text.split()[0] == before.stdout.text.strip()
    assert "bash-sandbox-test" not in after.stdout.text


def _upper(tmp_path: Path) -> GitUpper:
    base = tmp_path / "git" / "1"
    (base / "upper").mkdir(parents=True)
    os.chmod(base / "upper", 0o755)
    (base / "work" / "work").mkdir(parents=True)
    (base / "import").mkdir()
    (base / "import" / "intent.json").write_text("{}")
    return GitUpper(str(base / "upper"), str(base / "work"))


def test_each_trace_a_command_can_leave_keeps_an_upper_from_reuse(tmp_path: Path) -> None:
    clean = _upper(tmp_path / "clean")
    assert _emptied(clean)
    assert os.listdir(clean.work) == []
    traces = {
        "an entry": lambda u: Path(u.upper, "index").write_text(""),
        "a whiteout-like device": lambda u: os.mknod(
            os.path.join(u.upper, "HEAD"), stat.S_IFIFO | 0o600
        ),
        "an attribute": lambda u: os.setxattr(u.upper, "user.opaque-ish", b"y"),
        "its mode": lambda u: os.chmod(u.upper, 0o700),
        "an import journal": lambda u: (
            Path(u.upper).parent.joinpath("import", "journal.json").write_text("{}")
        ),
        "a work entry that is not an empty directory": lambda u: Path(
            u.work, "work", "#1"
        ).write_text("x"),
    }
    for i, (what, leave) in enumerate(traces.items()):
        upper = _upper(tmp_path / f"trace{i}")
        try:
            leave(upper)
        except OSError as exc:
            pytest.skip(f"{what}: not on this filesystem ({exc})")
        assert not _emptied(upper), what
