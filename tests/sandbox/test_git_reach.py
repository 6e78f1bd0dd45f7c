"""Every repository a command can reach, on the real kernel per Linux backend: deep ones,
ones in dependency dirs or behind a `.git` symlink are overlaid; ones the command creates
come back with git's default control plane; files installed hooks run stay read-only.
Each attack is checked from the host: host git runs and the planted marker is absent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.git_spawn import REASON_GITFILE
from bash_seam import BashExecRequest, BashRunResult
from tests.sandbox.conftest import ExecutorFactory

_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@e",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@e",
}


async def _run(ex: SandboxBashExecutor, command: str, workdir: Path) -> BashRunResult:
    return await ex.run(
        ex.resolve(BashExecRequest(command=command, workdir=str(workdir), env=dict(_ENV)))
    )


def host_git(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The host user's git, with the host's defaults (hooks and fsmonitor honoured)."""
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1", **_ENV)
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=30
    )
    if check:
        assert done.returncode == 0, (args, done.stderr)
    return done


def _hostile_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A repository elsewhere on the host whose config runs code (it touches the marker)."""
    marker = tmp_path / "pwned"
    hostile = tmp_path / "downloads" / "evil"
    _repo(hostile)
    host_git("config", "core.fsmonitor", f"touch {marker}", cwd=hostile)
    return marker, hostile


def _repo(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    host_git("init", "-q", cwd=path)
    (path / "a.txt").write_text("a\n")
    host_git("add", "a.txt", cwd=path)
    host_git("commit", "-qm", "first", cwd=path)


async def test_deep_dependency_dir_and_symlinked_repositories_keep_the_hosts_config(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    deep = workspace / "a/b/c/d/e/f"
    editable = workspace / ".venv/src/pkg"  # where `pip install -e git+...` checks out
    _repo(deep)
    _repo(editable)
    # A `.git` symlink to a git directory elsewhere in the workspace: git follows it.
    store, linked = workspace / "store", workspace / "linked"
    _repo(store)
    (store / ".git").rename(store / "real.git")
    linked.mkdir()
    os.symlink("../store/real.git", linked / ".git")
    host_git("config", "core.worktree", str(linked), cwd=linked)
    repos = (deep, editable, linked)
    configs = {r: (r / ".git" / "config").read_bytes() for r in repos}
    ex = make_executor(mode="workspace-write")
    attack = "; ".join(
        f"printf '[core]\\n\\tfsmonitor = touch {marker}\\n' >> {r}/.git/config" for r in repos
    )
    result = await _run(ex, attack, workspace)
    assert result.sandbox is not None and result.sandbox.enforcement == "full"
    for repo in repos:
        assert (repo / ".git" / "config").read_bytes() == configs[repo]
        host_git("status", "--short", cwd=repo)
        host_git("commit", "-q", "--allow-empty", "-m", "host", cwd=repo)
    assert not marker.exists()
    # A `.git` symlink is the command's to write: repointed, it is put back as it was.
    repoint = await _run(
        ex,
        f"git init -q planted && git -C planted config core.fsmonitor 'touch {marker}' && "
        "ln -sfn ../planted/.git linked/.git",
        workspace,
    )
    assert repoint.exit_code == 0, repoint.stderr.text
    assert os.readlink(linked / ".git") == "../store/real.git"
    host_git("status", "--short", cwd=linked)
    host_git("status", "--short", cwd=workspace / "planted")
    assert not marker.exists()


async def test_a_created_repository_comes_back_with_gits_default_control_plane(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    ex = make_executor(mode="workspace-write")
    plant = (
        f"git init -q x && git -C x config core.fsmonitor 'touch {marker}' && "
        f"git -C x config core.hooksPath hooks2 && git -C x config alias.st '!touch {marker}' && "
        "git -C x config remote.origin.url https://example.invalid/r.git && "
        f"mkdir -p x/hooks2 && for d in x/.git/hooks x/hooks2; do "
        f"printf '#!/bin/sh\\ntouch {marker}\\n' > $d/pre-commit; chmod +x $d/pre-commit; done && "
        "echo a > x/a.txt && git -C x add a.txt && git -C x -c core.hooksPath=/dev/null "
        "commit -qm made-inside && echo 'gitdir: ../../elsewhere' > x/.git/commondir"
    )
    result = await _run(ex, plant, workspace)
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    assert str(workspace / "x" / ".git") in result.sandbox.nested_repositories
    assert any("reset to git's default" in w for w in result.sandbox.warnings)
    # From the host: git runs nothing the command planted, and its work is all there.
    repo = workspace / "x"
    host_git("status", cwd=repo)
    host_git("st", cwd=repo, check=False)
    (repo / "b.txt").write_text("b\n")
    host_git("add", "b.txt", cwd=repo)
    host_git("commit", "-qm", "host", cwd=repo)
    assert not marker.exists()
    assert host_git("log", "--format=%s", cwd=repo).stdout.split() == ["host", "made-inside"]
    assert host_git("config", "remote.origin.url", cwd=repo).stdout.strip().endswith("r.git")
    assert os.listdir(repo / ".git" / "hooks") == []
    assert not (repo / ".git" / "commondir").exists()
    assert host_git("fsck", "--full", cwd=repo).returncode == 0


@pytest.mark.parametrize(
    "line",
    ['"{store}"', '"{store}"trailing', "{store}"],
    ids=["quoted", "quoted-then-more", "plain"],
)
async def test_a_created_repositorys_alternates_never_lead_host_git_out_of_the_roots(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, line: str
) -> None:
    # Git C-unquotes an alternates line that starts with a quote: read as a plain path that
    # line looked relative (inside the objects directory), was kept, and host git then read
    # objects from a store outside the roots, for the command (a pushed branch naming them
    # would carry them off). Any quote now counts as leading out, as a plain path outside.
    outside = tmp_path / "private"
    _repo(outside)
    secret = host_git("rev-parse", "HEAD", cwd=outside).stdout.strip()
    store = outside / ".git" / "objects"
    ex = make_executor(mode="workspace-write")
    plant = (
        "git init -q x && printf '%s\\n' '"
        + line.format(store=store)
        + "' > x/.git/objects/info/alternates"
    )
    result = await _run(ex, plant, workspace)
    assert result.exit_code == 0, result.stderr.text
    alternates = workspace / "x" / ".git" / "objects" / "info" / "alternates"
    assert not alternates.exists()  # from the host: dropped
    assert result.sandbox is not None
    assert any(str(alternates) in w for w in result.sandbox.warnings), result.sandbox.warnings
    seen = host_git("cat-file", "-e", secret, cwd=workspace / "x", check=False)
    assert seen.returncode != 0  # host git reaches no object of the private store


async def test_clone_worktree_submodule_and_cargo_new_work_and_run_nothing_planted(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    origin = tmp_path / "origin"
    _repo(origin)
    ex = make_executor(mode="workspace-write")
    # Nothing planted: listed in the facts, and not a word of warning to learn to ignore.
    clean = await _run(ex, f"git init -q plain && git clone -q {origin} copy", workspace)
    assert clean.exit_code == 0 and clean.sandbox is not None, clean.stderr.text
    assert set(clean.sandbox.nested_repositories) == {
        str(workspace / "plain" / ".git"),
        str(workspace / "copy" / ".git"),
    }
    assert not [w for w in clean.sandbox.warnings if w.startswith("git:")]
    command = (
        f"git clone -q {origin} y && git -C y worktree add -q ../y-wt && "
        f"git -C y -c protocol.file.allow=always submodule add -q {origin} sub && "
        "git -C y commit -qm sub && "
        f"git -C y config core.pager 'touch {marker}; cat' && "
        f"git -C y-wt config --worktree core.fsmonitor 'touch {marker}' 2>/dev/null; "
        "git -C y config extensions.worktreeConfig true; true"
    )
    tools = [t for t in ("cargo", "uv") if shutil.which(t)]
    if "cargo" in tools:
        command += " && cargo new -q --vcs git newcrate"
    if "uv" in tools:
        command += " && uv init -q --vcs git uvproj"
    result = await _run(ex, command, workspace)
    assert result.exit_code == 0, result.stderr.text
    made = {"cargo": "newcrate", "uv": "uvproj"}
    for repo in ("y", "y-wt", "y/sub", *(made[t] for t in tools)):
        done = host_git("-c", "core.pager=cat", "status", cwd=workspace / repo)
        assert "warning" not in done.stderr.lower(), done.stderr
    for repo in ("y", "y-wt", "y/sub"):
        host_git("log", "-1", "-p", cwd=workspace / repo)
    host_git("submodule", "status", cwd=workspace / "y")
    assert not marker.exists()
    assert host_git("config", "remote.origin.url", cwd=workspace / "y").stdout.strip() == str(
        origin
    )


async def test_a_gitfile_leading_out_of_the_workspace_is_removed(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A repository elsewhere on the host whose config runs code: a gitfile the command
    # plants would make the user's `git status` in the workspace run it.
    marker, hostile = _hostile_repo(tmp_path)
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, f"mkdir sub && echo 'gitdir: {hostile}/.git' > sub/.git", workspace)
    assert result.exit_code == 0
    assert not (workspace / "sub" / ".git").exists()
    host_git("status", cwd=workspace / "sub", check=False)
    assert not marker.exists()


async def test_a_gitlink_added_with_index_v4_is_reported(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    _repo(workspace)
    head = host_git("rev-parse", "HEAD", cwd=workspace).stdout.strip()
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        "git update-index --index-version 4 && "
        f"git update-index --add --cacheinfo 160000,{head},vendor/lib",
        workspace,
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    assert str(workspace / "vendor" / "lib") in result.sandbox.nested_repositories


def _hook(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.mark.parametrize("manager", ["husky", "pre-commit", "lefthook"])
async def test_files_an_installed_hook_runs_stay_read_only_and_the_denial_names_the_hook(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, manager: str
) -> None:
    marker = tmp_path / "pwned"
    _repo(workspace)
    if manager == "husky":  # husky 9: hooksPath .husky/_, each hook runs .husky/<hook>
        host_git("config", "core.hooksPath", ".husky/_", cwd=workspace)
        _hook(workspace / ".husky/_/pre-commit", 'sh "$(dirname "$0")/../pre-commit"\n')
        (workspace / ".husky/pre-commit").write_text("true\n")
        attack, target = f"echo 'touch {marker}' >> .husky/pre-commit", ".husky/pre-commit"
    elif manager == "pre-commit":  # `pre-commit install`'s hook, running a local hook
        _hook(
            workspace / ".git/hooks/pre-commit",
            "# pre-commit hook-impl --config=.pre-commit-config.yaml\nsh scripts/check.sh\n",
        )
        (workspace / ".pre-commit-config.yaml").write_text(
            "repos:\n- repo: local\n  hooks:\n  - id: check\n    entry: scripts/check.sh\n"
        )
        (workspace / "scripts").mkdir()
        (workspace / "scripts/check.sh").write_text("true\n")
        attack, target = f"echo 'touch {marker}' >> scripts/check.sh", "scripts/check.sh"
    else:  # lefthook: a local config, missing, is merged in when it appears
        _hook(
            workspace / ".git/hooks/pre-commit",
            "# lefthook\n[ -f lefthook-local.yml ] && sh lefthook-local.yml\nexit 0\n",
        )
        (workspace / "lefthook.yml").write_text("pre-commit:\n  commands: {}\n")
        attack, target = f"echo 'touch {marker}' > lefthook-local.yml", "lefthook-local.yml"
    host_git("add", "-A", cwd=workspace)
    host_git("commit", "-qm", "hooks", cwd=workspace)
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, attack, workspace)
    assert result.sandbox is not None and result.sandbox.denied
    reasons = [d.reason for d in result.sandbox.denials if d.target == str(workspace / target)]
    assert reasons and all("hook chain" in r and manager in r for r in reasons), (
        result.sandbox.denials
    )
    # The host's next commit runs the hook: nothing the command wrote.
    (workspace / "b.txt").write_text("b\n")
    host_git("add", "b.txt", cwd=workspace)
    host_git("commit", "-qm", "host", cwd=workspace)
    assert not marker.exists()
    if manager == "lefthook":
        assert not (workspace / "lefthook-local.yml").exists()  # the placeholder is gone
    # Ordinary work next to the chain still works.
    ok = await _run(ex, "echo c > c.txt && git add c.txt && git commit -qm inside", workspace)
    assert ok.exit_code == 0, ok.stderr.text


async def test_the_hook_chain_protection_can_be_switched_off(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    _repo(workspace)
    host_git("config", "core.hooksPath", ".husky/_", cwd=workspace)
    _hook(workspace / ".husky/_/pre-commit", 'sh "$(dirname "$0")/../pre-commit"\n')
    (workspace / ".husky/pre-commit").write_text("true\n")
    ex = make_executor(mode="workspace-write", protect_hook_chain=False)
    result = await _run(ex, "echo 'npm test' >> .husky/pre-commit", workspace)
    assert result.exit_code == 0, result.stderr.text
    assert (workspace / ".husky/pre-commit").read_text() == "true\nnpm test\n"


async def test_bare_repositories_in_the_workspace_run_nothing_the_command_planted(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A bare repository used as a local remote: a push from the host runs its hooks.
    marker = tmp_path / "pwned"
    _repo(workspace / "app")
    host_git("clone", "-q", "--bare", str(workspace / "app"), str(workspace / "remote.git"),
             cwd=workspace)  # fmt: skip
    config = (workspace / "remote.git" / "config").read_bytes()
    ex = make_executor(mode="workspace-write")
    hook = (
        f"printf '#!/bin/sh\\ntouch {marker}\\n' > %s/hooks/post-receive; "
        "chmod +x %s/hooks/post-receive"
    )
    result = await _run(
        ex,
        f"{hook % ('remote.git', 'remote.git')}; "
        f"printf '[core]\\n\\tfsmonitor = touch {marker}\\n' >> remote.git/config; "
        f"git init -q --bare made.git && {hook % ('made.git', 'made.git')}",
        workspace,
    )
    assert result.sandbox is not None
    assert (workspace / "remote.git" / "config").read_bytes() == config
    assert str(workspace / "made.git") in result.sandbox.nested_repositories
    for remote in ("remote.git", "made.git"):
        host_git(
            "push", "-q", str(workspace / remote), "HEAD:refs/heads/pushed", cwd=workspace / "app"
        )
        host_git("--git-dir", str(workspace / remote), "log", "-1", "pushed", cwd=workspace)
    assert not marker.exists()


async def test_a_bare_repository_git_takes_for_one_however_its_head_is_spelled_is_reset(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # git's `is_git_directory` takes `ref:refs/...` (no blank), a HEAD symlink into refs/,
    # and `objects`/`refs` found through a `commondir` file; a HEAD rewritten in place by a
    # later command leaves its directory's ctime (the search's cache key) as it was; a
    # repository inside a bare one is found first by host git run below it.
    marker = tmp_path / "pwned"
    _repo(workspace / "app")
    hook = (
        f"printf '#!/bin/sh\\ntouch {marker}\\n' > %s/hooks/post-receive"
        " && chmod +x %s/hooks/post-receive"
    )
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        " && ".join(
            (
                f"git init -q --bare nospace.git && {hook % ('nospace.git', 'nospace.git')}",
                "printf 'ref:refs/heads/master' > nospace.git/HEAD",
                f"git init -q --bare link.git && {hook % ('link.git', 'link.git')}",
                "ln -sf refs/heads/master link.git/HEAD",
                f"git init -q --bare common.git && {hook % ('common.git', 'common.git')}",
                "rm common.git/HEAD && mkdir viacommon.git",
                "echo 'ref: refs/heads/master' > viacommon.git/HEAD",
                "echo ../common.git > viacommon.git/commondir",
                "git init -q --bare outer.git && git init -q outer.git/sub",
                f"printf '[core]\\n\\tfsmonitor = touch {marker}\\n' >> outer.git/sub/.git/config",
                f"git init -q --bare later.git && {hook % ('later.git', 'later.git')}",
                "echo not-yet > later.git/HEAD && sleep 0.5",
            )
        ),
        workspace,
    )
    assert result.exit_code == 0, result.stderr.text
    result = await _run(ex, "echo 'ref: refs/heads/master' > later.git/HEAD", workspace)
    assert result.exit_code == 0, result.stderr.text
    for remote in ("nospace.git", "link.git", "viacommon.git", "later.git"):
        host_git("push", "-q", str(workspace / remote), "HEAD:refs/heads/pushed",
                 cwd=workspace / "app", check=False)  # fmt: skip
    host_git("status", cwd=workspace / "outer.git" / "sub")
    assert not marker.exists()


@pytest.mark.xfail(
    strict=True,
    reason="a repository the command creates is reset only after the command ends "
    "(settle_git); while a start()ed command runs, host git there (an editor's status "
    "poll, a shell prompt) obeys its planted config. Needs the write watch to give a new "
    "`.git` (or bare layout) an overlay from its mkdir on, or to hold it from host git",
)
async def test_host_git_in_a_repository_a_running_command_created_runs_nothing_planted(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    _repo(workspace)
    ex = make_executor(mode="workspace-write")
    proc = await ex.start(
        ex.resolve(
            BashExecRequest(
                command="git init -q sub && printf '[core]\\n\\tfsmonitor = touch "
                f"{marker}\\n' >> sub/.git/config && touch sub/ready && sleep 60",
                workdir=str(workspace),
                env=dict(_ENV),
            )
        )
    )
    try:
        for _ in range(400):
            if (workspace / "sub" / "ready").exists():
                break
            await asyncio.sleep(0.05)
        assert (workspace / "sub" / "ready").exists()
        host_git("status", "--short", cwd=workspace / "sub")  # a host tool's poll
        assert not marker.exists()
    finally:
        proc.kill()
        await asyncio.wait_for(proc.wait(), 20)


async def test_a_created_repos_worktree_behind_a_link_swapped_later_writes_nothing_outside(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # `core.worktree = ../../link`, inside the workspace when the repository was reset; the
    # next command points `link` at a host directory; the user's `git checkout -- .` (or
    # `reset --hard`) in the repository then wrote its files there.
    outside = tmp_path / "outside"
    outside.mkdir()
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        "mkdir real && ln -s real link && git init -q made"
        " && git -C made config core.worktree ../../link && echo owned > real/planted.txt"
        " && git -C made add planted.txt && git -C made commit -qm c",
        workspace,
    )
    assert result.exit_code == 0, result.stderr.text
    result = await _run(ex, f"rm link && ln -s {outside} link", workspace)
    assert result.exit_code == 0, result.stderr.text
    for args in (("checkout", "--", "."), ("reset", "-q", "--hard")):
        host_git(*args, cwd=workspace / "made", check=False)
    assert list(outside.iterdir()) == []
    assert host_git("log", "--format=%s", cwd=workspace / "made").stdout.split() == ["c"]


async def test_a_new_submodules_worktree_behind_a_link_swapped_later_writes_nothing_outside(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    _repo(workspace)
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        "mkdir real x && ln -s real link && git init -q --bare .git/modules/x"
        " && git --git-dir=.git/modules/x config core.bare false"
        " && git --git-dir=.git/modules/x config core.worktree ../../../link"
        " && echo 'gitdir: ../.git/modules/x' > x/.git && echo owned > real/planted.txt"
        " && cd x && git add planted.txt && git commit -qm c",
        workspace,
    )
    assert result.exit_code == 0, result.stderr.text
    result = await _run(ex, f"rm link && ln -s {outside} link", workspace)
    assert result.exit_code == 0, result.stderr.text
    host_git("checkout", "--", ".", cwd=workspace / "x", check=False)
    assert list(outside.iterdir()) == []


async def test_a_hook_chain_that_cannot_be_covered_makes_the_run_partial_and_names_it(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # husky 4: the installed hook runs what package.json says; package.json stays writable.
    _repo(workspace)
    _hook(workspace / ".git/hooks/pre-commit", '# husky\n. "$(dirname "$0")/husky.sh"\n')
    (workspace / "package.json").write_text('{"husky": {"hooks": {"pre-commit": "true"}}}\n')
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, "echo edited >> package.json", workspace)
    assert result.exit_code == 0 and result.sandbox is not None
    assert result.sandbox.enforcement == "partial"
    assert any("husky 4" in w and "package.json" in w for w in result.sandbox.warnings)


async def test_an_include_git_reads_stays_read_only_however_it_is_spelled(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A value continued over two lines: git reads `../local.cfg`; a line-based reader does not.
    marker = tmp_path / "pwned"
    _repo(workspace)
    with (workspace / ".git" / "config").open("a") as fh:
        fh.write("[include]\n\tpath = ../lo\\\ncal.cfg\n")
    (workspace / "local.cfg").write_text("[user]\n\tname = t\n")
    assert "user.name" in host_git("config", "--list", "--show-origin", cwd=workspace).stdout
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex, f"printf '[core]\\n\\tfsmonitor = touch {marker}\\n' >> local.cfg", workspace
    )
    assert result.sandbox is not None and result.sandbox.denied
    assert (workspace / "local.cfg").read_text() == "[user]\n\tname = t\n"
    host_git("status", cwd=workspace)
    assert not marker.exists()


@contextlib.contextmanager
def host_mounts_watched() -> Iterator[list[bool]]:
    """Yields a list that holds True at exit if the host's mount table changed meanwhile
    (the tree watch starts over then: another test's tmpfs is not this test's doing)."""
    changed: list[bool] = []
    with open("/proc/self/mountinfo") as mounts:
        watch = select.poll()
        watch.register(mounts, select.POLLPRI | select.POLLERR)
        watch.poll(0)
        try:
            yield changed
        finally:
            changed.append(bool(watch.poll(0)))


async def test_a_repository_made_deep_in_a_watched_tree_is_overlaid_for_the_next_command(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # The executor keeps the workspace's tree with inotify (`git_tree_watch.py`): what a
    # command makes through the sandbox's own mounts must reach the next command's search.
    marker = tmp_path / "pwned"
    for i in range(50):
        (workspace / "src" / f"p{i}" / "q").mkdir(parents=True)
    ex = make_executor(mode="workspace-write")
    with host_mounts_watched() as mounts_changed:
        await _made_deep_and_attacked(ex, workspace, marker)
    tree = ex._services.git_tree
    # Kept and drained; started over only if the host's mounts changed meanwhile.
    assert tree.walked == 0 and tree.answered >= 6, "kept tree, drained"
    assert tree.rebuilt == 0 or mounts_changed[0], tree.rebuilt


async def _made_deep_and_attacked(ex: SandboxBashExecutor, workspace: Path, marker: Path) -> None:
    first = await _run(ex, "true", workspace)
    assert first.sandbox is not None and first.sandbox.enforcement == "full"
    made = await _run(ex, "mkdir -p src/p7/q/a/b/c/d && git init -q src/p7/q/a/b/c/d", workspace)
    assert made.exit_code == 0, made.stderr.text
    repo = workspace / "src/p7/q/a/b/c/d"
    assert made.sandbox is not None
    assert str(repo / ".git") in made.sandbox.nested_repositories
    config = (repo / ".git" / "config").read_bytes()
    hooks = sorted(os.listdir(repo / ".git" / "hooks"))
    plant = (
        f"printf '#!/bin/sh\\ntouch {marker}\\n' > {repo}/.git/hooks/pre-commit; "
        f"chmod +x {repo}/.git/hooks/pre-commit; "
        f"git -C {repo} config core.fsmonitor 'touch {marker}'"
    )
    attack = await _run(ex, plant, workspace)
    assert attack.sandbox is not None and attack.sandbox.enforcement == "full"
    # Overlaid: nothing the command wrote to the repository's control plane is on the host.
    assert (repo / ".git" / "config").read_bytes() == config
    assert sorted(os.listdir(repo / ".git" / "hooks")) == hooks
    host_git("status", cwd=repo)
    host_git("commit", "-q", "--allow-empty", "-m", "host", cwd=repo)
    assert not marker.exists()


async def test_a_gitfile_rewritten_in_place_in_a_watched_tree_is_put_back(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # Rewritten in place, a gitfile changes no name in its directory: no event says so.
    # Every search reads each `.git` entry it keeps, so the change is still seen.
    marker, hostile = _hostile_repo(tmp_path)
    main = workspace / "main"
    _repo(main)
    worktree = workspace / "deep" / "er" / "wt"
    host_git("worktree", "add", "-q", str(worktree), cwd=main)
    gitfile = worktree / ".git"
    before = gitfile.read_bytes()
    ex = make_executor(mode="workspace-write")
    with host_mounts_watched() as mounts_changed:
        first = await _run(ex, "true", workspace)
        assert first.exit_code == 0, first.stderr.text
        # `>` truncates and writes the same inode: no name event in its directory.
        result = await _run(ex, f"printf 'gitdir: {hostile}/.git\\n' > {gitfile}", workspace)
    assert gitfile.read_bytes() == before
    assert result.sandbox is not None
    assert result.exit_code == 0, result.stderr.text
    assert any("put back" in w for w in result.sandbox.warnings), result.sandbox.warnings
    host_git("status", cwd=worktree)
    assert not marker.exists()
    tree = ex._services.git_tree
    assert tree.walked == 0 and tree.answered >= 4
    assert tree.rebuilt == 0 or mounts_changed[0], tree.rebuilt


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root lists any directory (the unprivileged leg runs this)"
)
@pytest.mark.parametrize("made_by", ["command", "host"])
async def test_a_repository_in_a_directory_its_owner_cannot_list_runs_nothing_planted(
    made_by: str, make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # chmod 0311: enterable, not listable. Host git only enters it to reach the repository;
    # the search must reach it too, or the repository keeps what the command planted.
    marker = tmp_path / "pwned"
    repo = workspace / "d" / "sub"
    hook = f"printf '#!/bin/sh\\ntouch {marker}\\n' > d/sub/.git/hooks/pre-commit"
    if made_by == "host":
        _repo(repo)
        os.chmod(workspace / "d", 0o311)
        plant = f"{hook}; chmod +x d/sub/.git/hooks/pre-commit; true"
    else:
        plant = (
            f"mkdir -p d/sub && git init -q d/sub && {hook} && "
            "chmod +x d/sub/.git/hooks/pre-commit && chmod 0311 d"
        )
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, plant, workspace)
    assert result.exit_code == 0, result.stderr.text
    (repo / "b.txt").write_text("b\n")
    host_git("add", "b.txt", cwd=repo)
    host_git("commit", "-qm", "host", cwd=repo)
    assert not marker.exists()
    assert host_git("log", "-1", "--format=%s", cwd=repo).stdout.strip() == "host"


async def test_a_hooks_path_the_host_sets_between_commands_is_covered_for_the_next(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Host git's config answer is kept between spawns (`git_hook_chain.host_config`); the
    # host's change between two commands must reach the next one. The repository is fresh,
    # so the window that keeps just-written files from being trusted is narrowed to engage
    # the kept answer at all.
    from bash_sandbox import git_hook_chain

    monkeypatch.setattr(git_hook_chain._ANSWERS, "racy_ns", 0)
    marker = tmp_path / "pwned"
    _repo(workspace)
    await asyncio.sleep(0.05)
    ex = make_executor(mode="workspace-write")
    first = await _run(ex, "true", workspace)
    assert first.exit_code == 0, first.stderr.text
    kept = len(git_hook_chain._ANSWERS)
    assert kept >= 1  # the answer is kept: the next spawn checks stamps only
    host_git("config", "core.hooksPath", ".githooks", cwd=workspace)
    await asyncio.sleep(0.05)
    plant = (
        f"mkdir -p .githooks && printf '#!/bin/sh\\ntouch {marker}\\n' > .githooks/post-checkout"
    )
    result = await _run(ex, f"{plant} && chmod +x .githooks/post-checkout", workspace)
    assert result.exit_code != 0
    assert result.sandbox is not None and result.sandbox.denied
    assert not (workspace / ".githooks" / "post-checkout").exists()
    host_git("checkout", "-q", "-b", "other", cwd=workspace)
    assert not marker.exists()


# -- git directories hidden where the search never looks, named by a `.git` elsewhere ------

_EVIL = "git init -q --bare {d} && git --git-dir={d} config core.bare false && " \
    "git --git-dir={d} config core.fsmonitor 'touch {marker}; false'"  # fmt: skip


@pytest.mark.parametrize(
    "route",
    ["newline-gitfile", "gitfile-first", "symlink-first", "other-workspace"],
)
async def test_a_git_dir_hidden_in_a_created_one_and_named_by_a_gitfile_runs_nothing(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, route: str
) -> None:
    # A complete git directory below a new `.git` (`sub/.git/evil`), where the repository
    # search never looks, led host git into by a gitfile or a link: (a) in one command,
    # through a gitfile git reads as `evil\n` (`gitdir: x\n\0`: the NUL keeps the newline)
    # where the sandbox read `evil`, which did not exist, so the gitfile was kept; (b) the
    # gitfile or link written by one command while its target did not exist yet (kept: it
    # leads nowhere), the git directory by the next one (the unchanged gitfile was never
    # looked at again); (c) the gitfile in another workspace, the git directory made by an
    # executor whose roots do not hold that gitfile at all. Found by a red team: host
    # `git status` in `a/` ran the planted fsmonitor on both backends.
    marker = tmp_path / "pwned"
    ex = make_executor(mode="workspace-write")
    here = workspace
    if route == "newline-gitfile":
        evil = "\"$(printf 'sub/.git/evil\\nX')\"; d=${d%X}"
        plant = (
            f"mkdir -p a sub/.git && d={evil} && " + _EVIL.format(d='"$d"', marker=marker)
            + " && printf 'gitdir: ../sub/.git/evil\\n\\0' > a/.git"
        )  # fmt: skip
        result = await _run(ex, plant, workspace)
        assert result.exit_code == 0, result.stderr.text
    else:
        target = "../sub/.git/evil"
        maker = ex
        if route == "other-workspace":
            # The gitfile in this workspace names a place in another writable root; the git
            # directory there is made later by an executor of that root alone.
            other = tmp_path / "other"
            other.mkdir()
            ex = make_executor(mode="workspace-write", writable_roots=[str(other)])
            maker = make_executor(mode="workspace-write", workspace_root=str(other))
            target, here = f"{other}/sub/.git/evil", other
        link = f"ln -s {target} a/.git" if route == "symlink-first" else (
            f"printf 'gitdir: {target}\\n' > a/.git")  # fmt: skip
        first = await _run(ex, f"mkdir a && {link}", workspace)
        assert first.exit_code == 0, first.stderr.text
        second = await _run(
            maker, "mkdir -p sub/.git && " + _EVIL.format(d="sub/.git/evil", marker=marker), here
        )
        assert second.exit_code == 0, second.stderr.text
    # From the host: git in `a` (wherever its gitfile or link leads) runs nothing planted.
    _host_git_runs_nothing(workspace / "a", marker)


def _host_git_runs_nothing(where: Path, marker: Path) -> None:
    """The user's `git status` and `git diff` in ``where``, a file changed first (so
    git looks at the worktree, where an fsmonitor runs): ``marker`` never appears."""
    (where / "f.txt").write_text("x\n")
    host_git("status", "--short", cwd=where, check=False)
    host_git("diff", cwd=where, check=False)
    assert not marker.exists()


async def test_a_worktree_the_import_or_the_reset_would_place_outside_the_roots_is_refused(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A linked worktree's `gitdir` names where its `.git` file is: host `git worktree
    # repair` writes one there, and `git worktree remove --force` deletes the directory. The
    # import took any absolute path (found by a red team: repair then made `victim/.git`
    # outside every root), and a created repository's reset did not look at it.
    victim = tmp_path / "victim"
    victim.mkdir()
    _repo(workspace)
    # In the host's repository (imported) and in one the same command creates (reset).
    plant = (
        "git init -q made && git -C made commit -q --allow-empty -m m && "
        "for g in .git made/.git; do mkdir -p $g/worktrees/x && git rev-parse HEAD > "
        f"$g/worktrees/x/HEAD && echo ../.. > $g/worktrees/x/commondir && echo {victim}/.git "
        "> $g/worktrees/x/gitdir && cp .git/index $g/worktrees/x/index; done"
    )
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, plant, workspace)
    assert result.exit_code == 0, result.stderr.text
    assert result.sandbox is not None
    assert any("worktrees/x/gitdir" in w for w in result.sandbox.warnings), result.sandbox.warnings
    for repo in (workspace, workspace / "made"):
        host_git("worktree", "repair", cwd=repo, check=False)
        host_git("worktree", "prune", cwd=repo, check=False)
    assert not (victim / ".git").exists()
    assert os.listdir(victim) == []
    # A worktree inside the roots is still made, imported and usable from the host.
    added = await _run(ex, "git worktree add -q -b wt-in wt-in", workspace)
    assert added.exit_code == 0, added.stderr.text
    assert host_git("status", "--short", cwd=workspace / "wt-in").returncode == 0
    listed = host_git("worktree", "list", "--porcelain", cwd=workspace).stdout
    assert f"worktree {workspace / 'wt-in'}" in listed
    assert host_git("fsck", "--strict", cwd=workspace).returncode == 0


async def test_a_git_planted_on_the_harness_path_never_runs_on_the_host(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A harness whose PATH holds a directory in the workspace (an activated `.venv`,
    # `node_modules/.bin`): the executor ran `git` by name for its own work after each
    # command (the repository questions, the resets, the import), so a `git` the command
    # wrote there ran on the host, unconfined (found by a red team on both backends: the
    # marker named every call). Host git is now the system's, by absolute path, and what it
    # runs finds only the system's directories.
    marker = tmp_path / "ran-planted-git"
    _repo(workspace)
    monkeypatch.setenv("PATH", f"{workspace}/.venv/bin:{os.environ['PATH']}")
    ex = make_executor(mode="workspace-write")
    plant = (
        "mkdir -p .venv/bin && for g in git git-upload-pack git-receive-pack sh; do "
        f"printf '#!/bin/sh\\necho \"$0 $*\" >> {marker}\\nexec /usr/bin/'$g' \"$@\"\\n' "
        "> .venv/bin/$g; chmod +x .venv/bin/$g; done"
    )
    result = await _run(ex, plant, workspace)
    assert result.exit_code == 0, result.stderr.text
    assert (workspace / ".venv" / "bin" / "git").is_file()  # from the host: it is there
    # Every host-side git the executor runs: a commit imported, a repository created and
    # reset, a submodule's gitlink, the hook chain asked again.
    work = (
        "echo b > b.txt && git add b.txt && git commit -qm second && git init -q made && "
        "git -C made commit -q --allow-empty -m m && echo x > .git/info/exclude-not"
    )
    again = await _run(ex, work, workspace)
    assert again.exit_code == 0, again.stderr.text
    assert not marker.exists(), marker.read_text()
    # (The user's own shell with that PATH would run it too: the check uses the system's.)
    monkeypatch.undo()
    assert host_git("log", "-1", "--format=%s", cwd=workspace).stdout.strip() == "second"


async def test_a_repository_posing_as_a_linked_worktrees_admin_dir_is_reset(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # `r/.git/worktrees/evil` with objects, refs and a config of its own and no `commondir`
    # is a repository to git, not a linked worktree's admin dir: the reset skipped every
    # directory in a `worktrees/`, and host `git status` in `w` (a gitfile naming it) ran
    # its fsmonitor (red team, both backends, one command, nothing reported).
    marker = tmp_path / "pwned"
    ex = make_executor(mode="workspace-write")
    plant = (
        "git init -q r && " + _EVIL.format(d="r/.git/worktrees/evil", marker=marker)
        + " && mkdir w && printf 'gitdir: ../r/.git/worktrees/evil\\n' > w/.git"
    )  # fmt: skip
    result = await _run(ex, plant, workspace)
    assert result.exit_code == 0, result.stderr.text
    _host_git_runs_nothing(workspace / "w", marker)


async def test_a_gitfile_that_a_later_link_leads_out_of_the_roots_is_removed(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # `sub/.git` says `gitdir: ../lnk` while `lnk` does not exist (inside the roots: kept);
    # the next command makes `lnk` a link to a repository outside. The gitfile's bytes never
    # changed, so it was not looked at again, and the user's `git add -A && git commit` in
    # `sub` wrote into that other repository (red team, both backends).
    victim = tmp_path / "victim"
    _repo(victim)
    before = host_git("rev-parse", "HEAD", cwd=victim).stdout
    ex = make_executor(mode="workspace-write")
    first = await _run(ex, "mkdir sub && printf 'gitdir: ../lnk\\n' > sub/.git", workspace)
    assert first.exit_code == 0, first.stderr.text
    for link in (
        f"ln -s {victim}/.git lnk",
        f"ln -s {victim} lnk-dir && ln -s lnk-dir/.git lnk",
    ):
        second = await _run(ex, link + " && echo planted > sub/planted.txt", workspace)
        assert second.exit_code == 0, second.stderr.text
        # From the host: git in `sub` never reaches the other repository.
        seen = host_git("rev-parse", "--absolute-git-dir", cwd=workspace / "sub", check=False)
        assert str(victim) not in seen.stdout
        host_git("add", "-A", cwd=workspace / "sub", check=False)
        host_git("commit", "-qm", "user", cwd=workspace / "sub", check=False)
        assert host_git("rev-parse", "HEAD", cwd=victim).stdout == before
        assert host_git("status", "--porcelain", cwd=victim).stdout == ""
        # The next round starts as the first did: the gitfile leading nowhere yet.
        (workspace / "lnk").unlink()
        (workspace / "sub" / ".git").write_text("gitdir: ../lnk\n")


@pytest.mark.parametrize("swap", ["removed-then-linked", "moved-then-linked"])
async def test_a_linked_worktree_cannot_be_swapped_for_a_link_out(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, swap: str
) -> None:
    # The host's `git worktree repair` writes `<worktree>/.git`, and `remove --force` empties
    # the worktree, following a link the command put where the worktree was: the worktree
    # directories the host's git dir names stay where they are, a missing one held.
    host_git("init", "-q", cwd=workspace)
    (workspace / "a").write_text("a\n")
    host_git("add", "a", cwd=workspace)
    host_git("commit", "-qm", "a", cwd=workspace)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data.txt").write_text("precious\n")
    ex = make_executor(mode="workspace-write")
    if swap == "removed-then-linked":
        made = await _run(ex, "git worktree add -q wt && rm -rf wt", workspace)
        assert made.exit_code == 0, made.stderr.text
        attack = f"ln -s {victim} wt"
    else:
        host_git("worktree", "add", "-q", "wt", cwd=workspace)
        attack = f"mv wt wt-moved && ln -s {victim} wt"
    result = await _run(ex, attack, workspace)
    assert result.sandbox is not None
    if swap == "removed-then-linked":
        assert result.exit_code != 0  # the missing worktree's place is held
    else:
        # The worktree stays movable (`git worktree move`, `remove`): the link is taken away.
        assert any("removed symlinks" in w for w in result.sandbox.warnings), result.sandbox
    assert not (workspace / "wt").is_symlink()
    await ex.aclose()
    host_git("worktree", "repair", cwd=workspace, check=False)
    host_git("worktree", "remove", "--force", "wt", cwd=workspace, check=False)
    assert not (victim / ".git").exists()
    assert (victim / "data.txt").read_text() == "precious\n"
    # Ordinary worktree work goes on: a new one is added and used.
    ex = make_executor(mode="workspace-write")
    work = await _run(
        ex, "git worktree add -q wt2 && echo b > wt2/b && git -C wt2 add b", workspace
    )
    assert work.exit_code == 0, work.stderr.text
    assert (workspace / "wt2" / "b").exists()
    removed = await _run(ex, "git worktree remove --force wt2", workspace)
    assert removed.exit_code == 0, removed.stderr.text
    assert not (workspace / "wt2").exists()


@pytest.mark.parametrize("planted", ["HEAD", "packed-refs", "refs/heads/x", "config"])
@pytest.mark.parametrize("while_running", [False, True])
async def test_a_fifo_in_a_repository_the_command_makes_stalls_nothing(
    make_executor: ExecutorFactory, workspace: Path, planted: str, while_running: bool
) -> None:
    # The executor read `r/.git/HEAD` on its loop at the next spawn: a FIFO there stopped
    # the loop, and with it every timeout, kill and `aclose()` (a red team's). Host git run
    # on the repository stalled the same way. Also while the command that made it still runs.
    ex = make_executor(mode="workspace-write")
    plant = f"git init -q r && rm -f r/.git/{planted} && mkfifo r/.git/{planted}"
    if while_running:
        gate = workspace / "gate"
        os.mkfifo(gate)
        bg = await ex.start(
            ex.resolve(
                BashExecRequest(
                    command=f"{plant} && echo made > made && read x < gate",
                    workdir=str(workspace),
                    timeout_ms=60_000,
                )
            )
        )
        for _ in range(400):
            if (workspace / "made").exists():
                break
            await asyncio.sleep(0.05)
        assert (workspace / "made").exists()
    else:
        made = await _run(ex, plant, workspace)
        assert made.exit_code == 0, made.stderr.text
        assert made.sandbox is not None
        dropped = [w for w in made.sandbox.warnings if "reset to git's default" in w]
        assert dropped and planted in dropped[0], made.sandbox.warnings
        left = workspace / "r" / ".git" / planted
        assert not left.exists() or stat.S_ISREG(left.lstat().st_mode)  # a config is re-made
    started = asyncio.get_running_loop().time()
    nxt = await asyncio.wait_for(_run(ex, "echo next", workspace), 30)
    assert nxt.stdout.text == "next\n", nxt.stderr.text
    assert asyncio.get_running_loop().time() - started < 8  # no git waited out its bound
    if while_running:
        with open(gate, "w") as fh:
            fh.write("go\n")
        await asyncio.wait_for(bg.wait(), 30)
        assert bg.exit_code == 0
    await asyncio.wait_for(ex.aclose(), 30)


async def test_worktrees_beyond_the_held_ones_lose_their_links_too(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A spawn holds the missing directories of the first few registered worktrees only; a
    # command that registered more linked every other one out (a red team's 600): the links
    # are taken away after the command whatever their number.
    from bash_sandbox import host_view

    monkeypatch.setattr(host_view, "WORKTREES_HELD", 2)
    host_git("init", "-q", cwd=workspace)
    (workspace / "a").write_text("a\n")
    host_git("add", "a", cwd=workspace)
    host_git("commit", "-qm", "a", cwd=workspace)
    victim = tmp_path / "victim"
    victim.mkdir()
    ex = make_executor(mode="workspace-write")
    register = " && ".join(f"git worktree add -q w{i} && rm -rf w{i}" for i in range(5))
    made = await _run(ex, register, workspace)
    assert made.exit_code == 0, made.stderr.text
    linked = await _run(ex, " ; ".join(f"ln -s {victim} w{i}" for i in range(5)), workspace)
    assert linked.sandbox is not None
    assert [n for n in os.listdir(workspace) if (workspace / n).is_symlink()] == []
    await ex.aclose()
    host_git("worktree", "repair", cwd=workspace, check=False)
    assert os.listdir(victim) == []


async def test_a_huge_sparse_index_in_a_repository_the_command_makes_is_dropped_not_copied(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # The reset copied a created repository's index whole to the host's temp directory
    # before git judged it: `truncate -s 2G` took the settle 15 s, 100G filled the disk.
    ex = make_executor(mode="workspace-write")
    started = asyncio.get_running_loop().time()
    result = await _run(ex, "git init -q r && truncate -s 4G r/.git/index", workspace)
    assert asyncio.get_running_loop().time() - started < 20
    assert result.exit_code == 0, result.stderr.text
    assert not (workspace / "r" / ".git" / "index").exists()
    assert (workspace / "r" / ".git" / "HEAD").exists()  # the rest of the repository stays


async def test_a_link_that_cannot_be_resolved_skips_no_reset_and_fails_no_later_call(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A `.git` link through a thousand links (`realpath` raised RecursionError) skipped the
    # reset of the repositories the command made, whose fsmonitor the host's git then ran,
    # and failed every later call in the workspace (a red team's).
    marker = tmp_path / "ran"
    ex = make_executor(mode="workspace-write")
    chain = (
        "mkdir -p c && ln -s ../c/l0 c/end && "
        "for i in $(seq 0 1499); do ln -s l$((i+1)) c/l$i; done"
    )
    plant = (
        f"git init -q evil && git -C evil config core.fsmonitor 'touch {marker}; false' && "
        f"{chain} && ln -s ../c/l0 c/l1500 && mkdir y && ln -s ../c/l0 y/.git"
    )
    made = await _run(ex, plant, workspace)
    assert made.exit_code == 0, made.stderr.text
    config = (workspace / "evil" / ".git" / "config").read_text()
    assert "fsmonitor" not in config, config
    host_git("status", cwd=workspace / "evil", check=False)
    assert not marker.exists()
    nxt = await _run(ex, "echo next", workspace)
    assert nxt.stdout.text == "next\n", nxt.stderr.text


def _user_gitconfig(monkeypatch: pytest.MonkeyPatch, home: Path, text: str) -> None:
    """The harness's user: ``home`` with ``text`` as its `~/.gitconfig`, git's other places
    for a global config out of the way."""
    (home / ".gitconfig").write_text(text)
    monkeypatch.setenv("HOME", str(home))
    for name in ("GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("layout", ["home workspace, missing", "project, existing"])
async def test_an_include_of_the_hosts_own_git_config_stays_read_only_without_a_repository(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    layout: str,
) -> None:
    # `~/.gitconfig` includes `~/.gitconfig.local` (dotfiles) or a team file kept in a
    # project: with no repository in the roots, only the repositories' own configs were
    # read, so the include stayed writable and host git elsewhere ran what the command
    # put there (red team).
    marker = tmp_path / "pwned"
    if layout.startswith("home"):
        home, target, named = workspace, workspace / ".gitconfig.local", "~/.gitconfig.local"
    else:
        home, target = tmp_path / "home", workspace / "team.gitconfig"
        home.mkdir()
        target.write_text("[user]\n\tname = team\n")
        named = str(target)
    _user_gitconfig(monkeypatch, home, f"[include]\n\tpath = {named}\n")
    before = target.read_bytes() if target.exists() else None
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex, f"printf '[core]\\n\\tfsmonitor = touch {marker}\\n' >> {target}", workspace
    )
    assert result.exit_code != 0 and result.sandbox is not None
    assert [d.target for d in result.sandbox.denials] == [str(target)]
    assert "an include" in (result.sandbox.denials[0].reason or "")
    assert (target.read_bytes() if target.exists() else None) == before
    elsewhere = tmp_path / "elsewhere"
    _repo(elsewhere)
    user_env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    subprocess.run(
        ["git", "status"], cwd=elsewhere, env=user_env, capture_output=True, timeout=30, check=False
    )
    assert not marker.exists()


@pytest.mark.parametrize(
    ("setting", "planted", "trigger"),
    [
        ("core.fsmonitor = {ws}/tools/fsmon.sh", "tools/fsmon.sh", ("status",)),
        ("alias.lg = !{ws}/tools/lg.sh --oneline", "tools/lg.sh", ("lg",)),
        ("init.templateDir = {ws}/tmpl", "tmpl/hooks/post-checkout", ("checkout", "-q", "-b", "x")),
        ('alias.pr = "!f() {{ {ws}/tools/pr.sh; }}; f"', "tools/pr.sh", ("pr",)),
        ("credential.helper = {ws}/tools/cred.sh", "tools/cred.sh", ("credential", "fill")),
        (
            "trailer.sig.cmd = {ws}/tools/t.sh",
            "tools/t.sh",
            ("interpret-trailers", "--trailer", "sig"),
        ),
        ("diff.external = sh {ws}/tools/d.sh", "tools/d.sh", ("diff", "HEAD~0", "--ext-diff")),
        ('alias.q = "!\\"${{PROJ}}/tools/q.sh\\""', "tools/q.sh", ("q",)),
        ("alias.s = \"!'{ws}/my tools/s.sh'\"", "my tools/s.sh", ("s",)),
        ("alias.c = !{ws}/\\\ntools/c.sh", "tools/c.sh", ("c",)),
    ],
)
async def test_a_program_the_hosts_git_config_names_in_a_root_stays_read_only(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    setting: str,
    planted: str,
    trigger: tuple[str, ...],
) -> None:
    # The user's `~/.gitconfig` names a script kept in a project (an fsmonitor, an alias,
    # the template directory `git init` copies hooks from): a command that rewrites it runs
    # in the host's next git anywhere.
    marker = tmp_path / "pwned"
    home = tmp_path / "home"
    home.mkdir()
    key, _, value = setting.format(ws=workspace).partition(" = ")
    section, _, name = key.rpartition(".")
    head = section.replace(".", ' "', 1) + '"' if "." in section else section
    _user_gitconfig(
        monkeypatch, home, f"[user]\n\tname = t\n\temail = t@e\n[{head}]\n\t{name} = {value}\n"
    )
    monkeypatch.setenv("PROJ", str(workspace))  # a variable the user's shell sets too
    target = workspace / planted
    target.parent.mkdir(parents=True)
    target.write_text("#!/bin/sh\nexit 0\n")
    target.chmod(0o755)
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex, f"printf '#!/bin/sh\\ntouch {marker}\\n' > '{target}'; echo ok > other.txt", workspace
    )
    assert result.sandbox is not None
    assert [d.target for d in result.sandbox.denials] == [str(target)]
    assert "git config: " in (result.sandbox.denials[0].reason or "")
    assert target.read_text() == "#!/bin/sh\nexit 0\n"
    assert (workspace / "other.txt").read_text() == "ok\n"  # the rest of the root is writable
    user_env = {"HOME": str(home), "PATH": os.environ["PATH"], "PROJ": str(workspace)}
    elsewhere = tmp_path / "elsewhere"
    subprocess.run(["git", "init", "-q", str(elsewhere)], env=user_env, check=True, timeout=30)
    subprocess.run(
        ["git", "commit", "-q", "--allow-empty", "-m", "a"],
        cwd=elsewhere, env=user_env, capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    subprocess.run(
        ["git", *trigger], cwd=elsewhere, env=user_env, capture_output=True, timeout=30, check=False
    )
    assert not marker.exists()


def test_the_program_scan_reads_a_shell_line_as_the_shell_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bash_sandbox.git_plane import _programs

    monkeypatch.setenv("PROJ", "/p")
    monkeypatch.delenv("UNSET_VARIABLE", raising=False)
    cases = {
        ("submodule.lib.update", "!/p/up.sh --x"): ["/p/up.sh"],
        ("submodule.lib.update", "rebase"): [],  # an update mode, not a command
        ("alias.f", '!f() { "$PROJ/my x.sh" "$@"; }; f'): ["/p/my x.sh"],
        ("core.pager", "PAGER_ARGS=/p/args less -R"): ["/p/args"],
        ("credential.helper", "/p/cred --store"): ["/p/cred"],
        ("credential.helper", "store --file /p/.creds"): [],  # a helper's data, not a program
        ("credential.helper", "!/p/cred.sh get"): ["/p/cred.sh"],
        ("credential.helper", "/bin/sh /p/cred.sh"): ["/bin/sh", "/p/cred.sh"],
        ("diff.bin.textconv", "sh ./conv.sh"): ["/w/conv.sh"],
        ("core.editor", "vim"): [],
        ("alias.lg", "log --oneline"): [],
        ("user.name", "/p/not-a-program"): [],
        # Inside `sh -c '...'`, after a `cd`, in substitutions, through the line's variables.
        ("alias.fmt", "!sh -c 'scripts/fmt.sh \"$@\"' -"): ["/w/scripts/fmt.sh"],
        ("core.fsmonitor", 'bash -c "cd /p && ./tools/x.sh"'): ["/p/tools/x.sh"],
        ("alias.t", "!cd tools && ./x.sh"): ["/w/tools/x.sh"],
        ("alias.b", "!`echo /p/b.sh`"): ["/p/b.sh"],
        ("alias.d", "!D=/p; $D/y.sh"): ["/p/y.sh"],  # `/p` is a value, not a file
        ("alias.r", '!"$(git rev-parse --show-toplevel)/x.sh"'): ["/w/x.sh"],
        ("alias.g", "!$GIT_DIR/../x.sh"): ["/w/x.sh"],
        # Not paths: a ref range, a URL, an option (a placeholder `origin` would have been
        # held in every repository).
        ("alias.ahead", "!git log origin/main..HEAD"): [],
        ("alias.web", "!xdg-open https://example.com/repo"): [],
        ("credential.helper", "/p/cred --file=/p/store"): ["/p/cred", "/p/store"],
        ("alias.opt", "!tool --verbose ./run"): ["/w/run"],
    }
    for (key, value), paths in cases.items():
        found, unresolved = _programs(key, value, "/w", "/w/.git")
        assert found == list(dict.fromkeys(paths)), (key, value, found)
        assert unresolved == [], (key, value, unresolved)
    # What no reading resolves is named, for the run to say it is partial.
    assert _programs("core.pager", "$UNSET_VARIABLE/x", "/w") == ([], ["$UNSET_VARIABLE/x"])


@pytest.mark.parametrize("through", ["the global config", "an includeIf on the path"])
async def test_a_repository_the_command_makes_runs_no_hook_of_a_relative_global_hooks_path(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    through: str,
) -> None:
    # `core.hooksPath = .githooks` in ~/.gitconfig is relative to each repository's worktree:
    # host git in a repository the command made ran the command's `.githooks/pre-commit`
    # (red team). Such a repository comes back with its own (emptied) hooks directory pinned.
    marker = tmp_path / "pwned"
    home = tmp_path / "home"
    home.mkdir()
    hooks = "[core]\n\thooksPath = .githooks\n"
    if through == "the global config":
        _user_gitconfig(monkeypatch, home, "[user]\n\tname = t\n\temail = t@e\n" + hooks)
    else:  # only for repositories below the workspace: asked as git reads it for each
        (home / ".gitconfig-work").write_text(hooks)
        _user_gitconfig(
            monkeypatch,
            home,
            f'[user]\n\tname = t\n\temail = t@e\n[includeIf "gitdir:{workspace}/"]\n'
            "\tpath = ~/.gitconfig-work\n",
        )
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        "git init -q vendor/lib && mkdir vendor/lib/.githooks"
        f" && printf '#!/bin/sh\\ntouch {marker}\\n' > vendor/lib/.githooks/pre-commit"
        " && chmod +x vendor/lib/.githooks/pre-commit",
        workspace,
    )
    assert result.exit_code == 0, result.stderr.text
    lib = workspace / "vendor" / "lib"
    user_env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    (lib / "a").write_text("a\n")
    subprocess.run(["git", "add", "a"], cwd=lib, env=user_env, check=True, timeout=30)
    subprocess.run(
        ["git", "commit", "-qm", "a"], cwd=lib, env=user_env, capture_output=True, timeout=30,
        check=False,
    )  # fmt: skip
    assert not marker.exists()
    assert (lib / ".githooks" / "pre-commit").exists()  # the command's file itself stays


async def test_an_alias_naming_refs_holds_no_placeholder_in_a_repository(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `!git log origin/main..HEAD` names a ref range, not a file: held as a path, it put a
    # placeholder `origin` in every repository the user's config reaches.
    home = tmp_path / "home"
    home.mkdir()
    _user_gitconfig(
        monkeypatch,
        home,
        "[alias]\n\tahead = !git log origin/main..HEAD\n\tweb = !xdg-open https://x.test/r\n",
    )
    _repo(workspace)
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, "ls -A", workspace)
    assert result.exit_code == 0 and result.sandbox is not None
    listed = set(result.stdout.text.split())
    assert not listed & {"origin", "https:", "origin/main..HEAD"}, listed
    assert result.sandbox.enforcement == "full"


@pytest.mark.parametrize("layout", ["linked-worktree", "separate-git-dir"])
async def test_the_workspace_checkouts_gitfile_holds_while_a_command_runs(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, layout: str
) -> None:
    # The workspace a linked worktree (parallel agent sessions) or a `--separate-git-dir`
    # checkout: a background command re-pointed its `.git` file at a repository of its own
    # with `core.fsmonitor`; the host's `git status` there ran it while the command ran,
    # and a commit the user made meanwhile went to that repository and was lost when the
    # file was put back (a red team's).
    marker = tmp_path / "pwned"
    if layout == "linked-worktree":
        _repo(tmp_path / "main")
        host_git("worktree", "add", "-q", "-b", "wt", str(workspace), cwd=tmp_path / "main")
    else:
        host_git("init", "-q", f"--separate-git-dir={tmp_path / 'store.git'}", cwd=workspace)
        (workspace / "a.txt").write_text("a\n")
        host_git("add", "a.txt", cwd=workspace)
        host_git("commit", "-qm", "first", cwd=workspace)
    gitfile = workspace / ".git"
    before = gitfile.read_bytes()
    ready, go = workspace / "ready", workspace / "go"
    plant = (
        "git init -q --bare evil.git && git -C evil.git config core.bare false"
        " && git -C evil.git config core.worktree .."
        f" && git -C evil.git config core.fsmonitor 'touch {marker}; echo'; "
        "printf 'gitdir: evil.git\\n' > .git; mv .git moved; rm -f .git; ln -sfn evil.git .git; "
        f"touch {ready}; for i in $(seq 600); do [ -e go ] && break; sleep 0.05; done"
    )
    ex = make_executor(mode="workspace-write")
    proc = await ex.start(
        ex.resolve(BashExecRequest(command=plant, workdir=str(workspace), env=dict(_ENV)))
    )
    try:
        for _ in range(600):
            if ready.exists():
                break
            await asyncio.sleep(0.05)
        assert ready.exists(), "the command never got past its attempts"
        assert gitfile.read_bytes() == before
        # The user works in the checkout meanwhile: an editor's poll, a commit.
        host_git("status", "--short", cwd=workspace)
        (workspace / "work.txt").write_text("important\n")
        host_git("add", "work.txt", cwd=workspace)
        host_git("commit", "-qm", "user work", cwd=workspace)
        go.touch()
        await asyncio.wait_for(proc.wait(), 60)
    finally:
        proc.kill()
        await asyncio.wait_for(proc.wait(), 20)
    assert proc.sandbox is not None
    assert REASON_GITFILE in [d.reason for d in proc.sandbox.denials], proc.sandbox
    assert gitfile.read_bytes() == before
    host_git("status", "--short", cwd=workspace)
    assert not marker.exists()
    logged = host_git("log", "--format=%s", cwd=workspace).stdout.split("\n")
    assert logged[0] == "user work", logged


async def test_a_removed_worktrees_gitfile_written_back_resets_no_repository_outside(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A linked worktree in the workspace of a repository kept outside the roots: a command
    # removed the checkout, the next wrote its `.git` file back, and the copy-back took the
    # outside repository for one the command created and reset it: its hook and config,
    # another worktree's registration, its alternates and rebase state (a red team's).
    main = tmp_path / "main"
    _repo(main)
    host_git("config", "alias.hello", "!echo hello", cwd=main)
    hook = main / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    other = tmp_path / "other"
    host_git("worktree", "add", "-q", "-b", "other", str(other), cwd=main)
    host_git("worktree", "add", "-q", "-b", "feature", str(workspace / "feature"), cwd=main)
    config = (main / ".git" / "config").read_bytes()
    ex = make_executor(mode="workspace-write")
    removed = await _run(ex, "rm -rf feature", workspace)
    assert removed.exit_code == 0, removed.stderr.text
    admin = main / ".git" / "worktrees" / "feature"
    back = await _run(
        ex, f"mkdir -p feature && printf 'gitdir: {admin}\\n' > feature/.git", workspace
    )
    assert back.exit_code == 0 and back.sandbox is not None, back.stderr.text
    assert any("leading out of the writable roots" in w for w in back.sandbox.warnings)
    assert not (workspace / "feature" / ".git").exists()
    # From the host: the outside repository is as the user left it.
    assert (main / ".git" / "config").read_bytes() == config
    assert hook.exists()
    assert (main / ".git" / "worktrees" / "other" / "gitdir").exists()
    host_git("status", "--short", cwd=other)
    fsck = host_git("fsck", "--no-dangling", cwd=main)
    assert fsck.returncode == 0


async def test_the_hooks_path_and_includes_of_the_repository_a_workspace_lies_in_hold(
    make_executor: ExecutorFactory, tmp_path: Path
) -> None:
    # The workspace a monorepo's package (`repo/frontend`): the repository's own config
    # names `frontend/.husky/_` as its hooks path (husky's setup below the git root) and
    # includes `../frontend/team.gitconfig`; the search looked only at and below the roots,
    # so both stayed writable and host git ran what a command put there (a red team's).
    marker = tmp_path / "pwned"
    repo = tmp_path / "repo"
    _repo(repo)
    package = repo / "frontend"
    (package / ".husky" / "_").mkdir(parents=True)
    (package / "team.gitconfig").write_text("[user]\n\tname = t\n")
    host_git("config", "core.hooksPath", "frontend/.husky/_", cwd=repo)
    host_git("config", "include.path", "../frontend/team.gitconfig", cwd=repo)
    ex = make_executor(mode="workspace-write", workspace_root=str(package))
    attack = (
        f"printf '#!/bin/sh\\ntouch {marker}\\n' > .husky/_/pre-commit; "
        "chmod +x .husky/_/pre-commit; "
        f"printf '[core]\\n\\tfsmonitor = touch {marker}; echo\\n' >> team.gitconfig; echo ok > a"
    )
    result = await _run(ex, attack, package)
    assert result.sandbox is not None and (package / "a").exists()
    targets = {d.target for d in result.sandbox.denials}
    assert str(package / "team.gitconfig") in targets, result.sandbox.denials
    assert not (package / ".husky" / "_" / "pre-commit").exists()
    host_git("status", "--short", cwd=repo)
    host_git("add", "frontend/a", cwd=repo)
    host_git("commit", "-qm", "host", cwd=repo)
    assert not marker.exists()


async def test_a_worktree_the_host_adds_into_the_workspace_meanwhile_stays_whole(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A new `.git` file naming a git dir outside the roots is removed after the command (a
    # command writing back a removed worktree's); one the user's `git worktree add` made
    # while a background command ran was cut off with it (a red team's).
    main = tmp_path / "main"
    _repo(main)
    ex = make_executor(mode="workspace-write")
    ready, go = workspace / "ready", workspace / "go"
    proc = await ex.start(
        ex.resolve(
            BashExecRequest(
                command="touch ready; for i in $(seq 600); do [ -e go ] && break; sleep 0.05; done",
                workdir=str(workspace),
                env=dict(_ENV),
            )
        )
    )
    try:
        for _ in range(600):
            if ready.exists():
                break
            await asyncio.sleep(0.05)
        host_git("worktree", "add", "-q", "-b", "feature", str(workspace / "feature"), cwd=main)
        go.touch()
        await asyncio.wait_for(proc.wait(), 60)
    finally:
        proc.kill()
        await asyncio.wait_for(proc.wait(), 20)
    assert (workspace / "feature" / ".git").is_file()
    assert host_git("rev-parse", "--abbrev-ref", "HEAD", cwd=workspace / "feature").stdout == (
        "feature\n"
    )
    assert "prunable" not in host_git("worktree", "list", cwd=main).stdout


@pytest.mark.parametrize(
    "layout", ["linked worktree", "separate git dir", "submodule of a superproject"]
)
async def test_a_relative_hooks_path_resolves_against_the_checkout_whatever_its_git_dir(
    make_executor: ExecutorFactory, tmp_path: Path, layout: str
) -> None:
    # A relative `core.hooksPath` is relative to the worktree's top: it was resolved against
    # the git dir's parent (`.git/worktrees`, `.git/modules`), and a superproject's shared
    # hooks kept in a submodule were never read (round 14).
    marker = tmp_path / "pwned"
    if layout == "linked worktree":
        _repo(tmp_path / "main")
        checkout = tmp_path / "wt"
        host_git("worktree", "add", "-q", "-b", "wt", str(checkout), cwd=tmp_path / "main")
        config_in, hooks_rel = checkout, "hooks"
    elif layout == "separate git dir":
        checkout = tmp_path / "sep"
        checkout.mkdir()
        host_git("init", "-q", f"--separate-git-dir={tmp_path / 'store.git'}", cwd=checkout)
        config_in, hooks_rel = checkout, "hooks"
    else:
        super_ = tmp_path / "super"
        _repo(super_)
        checkout = super_ / "tools"  # a plain directory of the superproject here
        checkout.mkdir()
        config_in, hooks_rel = super_, "tools/hooks"
    (checkout / "hooks").mkdir()
    host_git("config", "core.hooksPath", hooks_rel, cwd=config_in)
    ex = make_executor(mode="workspace-write", workspace_root=str(checkout))
    plant = f"printf '#!/bin/sh\\ntouch {marker}\\n' > hooks/pre-commit; chmod +x hooks/pre-commit"
    result = await _run(ex, plant + "; echo ok > a", checkout)
    assert result.sandbox is not None and (checkout / "a").exists(), result.stderr.text
    assert not (checkout / "hooks" / "pre-commit").exists()
    host_git("add", "-A", cwd=config_in)
    host_git("commit", "-qm", "host", cwd=config_in, check=False)
    assert not marker.exists()


async def test_a_gitfile_into_the_commands_cache_home_is_never_taken_for_the_hosts(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A git dir born outside the roots during the command is the host's (a worktree the
    # user added meanwhile), but the command writes its tool cache home too: a repository it
    # made there, named by a new `.git` file pointing back, was kept, and the host's `git
    # status` ran its fsmonitor (round 14).
    marker = tmp_path / "pwned"
    ex = make_executor(mode="workspace-write")
    plant = (
        'evil="$XDG_CACHE_HOME/evil" && git init -q "$evil"'
        f" && git -C \"$evil\" config core.fsmonitor 'touch {marker}; echo'"
        ' && mkdir -p docs && printf "gitdir: %s/.git\\n" "$evil" > docs/.git'
        ' && printf "%s\\n" "$PWD/docs/.git" > "$evil/.git/gitdir"; echo done'
    )
    result = await _run(ex, plant, workspace)
    assert result.stdout.text.strip().endswith("done"), result.stderr.text
    assert not (workspace / "docs" / ".git").exists()
    host_git("status", "--short", cwd=workspace / "docs", check=False)
    assert not marker.exists()
