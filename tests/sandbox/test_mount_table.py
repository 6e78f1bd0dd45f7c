"""The mount table the Linux backends read at each spawn (`view_steps.read_mount_table`).

It is kept between spawns and read again only once the kernel polls a change: a mount made
or removed since must be in the next answer. Checked in a mount namespace of the test's
own (`unshare -m`), so the host's mounts never change.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys
    from bash_sandbox.backends import view_steps

    target = sys.argv[1]
    fds = set(os.listdir("/proc/self/fd"))
    kept = view_steps.KeptMountTable()
    points = lambda: {point for point, _ in kept.read()}
    first = kept.read()
    assert first == view_steps.read_mount_table(), "not the table as read now"
    assert kept.read() is first, "not kept while nothing changed"
    assert target not in points()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,ro", "kept", target], check=True)
    table = kept.read()
    assert table is not first, "a mount since was not read"
    flags = dict(table)[target]
    assert flags & 1, f"read-only flag missing: {flags}"
    subprocess.run(["umount", target], check=True)
    assert target not in points(), "an unmount since was not read"
    # A fork reads its own: the parent's poll state is not shared with it.
    pid = os.fork()
    if pid == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "kept", target], check=True)
        os._exit(0 if target in points() else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the fork's mount was not read"
    assert target in points(), "the parent missed the fork's mount"
    kept.close()
    assert set(os.listdir("/proc/self/fd")) == fds, "its descriptor outlived close()"
    print("ok")
    """
)


def test_the_kept_mount_table_follows_mounts_and_unmounts(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount in a namespace of its own (the root run has it)")
    if shutil.which("unshare") is None:
        if os.environ.get("CI"):
            pytest.fail("CI has util-linux")
        pytest.skip("no unshare here")
    target = tmp_path / "point"
    target.mkdir()
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", SCRIPT, str(target)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    # The host never saw it.
    assert not any(
        str(target) in line for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )
