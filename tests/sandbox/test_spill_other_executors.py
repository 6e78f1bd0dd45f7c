"""Spill files of another executor of this uid (threat row 13): unreachable from every
confined command, whatever `TMPDIR` that executor had and after its base is gone.

Each test spills a secret from a harness in another process (its own `TMPDIR`, so its own
per-user base), then a confined command of this process's executor is given the spill path
(a result names it, so a model knows it) and copies what it reads into the workspace; the
host judges the copy and that the spill file still holds the secret.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bash_seam import BashExecRequest
from tests.sandbox.conftest import ExecutorFactory

# A harness of this uid in its own process: a local executor spills exactly as a confining
# one does (`bash_local.output.SpillDirectory`); prints the spill path.
_HARNESS = """
import asyncio, sys
from bash_local import LocalBashExecutor
from bash_seam import BashExecRequest
async def main(secret, spill_dir):
    kw = {"spill_dir": spill_dir} if spill_dir else {}
    async with LocalBashExecutor(max_output_bytes=1000, **kw) as ex:
        command = f"echo {secret}; head -c 5000 /dev/zero | tr '\\\\0' x"
        r = await ex.run(ex.resolve(BashExecRequest(command=command, workdir=sys.argv[3])))
        print(r.stdout.spill_path)
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _spill_in_other_harness(tmpdir: Path, spill_dir: Path | None, secret: str) -> Path:
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    out = subprocess.run(
        [sys.executable, "-c", _HARNESS, secret, str(spill_dir or ""), str(tmpdir)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    path = Path(out.stdout.strip())
    assert path.read_text().startswith(secret)  # the attack has something to read
    return path


async def _steal(make_executor: ExecutorFactory, workspace: Path, spill: Path) -> bytes:
    """What a confined command read of ``spill``, as the host finds it in the workspace."""
    ex = make_executor(mode="workspace-write")
    request = BashExecRequest(
        command='cat "$P" > stolen 2>/dev/null; head -c 64 "$P" >> stolen 2>&1; true',
        workdir=str(workspace),
        env={"P": str(spill)},
    )
    result = await ex.run(ex.resolve(request))
    assert result.exit_code == 0, result.stderr.text
    return (workspace / "stolen").read_bytes()


async def test_a_harness_with_another_tmpdir_spills_where_no_command_reads(
    make_executor: ExecutorFactory, workspace: Path, private_base: Path, tmp_path: Path
) -> None:
    # Its `<base>/spill` lay under its own TMPDIR's base, hidden only from its own commands.
    secret = f"HARNESS-A-SECRET-{secrets.token_hex(8)}"
    spill = _spill_in_other_harness(tmp_path / "tmp-a", None, secret)
    assert not str(spill).startswith(str(private_base))  # another base than this executor's
    stolen = await _steal(make_executor, workspace, spill)
    assert secret.encode() not in stolen, stolen
    assert b"Permission denied" in stolen or b"No such file" in stolen, stolen
    assert spill.read_text().startswith(secret)  # kept for its caller, from the host


async def test_a_custom_spill_dir_stays_hidden_when_its_harness_base_is_gone(
    make_executor: ExecutorFactory, workspace: Path, private_base: Path, tmp_path: Path
) -> None:
    # Registered only in the base of the harness that used it: a /tmp cleaner or a reboot
    # removed that base, the spill files stayed (on purpose), and nothing hid them.
    secret = f"HARNESS-A-SECRET-{secrets.token_hex(8)}"
    parent = tmp_path / "spill-a"
    parent.mkdir()
    spill = _spill_in_other_harness(tmp_path / "tmp-a", parent, secret)
    shutil.rmtree(tmp_path / "tmp-a")  # the harness's base, gone
    stolen = await _steal(make_executor, workspace, spill)
    assert secret.encode() not in stolen, stolen
    assert b"Permission denied" in stolen or b"No such file" in stolen, stolen
    assert spill.read_text().startswith(secret)


@pytest.fixture(autouse=True)
def _spill_files_removed(tmp_path: Path) -> Iterator[None]:
    """The spill dirs are 0300 (never listable): made removable for pytest's cleanup."""
    yield
    for directory in tmp_path.rglob("bash-local-spill-*"):
        directory.chmod(0o700)
