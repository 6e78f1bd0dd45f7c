"""The probe cache across CLI processes: reused only when it matches, never a weaker spawn.

Each test looks at the cache from outside (the entry's file, its inode, its content) and at
the host (files a command tried to write), never only at the CLI's output.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cli_probes import CliRunner

from bash_sandbox import SandboxBashExecutor, SandboxUnavailableError
from bash_sandbox.backends.base import SandboxBackend
from bash_sandbox.probe_cache import FORMAT, ProbeCache, probe_key
from bash_sandbox.selection import BackendSelector, Candidates
from bash_seam import BashExecRequest
from tests.sandbox.conftest import require_backend


def _backend(name: str) -> SandboxBackend:
    from bash_sandbox.backends.bwrap import BwrapBackend
    from bash_sandbox.backends.landlock import LandlockBackend

    return BwrapBackend() if name == "bwrap" else LandlockBackend()


def _entry(tempdir: Path, name: str) -> Path:
    cls = "BwrapBackend" if name == "bwrap" else "LandlockBackend"
    return tempdir / f"bash-sandbox-{os.geteuid()}" / "probe-cache" / f"{cls}.json"


def _live_entry(name: str) -> dict[str, object]:
    return {"format": FORMAT, "usable": True, "key": probe_key(_backend(name))}


def _private_dirs(path: Path) -> None:
    """The user base and its cache directory, 0700 as the executor makes them."""
    for directory in (path.parent.parent, path.parent):
        directory.mkdir(mode=0o700, exist_ok=True)


def _plant(path: Path, entry: dict[str, object], mode: int = 0o600) -> None:
    _private_dirs(path)
    path.write_text(json.dumps(entry))
    path.chmod(mode)


@pytest.mark.parametrize("name", ["bwrap", "landlock"])
def test_a_run_stores_a_private_verdict_and_the_next_run_reuses_it(
    name: str, cli: CliRunner, workspace: Path, private_tempdir: Path
) -> None:
    require_backend(name)
    run = ("run", "--backend", name, "--workspace", str(workspace), "--")
    assert cli.run(*run, "true").returncode == 0
    entry = _entry(private_tempdir, name)
    first = entry.lstat()
    assert stat.S_ISREG(first.st_mode) and stat.S_IMODE(first.st_mode) == 0o600
    assert first.st_uid == os.geteuid()
    assert stat.S_IMODE(entry.parent.lstat().st_mode) == 0o700
    assert json.loads(entry.read_text()) == _live_entry(name)
    # The second run takes the verdict (a re-probe would have replaced the file) and is
    # still confined: its write is refused and the host has no such file.
    again = cli.run(*run, "echo x > f")
    assert again.returncode != 0
    assert not (workspace / "f").exists()
    second = entry.lstat()
    assert (second.st_ino, second.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)


@pytest.mark.parametrize("name", ["bwrap", "landlock"])
def test_a_stale_entry_is_probed_again_and_replaced(
    name: str, cli: CliRunner, workspace: Path, private_tempdir: Path, tmp_path: Path
) -> None:
    require_backend(name)
    stale = _live_entry(name)
    key = dict(stale["key"])  # type: ignore[call-overload]
    key["kernel"] = ["Linux", "0.0.1-older", "#1", os.uname().machine]
    stale["key"] = key
    entry = _entry(private_tempdir, name)
    _plant(entry, stale)
    outside = tmp_path / "outside"
    done = cli.run(
        "run", "--backend", name, "--mode", "workspace-write", "--workspace", str(workspace),
        "--", f"echo x > {outside}; echo ok > inside",
    )  # fmt: skip
    assert b"Read-only file system" in done.stderr
    assert not outside.exists()
    assert (workspace / "inside").read_text() == "ok\n"
    assert json.loads(entry.read_text()) == _live_entry(name)  # re-probed, then stored


@pytest.mark.parametrize("planted", ["writable-by-group", "owned-by-another-user", "symlink"])
def test_an_entry_not_ours_alone_is_ignored_and_replaced(
    planted: str, cli: CliRunner, workspace: Path, private_tempdir: Path, tmp_path: Path
) -> None:
    require_backend("bwrap")
    entry = _entry(private_tempdir, "bwrap")
    valid = _live_entry("bwrap")
    decoy = tmp_path / "decoy.json"
    if planted == "writable-by-group":
        _plant(entry, valid, mode=0o620)
    elif planted == "owned-by-another-user":
        if os.geteuid() != 0:
            pytest.skip("only root can give a file away")
        _plant(entry, valid)
        os.chown(entry, 65534, 65534)
    else:
        _plant(decoy, valid)
        _private_dirs(entry)
        entry.symlink_to(decoy)
    before = entry.lstat().st_ino
    assert cli.run("run", "--backend", "bwrap", "--workspace", str(workspace), "--", "true")
    after = entry.lstat()
    # Never vouched for: the run probed for real and stored its own entry in its place.
    assert after.st_ino != before
    assert stat.S_ISREG(after.st_mode) and after.st_uid == os.geteuid()
    assert stat.S_IMODE(after.st_mode) == 0o600
    if planted == "symlink":
        assert json.loads(decoy.read_text()) == valid  # the link's target was not written


def _fake_bwrap(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


async def _run(ex: SandboxBashExecutor, command: str, workdir: Path) -> object:
    return await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workdir))))


async def test_a_forged_verdict_for_a_broken_bwrap_is_refused_at_the_spawn(
    workspace: Path, tmp_path: Path
) -> None:
    from bash_sandbox.backends.bwrap import BwrapBackend

    require_backend("bwrap")
    broken = BwrapBackend(
        str(_fake_bwrap(tmp_path / "bwrap", "echo 'bwrap: setup failed' >&2\nexit 1\n"))
    )
    cache = ProbeCache(str(tmp_path / "cache"))
    cache.record(broken, usable=True)  # the forgery: "usable", with the right key
    assert cache.vouches_for(broken)
    async with SandboxBashExecutor(
        backend="bwrap", mode="workspace-write", workspace_root=str(workspace)
    ) as ex:
        ex._selector = BackendSelector(Candidates((broken,)), 5000, cache=cache)
        with pytest.raises(SandboxUnavailableError, match="bwrap: setup failed"):
            await _run(ex, "echo ran > marker", workspace)
        assert not (workspace / "marker").exists()  # refused, never run another way
        ex.selector.distrust_cached()
    assert not cache.vouches_for(broken)  # the next executor probes it for real
    fresh = BackendSelector(Candidates((broken,)), 5000, cache=cache)
    assert [p.usable for p in fresh.probes()] == [False]


async def test_a_verdict_for_a_binary_changed_since_is_not_trusted(
    workspace: Path, tmp_path: Path
) -> None:
    from bash_sandbox.backends.bwrap import BwrapBackend

    require_backend("bwrap")
    real = _backend("bwrap").path  # type: ignore[attr-defined]
    wrapper = _fake_bwrap(tmp_path / "bwrap", f'exec {real} "$@"\n')
    cache = ProbeCache(str(tmp_path / "cache"))
    assert (
        BackendSelector(Candidates((BwrapBackend(str(wrapper)),)), 10_000, cache=cache)
        .probes()[0]
        .usable
    )
    assert cache.vouches_for(BwrapBackend(str(wrapper)))  # a live probe stored it
    # The same path now runs the command unconfined (everything after `--`).
    _fake_bwrap(wrapper, 'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n')
    changed = BwrapBackend(str(wrapper))
    assert not cache.vouches_for(changed)
    outside = tmp_path / "outside"
    async with SandboxBashExecutor(
        backend="bwrap", mode="workspace-write", workspace_root=str(workspace)
    ) as ex:
        ex._selector = BackendSelector(Candidates((changed,)), 10_000, cache=cache)
        with pytest.raises(SandboxUnavailableError, match="escaped"):
            await _run(ex, f"echo x > {outside}", workspace)
    assert not outside.exists()


_LANDLOCK_GONE = """
import asyncio, errno, os, sys
import pyseccomp
from bash_sandbox import SandboxBashExecutor, SandboxUnavailableError
from bash_seam import BashExecRequest

async def main(workspace: str, syscall: str, helper: str) -> str:
    async with SandboxBashExecutor(
        backend="landlock",
        mode="workspace-write",
        workspace_root=workspace,
        spawn_helper=helper == "helper",
    ) as ex:
        spec = ex.resolve(BashExecRequest(command="echo ran > marker", workdir=workspace))
        first = await ex.run(spec)  # chosen and prepared while Landlock works
        assert first.exit_code == 0, first
        os.unlink(f"{workspace}/marker")
        if helper == "helper":
            # The helper started before the filter keeps Landlock; the next one, started
            # for the next spawn (as after a helper's death), has none.
            ex._services._helper.close()
        # From here on this process (and every child it forks) has no Landlock.
        flt = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
        flt.add_rule(pyseccomp.ERRNO(errno.ENOSYS), syscall)
        flt.load()
        try:
            await ex.run(spec)
        except SandboxUnavailableError as exc:
            return "refused: " + exc.detail
        except Exception as exc:
            return f"failed: {type(exc).__name__}: {exc}"
        return "ran"

print(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3])))
"""


@pytest.mark.parametrize("helper", ["fork", "helper"])
@pytest.mark.parametrize("syscall", ["landlock_restrict_self", "landlock_create_ruleset"])
def test_landlock_gone_after_the_choice_makes_the_spawn_fail(
    syscall: str, helper: str, workspace: Path, private_tempdir: Path
) -> None:
    # What a stale "usable" for Landlock would meet: the spawn needs Landlock at every step,
    # whether the executor forks the command or its spawn helper does.
    require_backend("landlock")
    done = subprocess.run(
        [sys.executable, "-c", _LANDLOCK_GONE, str(workspace), syscall, helper],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=dict(os.environ, TMPDIR=str(private_tempdir)),
    )
    assert done.returncode == 0, done.stderr
    outcome = done.stdout.strip()
    assert not (workspace / "marker").exists()  # the second command never ran
    # restrict_self: the child's mandatory step failed, the spawn is refused naming it;
    # create_ruleset: the parent cannot even build the ruleset, nothing is spawned at all.
    assert outcome.startswith("refused: "), outcome
    assert "landlock" in outcome


def test_doctor_probes_for_real_even_with_a_cached_verdict(
    cli: CliRunner, workspace: Path, private_tempdir: Path
) -> None:
    require_backend("bwrap")
    assert cli.run("run", "--backend", "bwrap", "--workspace", str(workspace), "--", "true")
    # The control: a selector that may use the cache takes this uid's entry...
    cached = BackendSelector(Candidates((_backend("bwrap"),)), 5000).probes()[0]
    assert "cached verdict" in cached.detail
    # ...and doctor, over the very same cache, does not.
    report = json.loads(cli.run("doctor", "--json").stdout)
    bwrap = next(b for b in report["backends"] if b["name"] == "bwrap")
    assert bwrap["usable"] and "cached" not in bwrap["detail"]
    assert bwrap["version"]  # only a live probe asks bwrap for its version
    assert any("probed for real" in note for note in report["notes"])


def test_only_the_plain_full_backends_are_ever_cached(tmp_path: Path) -> None:
    from bash_sandbox.backends.bwrap import BwrapBackend
    from bash_sandbox.backends.landlock_only import LandlockOnlyBackend
    from bash_sandbox.backends.seatbelt import SeatbeltBackend

    cache = ProbeCache(str(tmp_path / "cache"))
    never = (
        BwrapBackend(runner_prefix=("/usr/bin/env",)),  # an operator's runner
        LandlockOnlyBackend(),  # the namespace-less fallback
        SeatbeltBackend(),
    )
    for backend in never:
        assert probe_key(backend) is None
        cache.record(backend, usable=True)
        assert not cache.vouches_for(backend)
    assert not (tmp_path / "cache").exists()  # nothing was even looked up


def test_a_verdict_for_a_later_candidate_never_jumps_the_order(
    cli: CliRunner, workspace: Path, private_tempdir: Path
) -> None:
    require_backend("bwrap")
    require_backend("landlock")
    _plant(_entry(private_tempdir, "landlock"), _live_entry("landlock"))
    done = cli.run("run", "--json", "--workspace", str(workspace), "--", "true")
    assert json.loads(done.stdout)["sandbox"]["backend"] == "bwrap"  # probed first, live
    assert json.loads(_entry(private_tempdir, "bwrap").read_text()) == _live_entry("bwrap")
