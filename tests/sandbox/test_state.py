"""The executor's private state directory: what a killed executor leaves is swept by the
next one, what a live executor holds never is."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bash_sandbox.state import ExecutorState, sweep_stale
from bash_seam import BashExecRequest
from tests.sandbox.conftest import ExecutorFactory

OLD = time.time() - 3600


def _state_dir(parent: Path, name: str, *, lock: bool) -> Path:
    path = parent / name
    (path / "tmp").mkdir(parents=True)
    if lock:
        (path / "lock").write_text("")
    return path


def test_sweep_removes_only_what_no_live_executor_holds(tmp_path: Path) -> None:
    dead = _state_dir(tmp_path, "exec-dead", lock=True)
    held = _state_dir(tmp_path, "exec-held", lock=True)
    legacy = _state_dir(tmp_path, "exec-legacy", lock=False)
    os.utime(legacy, (OLD, OLD))
    fresh = _state_dir(tmp_path, "exec-fresh", lock=False)  # mid-creation: lock not made yet
    other = tmp_path / "not-a-state-dir"
    other.mkdir()
    fd = os.open(held / "lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        sweep_stale(str(tmp_path))
    finally:
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "exec-fresh",
        "exec-held",
        "not-a-state-dir",
    ]
    assert not dead.exists() and not legacy.exists() and fresh.exists()


def test_a_killed_executors_state_is_swept_by_the_next_executor() -> None:
    # A real executor in another process, killed outright after its first confined command.
    program = textwrap.dedent(
        """
        import asyncio, os, sys, tempfile
        from bash_sandbox import SandboxBashExecutor
        from bash_seam import BashExecRequest
        async def main():
            ws = tempfile.mkdtemp()
            ex = SandboxBashExecutor(workspace_root=ws)
            await ex.run(ex.resolve(BashExecRequest(command="true")))
            print(ex._services.state.path, flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        path = proc.stdout.readline().strip()
        assert os.path.isdir(path)
        survivor = ExecutorState(())
        try:
            assert os.path.isdir(path)  # alive: held, never swept
        finally:
            survivor.remove()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert os.path.isdir(path)  # a killed executor cannot clean up after itself
        successor = ExecutorState(())
        try:
            assert not os.path.exists(path)
            assert os.path.isdir(successor.path)
        finally:
            successor.remove()
        assert not os.path.exists(successor.path)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_remove_tree_removes_links_as_links_and_never_follows_them(tmp_path: Path) -> None:
    """A state tree holds what commands wrote (a git overlay's upper layer): a link to a
    directory there made `os.chmod(follow_symlinks=False)` raise NotImplementedError, which
    aborted the cleanup, `aclose()`, and every later executor's sweep of the dead state.
    A link at the top is removed, never followed (the cache sweep's trash)."""
    from bash_sandbox.state import remove_tree

    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "file").write_text("data")
    outside.chmod(0o755)
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "dirlink").symlink_to(outside)
    (tree / "a" / "b" / "deeper").symlink_to(outside / "sub")
    (tree / "a" / "locked").mkdir()
    (tree / "a" / "locked").chmod(0)
    remove_tree(str(tree))
    assert not os.path.lexists(tree)
    top_link = tmp_path / "top-link"
    top_link.symlink_to(outside)
    remove_tree(str(top_link))
    assert not os.path.lexists(top_link)
    assert (outside / "sub" / "file").read_text() == "data"
    assert os.stat(outside).st_mode & 0o777 == 0o755


async def test_a_link_a_command_leaves_in_git_never_breaks_the_cleanup(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    """`ln -s / .git/dirlink` in a repository: the overlay's upper layer held the link, its
    removal raised, the CLI crashed after the command with a traceback and no result, and
    the dead state broke every later executor's start (its sweep raised the same way)."""
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    ex = make_executor(mode="workspace-write")
    spec = ex.resolve(
        BashExecRequest(command="ln -s / .git/dirlink && echo planted", workdir=str(workspace))
    )
    result = await ex.run(spec)
    assert result.stdout.text == "planted\n", result.stderr.text
    await ex.aclose()  # raised NotImplementedError
    later = make_executor(mode="workspace-write")
    again = await later.run(later.resolve(BashExecRequest(command="echo ok")))
    assert again.stdout.text == "ok\n"
    assert os.path.isdir("/") and not os.path.lexists(workspace / ".git" / "dirlink")


CONTAINER = textwrap.dedent(
    """
    import asyncio, json, os, subprocess, sys
    from bash_sandbox import SandboxBashExecutor
    from bash_sandbox.state import state_parent

    ws, backend = sys.argv[1], sys.argv[2]

    async def main():
        ex = SandboxBashExecutor(backend=backend, workspace_root=ws, mode="workspace-write")
        command = "echo x > f && git add f && git commit -qm from-the-command"
        env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
               "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}
        from bash_seam import BashExecRequest
        result = await ex.run(ex.resolve(BashExecRequest(command=command, workdir=ws, env=env)))
        state = ex._services.state.path
        await ex.aclose()
        print(json.dumps({"exit": result.exit_code, "stderr": result.stderr.text,
                          "git": [o.status.value for o in result.sandbox.git],
                          "state": state, "parent": state_parent((ws,))}))

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
def test_a_container_whose_disk_is_overlayfs_still_commits_in_workspace_write(
    tmp_path: Path, backend: str
) -> None:
    # In a container every candidate for the executor's state (TMPDIR, /var/tmp, /tmp,
    # ~/.cache) is on the container's overlayfs, which refuses to be an overlay's upper
    # layer: every workspace-write spawn in a repository failed ("mount overlay: EINVAL").
    # The state goes to this uid's directory in /dev/shm instead. Run in a mount namespace
    # of the test's own, each candidate (and /dev/shm) a mount of its own there.
    if os.geteuid() != 0:
        pytest.skip("needs root to mount in a namespace of its own (the root run has it)")
    uid = os.geteuid()
    layers = tmp_path / "layers"
    points = {
        "tmpdir": tmp_path / "tmpdir",
        "home": tmp_path / "home",
        "var": Path(f"/var/tmp/bash-sandbox-{uid}"),
        "tmp": Path(f"/tmp/bash-sandbox-{uid}"),
    }
    # /var/tmp gets a tmpfs of the namespace's first: its candidate is made there, not on the
    # host (the /tmp one is this uid's base, which every run makes anyway).
    script = ["set -e", "mount --make-rprivate /", "mount -t tmpfs -o size=1m var /var/tmp"]
    for name, point in points.items():
        for part in ("lower", "upper", "work"):
            (layers / name / part).mkdir(parents=True)
        if name in ("tmpdir", "home"):
            point.mkdir()
        script.append(
            f"mkdir -p {point} && mount -t overlay overlay -o lowerdir={layers / name}/lower,"
            f"upperdir={layers / name}/upper,workdir={layers / name}/work {point}"
        )
    script.append("mount -t tmpfs -o size=64m,mode=1777 shm /dev/shm")
    script.append('exec "$@"')
    ws = tmp_path / "ws"
    ws.mkdir()
    git = ["git", "-C", str(ws)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run(
        [*git, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty",
         "-m", "host"],
        check=True,
    )  # fmt: skip
    env = {**os.environ, "TMPDIR": str(points["tmpdir"]), "HOME": str(points["home"])}
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", "\n".join(script), "sh", sys.executable, "-c", CONTAINER,
         str(ws), backend],
        check=False, capture_output=True, text=True, timeout=120, env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["exit"] == 0, got["stderr"]
    assert got["git"] == ["applied"], got
    assert got["parent"] == f"/dev/shm/bash-sandbox-{uid}/state", got
    assert got["state"].startswith(got["parent"] + "/exec-"), got
    # From the host: the command's commit is in the repository, which fsck finds clean.
    log = subprocess.run([*git, "log", "--format=%s"], check=True, capture_output=True, text=True)
    assert log.stdout.split() == ["from-the-command", "host"]
    subprocess.run([*git, "fsck", "--strict", "--no-progress"], check=True, capture_output=True)
    # The state was in the namespace's own /dev/shm, never in the host's.
    assert not Path(got["state"]).exists()
