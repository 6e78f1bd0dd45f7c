"""A writable root that holds a home's own environment (`policies.autorun.HOME_PATHS`).

A workspace that is the user's home, or a root `~/.config`, let a command plant what the
host runs or obeys later: bash-sandbox's own config (the next call, in another project, ran
unconfined), `~/.gitconfig` (host git ran its fsmonitor in every repository), a `.pth` in
user site-packages, direnv's allow records. Each attack is tried for real; the host is
then judged from outside: the file is absent, and the host tool that would run it ran
nothing. Ordinary work in the home keeps working.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest, BashRunResult
from policies.autorun import home_paths
from tests.sandbox.conftest import ExecutorFactory


async def _run(ex: SandboxBashExecutor, command: str, workdir: Path) -> BashRunResult:
    return await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workdir))))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of this test's own, with a little of a real one in it."""
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    (home / "proj").mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def _reasons(result: BashRunResult) -> list[str]:
    assert result.sandbox is not None
    return [d.reason for d in result.sandbox.denials]


async def test_a_home_workspace_cannot_plant_the_homes_environment(
    make_executor: ExecutorFactory, home: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    ex = make_executor(mode="workspace-write", workspace_root=str(home))
    attacks = {
        ".config/bash-sandbox/config.toml": "mkdir -p .config/bash-sandbox && "
        "echo 'mode = \"danger-full-access\"' > .config/bash-sandbox/config.toml",
        ".gitconfig": f"printf '[core]\\n\\tfsmonitor = \"touch {marker}; false\"\\n' > .gitconfig",
        ".config/git/config": f"mkdir -p .config/git && printf '[core]\\n\\tfsmonitor = "
        f'"touch {marker}; false"\\n\' > .config/git/config',
        ".local/lib/python3.11/site-packages/zz.pth": "mkdir -p "
        f".local/lib/python3.11/site-packages && echo 'import os; os.mknod(\"{marker}\")' > "
        ".local/lib/python3.11/site-packages/zz.pth",
        ".local/share/direnv/allow/x": "mkdir -p .local/share/direnv/allow && echo x > "
        ".local/share/direnv/allow/x",
        ".local/bin/git": "mkdir -p .local/bin && printf '#!/bin/sh\\n' > .local/bin/git",
        ".bash_aliases": "echo 'alias ls=evil' > .bash_aliases",
    }
    for planted, command in attacks.items():
        result = await _run(ex, command, home)
        assert result.exit_code != 0, (planted, result.stdout.text)
        assert not (home / planted).exists(), planted
        assert any("the home's" in r and "unprotected_paths" in r for r in _reasons(result)), (
            planted,
            _reasons(result),
        )
    # Ordinary work in the home: a new project, a file in an existing one.
    work = await _run(ex, "mkdir -p newproj && echo hi > newproj/a && echo x > proj/b", home)
    assert work.exit_code == 0, work.stderr.text
    assert (home / "newproj" / "a").read_text() == "hi\n"
    assert (home / "proj" / "b").read_text() == "x\n"
    await ex.aclose()
    # The host: its git in another repository runs nothing; none of the names was left.
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "-C", str(repo), "status"], env=env, capture_output=True, check=True)
    assert not marker.exists()
    for planted in attacks:
        assert not os.path.lexists(home / planted.split("/")[0]) or planted.startswith(".config"), (
            planted
        )
    assert sorted(os.listdir(home / ".config")) == []


async def test_a_root_inside_the_home_keeps_the_specific_names(
    make_executor: ExecutorFactory, home: Path, workspace: Path
) -> None:
    config = home / ".config"
    ex = make_executor(mode="workspace-write", writable_roots=(str(config),))
    result = await _run(
        ex,
        f"mkdir -p {config}/git && echo '[core]' > {config}/git/config; "
        f"mkdir -p {config}/bash-sandbox && echo x > {config}/bash-sandbox/config.toml; "
        f"mkdir -p {config}/nvim && echo 'set nu' > {config}/nvim/init.vim",
        workspace,
    )
    assert not (config / "git" / "config").exists()
    assert not (config / "bash-sandbox" / "config.toml").exists()
    # The root's own purpose stays: another program's settings there are writable.
    assert (config / "nvim" / "init.vim").read_text() == "set nu\n"
    assert any("the home's ~/.config/git" in r for r in _reasons(result)), _reasons(result)


def test_the_next_call_in_another_project_obeys_no_planted_config(
    backend: str, home: Path, tmp_path: Path
) -> None:
    # The CLI end to end: the first call's workspace is the home; the second call, in a
    # project, reads the user's config (had the first planted one, it would run unconfined).
    import sys

    cli = [sys.executable, "-m", "bash_sandbox.cli"]
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    first = subprocess.run(
        [*cli, "run", "--mode", "workspace-write", "--workspace", str(home),
         "--backend", backend, "--", "mkdir -p .config/bash-sandbox && echo "
         "'mode = \"danger-full-access\"' > .config/bash-sandbox/config.toml"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert first.returncode != 0 and "the home's ~/.config" in first.stdout + first.stderr, (
        first.stdout + first.stderr
    )
    marker = tmp_path / "outside"
    second = subprocess.run(
        [*cli, "run", "--workspace", str(home / "proj"), "--backend",
         backend, "--", f"echo ran; touch {marker}"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert second.stdout.startswith("ran"), second.stderr  # it ran, confined as asked
    assert not marker.exists(), second.stdout + second.stderr
    assert not (home / ".config" / "bash-sandbox").exists()


def test_home_paths_only_where_a_root_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = str(tmp_path / "h")
    monkeypatch.setenv("HOME", home)
    found = dict(home_paths((home,)))
    assert f"{home}/.config" in found and f"{home}/.gitconfig" in found
    # Covered with `.config`: the specific names below it are not repeated.
    assert f"{home}/.config/git" not in found
    assert dict(home_paths((f"{home}/.config",))).keys() >= {f"{home}/.config/git"}
    assert home_paths((f"{home}/proj",)) == []
    assert f"{home}/.gitconfig" not in dict(home_paths((home,), (".gitconfig",)))


async def test_a_home_name_that_links_into_a_root_is_protected_there(
    make_executor: ExecutorFactory, home: Path, tmp_path: Path
) -> None:
    # A dotfiles manager's layout (GNU stow): `~/.bash_aliases` and `~/.gitconfig` link into
    # `~/dotfiles`, the workspace. The user's next shell and host git read what lies there.
    dotfiles = home / "dotfiles"
    (dotfiles / "bash").mkdir(parents=True)
    (dotfiles / "git").mkdir()
    (dotfiles / "bash" / ".bash_aliases").write_text("alias ll='ls -l'\n")
    (home / ".bash_aliases").symlink_to("dotfiles/bash/.bash_aliases")
    (home / ".gitconfig").symlink_to("dotfiles/git/.gitconfig")  # dangling: made later
    marker = tmp_path / "ran"
    ex = make_executor(mode="workspace-write", workspace_root=str(dotfiles))
    result = await _run(
        ex,
        f"echo 'touch {marker}' >> bash/.bash_aliases; "
        f"printf '[core]\\n\\tfsmonitor = \"touch {marker}; false\"\\n' > git/.gitconfig; "
        "echo fine > notes.txt",
        dotfiles,
    )
    assert (dotfiles / "notes.txt").read_text() == "fine\n"  # the rest of the repo is work
    assert (dotfiles / "bash" / ".bash_aliases").read_text() == "alias ll='ls -l'\n"
    assert not (dotfiles / "git" / ".gitconfig").exists()
    assert any("~/.bash_aliases links here" in r for r in _reasons(result)), _reasons(result)
    await ex.aclose()
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "-C", str(repo), "status"], env=env, capture_output=True, check=False)
    subprocess.run(["bash", "-c", ". ~/.bash_aliases"], env=env, capture_output=True, check=False)
    assert not marker.exists()


async def test_xdg_config_home_elsewhere_and_more_rc_files_are_the_homes_too(
    make_executor: ExecutorFactory, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `XDG_CONFIG_HOME=~/.dotfiles/config` held bash-sandbox's own config and git's outside
    # `~/.config`; `~/.direnvrc` (sourced before every .envrc) and `~/.tmux.conf` were
    # creatable in a home workspace (a red team's).
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".dotfiles" / "config"))
    (home / ".dotfiles" / "config").mkdir(parents=True)
    ex = make_executor(mode="workspace-write", workspace_root=str(home))
    planted = {
        ".dotfiles/config/bash-sandbox/config.toml": "mkdir -p .dotfiles/config/bash-sandbox"
        " && echo 'mode = \"danger-full-access\"' > .dotfiles/config/bash-sandbox/config.toml",
        ".dotfiles/config/git/config": "mkdir -p .dotfiles/config/git && echo '[core]' > "
        ".dotfiles/config/git/config",
        ".direnvrc": "echo 'touch x' > .direnvrc",
        ".tmux.conf": "echo 'run-shell x' > .tmux.conf",
        ".ipython/profile_default/startup/x.py": "mkdir -p .ipython/profile_default/startup "
        "&& echo 'import os' > .ipython/profile_default/startup/x.py",
    }
    for name, command in planted.items():
        result = await _run(ex, command, home)
        assert result.exit_code != 0, name
        assert not (home / name).exists() or (home / name).stat().st_size == 0, name
    await ex.aclose()
    for name in planted:
        assert not (home / name).exists(), name


async def test_a_home_workspace_cannot_plant_what_more_host_tools_run(
    make_executor: ExecutorFactory, home: Path, tmp_path: Path
) -> None:
    # A red team's: `~/.exrc` (vim's fallback), `~/.mavenrc` (mvn sources it), and whole
    # directories a host tool reads whether or not they existed (`~/.ssh`, `~/.gnupg`,
    # `~/.cargo`: cargo reads ~/.cargo/config.toml), made in one rename with their content.
    marker = tmp_path / "ran"
    ex = make_executor(mode="workspace-write", workspace_root=str(home))
    names = (".exrc", ".gvimrc", ".emacs.el", ".mavenrc", ".lldbinit", ".screenrc", ".irbrc",
             ".ghci", ".terraformrc",
             # round 4: bash-completion, perl -d, the X session, yarn's yarn-path
             ".bash_completion", ".perldb", ".xsessionrc", ".xprofile", ".yarnrc",
             ".pydistutils.cfg", ".pryrc", ".muttrc")  # fmt: skip
    files = " ".join(f"echo '!touch {marker}' > {n};" for n in names)
    dirs = (".ssh", ".gnupg", ".cargo", ".bashrc.d", ".m2", "go", ".terraform.d", ".mozilla",
            ".pki", ".emacs.d", ".julia")  # fmt: skip
    moves = " ".join(
        f"mkdir -p st/config && echo 'touch {marker}' > st/config/x && mv -T st {d};" for d in dirs
    )
    result = await _run(ex, f"{files} {moves} mkdir -p p && echo fine > p/a", home)
    assert (home / "p" / "a").read_text() == "fine\n"
    reasons = _reasons(result)
    assert any("~/.exrc: vim" in r for r in reasons), reasons
    # The sandbox's cargo keeps its own home while `~/.cargo` is only a placeholder (another
    # command of the executor holds it).
    holder = await ex.start(ex.resolve(BashExecRequest(command="sleep 30", workdir=str(home))))
    for _ in range(500):
        if (home / ".cargo").is_dir():
            break
        await asyncio.sleep(0.01)
    cargo = await _run(ex, 'mkdir -p "$CARGO_HOME/registry" && echo "$CARGO_HOME"', home)
    holder.kill()
    await asyncio.wait_for(holder.wait(), 20)
    assert cargo.sandbox is not None
    assert cargo.exit_code == 0 and ".cargo" not in cargo.stdout.text, cargo.sandbox.warnings
    await ex.aclose()
    for name in (*names, *dirs):
        assert not os.path.lexists(home / name), name
    assert not marker.exists()


async def test_a_home_name_behind_a_linked_directory_is_protected_at_its_target(
    make_executor: ExecutorFactory, home: Path, tmp_path: Path
) -> None:
    # GNU stow folds a tree into one link (`~/.ssh -> dotfiles/ssh`,
    # `~/.config/nvim -> ../dotfiles/nvim`); the workspace is `~/dotfiles`. Only a link at
    # the name itself was followed: the key was read, ssh's config and nvim's init written.
    dotfiles = home / "dotfiles"
    (dotfiles / "ssh").mkdir(parents=True)
    (dotfiles / "nvim").mkdir()
    (dotfiles / "ssh" / "config").write_text("Host *\n")
    (dotfiles / "ssh" / "id_ed25519").write_text("PRIVATE-KEY-CANARY\n")
    (dotfiles / "nvim" / "init.lua").write_text("-- mine\n")
    (home / ".ssh").symlink_to("dotfiles/ssh")
    (home / ".config" / "nvim").symlink_to("../dotfiles/nvim")
    marker = tmp_path / "ran"
    ex = make_executor(mode="workspace-write", workspace_root=str(dotfiles))
    result = await _run(
        ex,
        f"cat ssh/id_ed25519; printf '  ProxyCommand sh -c \"touch {marker}\"\\n' >> ssh/config; "
        f"echo 'os.execute(\"touch {marker}\")' >> nvim/init.lua; echo fine > notes",
        dotfiles,
    )
    assert "CANARY" not in result.stdout.text
    assert (dotfiles / "notes").read_text() == "fine\n"
    assert any("~/.config/nvim/init.lua links here" in r for r in _reasons(result)), _reasons(
        result
    )
    await ex.aclose()
    assert (dotfiles / "ssh" / "config").read_text() == "Host *\n"
    assert (dotfiles / "nvim" / "init.lua").read_text() == "-- mine\n"
    found = dict(home_paths((str(dotfiles),)))
    assert str(dotfiles / "ssh") in found and str(dotfiles / "nvim" / "init.lua") in found


async def test_a_link_in_the_root_a_home_name_leads_through_is_put_back(
    make_executor: ExecutorFactory, home: Path, tmp_path: Path
) -> None:
    # `~/.ssh -> dotfiles/ssh`, and `dotfiles/ssh -> ssh-real` a link inside the workspace:
    # no mount can hold a link, so a command re-pointed it (`mv -T ssh.new ssh`) at a
    # directory of its own, and host ssh ran its `Match exec` (red team round 4). The run
    # says `partial`, and the link is put back as it was after the command.
    dotfiles = home / "dotfiles"
    (dotfiles / "ssh-real").mkdir(parents=True)
    (dotfiles / "ssh-real" / "config").write_text("Host x\n")
    (dotfiles / "ssh").symlink_to("ssh-real")
    (home / ".ssh").symlink_to("dotfiles/ssh")
    marker = tmp_path / "ran"
    ex = make_executor(mode="workspace-write", workspace_root=str(dotfiles))
    result = await _run(
        ex,
        f"mkdir evil && printf 'Match exec \"touch {marker}\"\\n' > evil/config"
        " && ln -sfn evil ssh.new && mv -T ssh.new ssh",
        dotfiles,
    )
    assert result.sandbox is not None
    assert result.sandbox.enforcement == "partial"
    assert os.readlink(dotfiles / "ssh") == "ssh-real"  # put back
    assert (home / ".ssh" / "config").read_text() == "Host x\n"  # what host ssh reads
    assert any("put back the link" in w for w in result.sandbox.warnings)
    assert not marker.exists()


def test_a_directory_left_where_the_link_was_is_moved_aside_not_followed(tmp_path: Path) -> None:
    # `rm ssh && mkdir ssh` (the cover watch usually stops the command in between).
    from bash_sandbox.link_restore import put_back

    (tmp_path / "ssh-real").mkdir()
    (tmp_path / "ssh").mkdir()
    (tmp_path / "ssh" / "config").write_text("Match exec x\n")
    done = put_back(str(tmp_path), str(tmp_path / "ssh"), "ssh-real")
    assert done is not None and "put back" in done
    assert os.readlink(tmp_path / "ssh") == "ssh-real"
    [aside] = tmp_path.glob("ssh.bash-sandbox-*")
    assert (aside / "config").read_text() == "Match exec x\n"  # kept, the user's to look at
    assert put_back(str(tmp_path), str(tmp_path / "ssh"), "ssh-real") is None  # as it was


async def test_the_accounts_own_home_is_followed_where_home_says_otherwise(
    make_executor: ExecutorFactory, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A harness's temporary HOME: the account's home (its passwd entry, what ssh and sshd
    # read) holds `~/.ssh -> dotfiles/ssh` into the workspace, and was not followed.
    from policies import autorun

    dotfiles = home / "dotfiles"
    (dotfiles / "ssh").mkdir(parents=True)
    (dotfiles / "ssh" / "config").write_text("Host x\n")
    (home / ".ssh").symlink_to("dotfiles/ssh")
    monkeypatch.setattr(autorun, "_account_home", lambda: (str(home),))
    monkeypatch.setattr(autorun, "_KEPT", {})
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    ex = make_executor(mode="workspace-write", workspace_root=str(dotfiles))
    result = await _run(ex, "echo 'Match exec x' >> ssh/config; echo '' > ssh/rc", dotfiles)
    assert result.sandbox is not None
    assert (dotfiles / "ssh" / "config").read_text() == "Host x\n"
    assert not (dotfiles / "ssh" / "rc").exists()
    assert any("~/.ssh" in r or ".ssh links here" in r for r in _reasons(result)), _reasons(result)


_EXCHANGE = (
    "python3 -c 'import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True);"
    ' sys.exit(libc.renameat2(-100, b"a", -100, b"a.new", 2) and'
    " os.strerror(ctypes.get_errno()))'"
)


async def test_a_directory_on_the_way_to_a_link_cannot_be_swapped_for_a_link_out(
    make_executor: ExecutorFactory, home: Path, tmp_path: Path
) -> None:
    # `~/.ssh -> dotfiles/a/b/ssh`, `dotfiles/a/b/ssh -> ../../ssh-real`: a command swapped
    # `a` for a link (one `renameat2` exchange) to a directory outside every root, and the
    # put-back, following it, renamed and replaced the user's files there; or to a copy of
    # its own whose `b/ssh` link was unchanged, and host ssh then read its config (red team
    # round 5). The directories on the way are pinned; the put-back follows no link.
    dotfiles = home / "dotfiles"
    (dotfiles / "a" / "b").mkdir(parents=True)
    (dotfiles / "ssh-real").mkdir()
    (dotfiles / "ssh-real" / "config").write_text("Host x\n")
    (dotfiles / "a" / "b" / "ssh").symlink_to("../../ssh-real")
    (home / ".ssh").symlink_to("dotfiles/a/b/ssh")
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (outside / "b" / "ssh").write_text("the user's own file\n")
    ex = make_executor(mode="workspace-write", workspace_root=str(dotfiles))
    evil = (
        "mkdir -p evil/x/b evil/ssh-real && ln -s ../../ssh-real evil/x/b/ssh"
        " && echo 'Match exec x' > evil/ssh-real/config"
    )
    for target in (str(outside), "evil/x"):
        result = await _run(ex, f"{evil}; ln -sfn {target} a.new && {_EXCHANGE}", dotfiles)
        assert result.sandbox is not None and result.sandbox.enforcement == "partial"
        assert (dotfiles / "a").is_dir() and not (dotfiles / "a").is_symlink()
        assert (home / ".ssh" / "config").read_text() == "Host x\n"  # what host ssh reads
    assert (outside / "b" / "ssh").read_text() == "the user's own file\n"
    assert os.listdir(outside / "b") == ["ssh"]


def test_the_put_back_follows_no_link_on_its_way(tmp_path: Path) -> None:
    from bash_sandbox.link_restore import put_back

    root, outside = tmp_path / "root", tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (outside / "b" / "ssh").write_text("the user's own file\n")
    root.mkdir()
    (root / "a").symlink_to(outside)  # a directory on the way, swapped for a link out
    done = put_back(str(root), str(root / "a" / "b" / "ssh"), "../../ssh-real")
    assert done is not None and "could not put back" in done
    assert (outside / "b" / "ssh").read_text() == "the user's own file\n"
    assert os.listdir(outside / "b") == ["ssh"]
