"""`deny_read` names that lie inside a writable root, on both backends (threat-model row 5).

A denied name missing inside a root was only watched: the command built it elsewhere and
renamed it into place (`mv -T st ~/.ssh`), content and all, before the stop. A denied link
in a directory above the workspace (`D/link -> ws/sec`, the workspace `D/ws`) left its
target readable and writable: the link's directory was shadowed, the workspace bound back
whole. Each attack is tried for real and the host judged from outside.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest, BashRunResult
from tests.sandbox.conftest import ExecutorFactory


async def _run(ex: SandboxBashExecutor, command: str, workdir: Path) -> BashRunResult:
    return await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workdir))))


async def test_a_missing_denied_name_in_a_root_cannot_be_made_or_read(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    creds = workspace / "creds"
    key = workspace / "keys" / "id"
    ex = make_executor(mode="workspace-write", deny_read=(str(creds), str(key)))
    plant = (
        "mkdir st && echo PLANTED > st/config && mv -T st creds; "
        "echo PLANTED > f && mv -T f creds; echo PLANTED > creds; "
        "mkdir -p keys; echo PLANTED > keys/id; "
        "echo fine > notes"
    )
    result = await _run(ex, plant, workspace)
    assert (workspace / "notes").read_text() == "fine\n"  # the rest of the root is work
    assert result.sandbox is not None
    assert not any("stopped" in w for w in result.sandbox.warnings), result.sandbox.warnings
    # The host: nothing the command made stands at either name (the placeholders are gone).
    assert not os.path.lexists(creds) and not os.path.lexists(key)
    assert not os.path.lexists(workspace / "keys")
    # Held while the command runs: what the host writes there meanwhile stays unreadable.
    # A directory, as git never shows an empty one: an empty file there was `?? creds` in
    # the host's `git status`, and `git add -A` tracked it (a later secret one commit away).
    loop = "for i in $(seq 100); do cat creds/k 2>/dev/null >> loot; sleep 0.01; done; echo ok"
    proc = await ex.start(ex.resolve(BashExecRequest(command=loop, workdir=str(workspace))))
    for _ in range(200):
        if creds.exists():
            break
        await asyncio.sleep(0.01)
    assert creds.is_dir() and os.listdir(creds) == []
    (creds / "k").write_text("TOPSECRET\n")  # the host's own file (no longer a placeholder)
    await proc.wait()
    loot = workspace / "loot"
    assert "TOPSECRET" not in (loot.read_text() if loot.exists() else "")
    assert (creds / "k").read_text() == "TOPSECRET\n"


async def test_a_denied_link_above_the_workspace_hides_its_target_inside(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "sec").mkdir()
    (workspace / "sec" / "k").write_text("CANARY-DIR\n")
    (workspace / "f").write_text("CANARY-FILE\n")
    (tmp_path / "link").symlink_to("ws/sec")
    (tmp_path / "flink").symlink_to("ws/f")
    deny = (str(tmp_path / "link"), str(tmp_path / "flink"))
    for mode in ("read-only", "workspace-write"):
        ex = make_executor(mode=mode, deny_read=deny)
        result = await _run(
            ex, "cat sec/k f; cat sec/k f > /tmp/x; echo tampered >> f; echo done", workspace
        )
        assert "CANARY" not in result.stdout.text, (mode, result.stdout.text)
        assert result.stdout.text.strip().endswith("done"), result.stderr.text
    assert (workspace / "f").read_text() == "CANARY-FILE\n"
    assert (workspace / "sec" / "k").read_text() == "CANARY-DIR\n"
