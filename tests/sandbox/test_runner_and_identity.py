"""Runner failures outrank denials; danger-full-access is byte-for-byte the local executor;
confined spawns stay correct while other threads allocate, log and import."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from bash_local import LocalBashExecutor
from bash_sandbox import SandboxBashExecutor, SandboxUnavailableError
from bash_sandbox.backends.bwrap import BwrapBackend, find_bwrap
from bash_seam import BashExecRequest
from tests.facts.evidence import file_refusal_reported
from tests.sandbox.conftest import ExecutorFactory, require_backend


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def flaky_runner(tmp_path: Path) -> str:
    """A bwrap-compatible runner that fails (like a broken runner) when the command asks it to."""
    require_backend("bwrap")
    return _script(
        tmp_path / "runner",
        """
for a in "$@"; do
  case "$a" in *RUNNER_BREAKS_NOW*) echo "runner: fatal: cannot set up namespace" >&2; exit 1;; esac
done
exec /usr/bin/bwrap "$@"
""",
    )


async def test_runner_failure_raises_in_foreground_and_the_command_never_ran(
    flaky_runner: str, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    async with SandboxBashExecutor(
        runner_command=[flaky_runner],
        workspace_root=str(ws),
        runner_failure_signatures=["runner: fatal:"],
        mode="workspace-write",
    ) as ex:
        ok = await ex.run(ex.resolve(BashExecRequest(command="echo ok", workdir=str(ws))))
        assert ok.stdout.text == "ok\n"
        assert ok.sandbox is not None and ok.sandbox.backend == "runner"
        spec = ex.resolve(
            BashExecRequest(command="touch marker # RUNNER_BREAKS_NOW", workdir=str(ws))
        )
        with pytest.raises(SandboxUnavailableError) as info:
            await ex.run(spec)
        assert "cannot set up namespace" in info.value.detail
        proc = await ex.start(spec)
        await proc.wait()
        assert proc.sandbox is not None
        assert proc.sandbox.runner_failed is True
        assert proc.sandbox.denied is False
    assert not (ws / "marker").exists()


@pytest.mark.parametrize(
    "body",
    [
        "exit 1\n",  # broken: fails the probe
        "sleep 30\n",  # hanging: probe times out
        'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n',  # tampered: unconfined
    ],
)
async def test_broken_hanging_or_tampered_runner_is_refused_before_anything_runs(
    tmp_path: Path, body: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    runner = _script(tmp_path / "runner", body)
    marker = ws / "marker"
    async with SandboxBashExecutor(
        runner_command=[runner],
        workspace_root=str(ws),
        probe_timeout_ms=1000,
        mode="workspace-write",
    ) as ex:
        spec = ex.resolve(BashExecRequest(command=f"touch {marker}", workdir=str(ws)))
        with pytest.raises(SandboxUnavailableError):
            await ex.run(spec)
        with pytest.raises(SandboxUnavailableError):
            await ex.start(spec)
    assert not marker.exists()
    assert not (tmp_path / "escape").exists()


async def test_a_runner_tampered_after_its_probe_runs_nothing_unconfined(tmp_path: Path) -> None:
    # The first call (the probe) reaches the real bwrap; every later one drops bwrap and
    # execs the command directly. As root and as an unprivileged user (whose user namespace
    # cannot see the executor's descriptors), the in-sandbox check must refuse it.
    require_backend("bwrap")
    ws = tmp_path / "ws"
    ws.mkdir()
    calls = tmp_path / "calls"
    runner = _script(
        tmp_path / "runner",
        f'if [ ! -e {calls} ]; then : > {calls}; exec /usr/bin/bwrap "$@"; fi\n'
        'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n',
    )
    marker = ws / "marker"
    async with SandboxBashExecutor(
        runner_command=[runner], workspace_root=str(ws), mode="workspace-write"
    ) as ex:
        spec = ex.resolve(BashExecRequest(command=f"touch {marker}", workdir=str(ws)))
        with pytest.raises(SandboxUnavailableError) as info:
            await ex.run(spec)
    assert calls.exists()  # the probe did go through the real bwrap
    assert "did not confine" in info.value.detail
    assert not marker.exists()


async def test_missing_runner_is_refused(tmp_path: Path) -> None:
    async with SandboxBashExecutor(
        runner_command=[str(tmp_path / "absent")], workspace_root=str(tmp_path)
    ) as ex:
        with pytest.raises(SandboxUnavailableError):
            await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(tmp_path))))


IDENTITY_PROBE = r"""
printf 'argv0=%s\n' "$0"; pwd; umask; ulimit -a; env | sort
ls -l /proc/self/fd | awk 'NR>1 {print $9, $10, $11}' \
  | sed -E 's/\[[0-9]+\]//; s#/proc/[0-9]+#/proc/N#'
readlink /proc/self/fd/0 | sed 's/[0-9]*//g'
cat /proc/self/status | grep -E '^(Cap|NoNewPrivs|Seccomp)'
printf '\x00\x01\xfe\xff binary \xc3\x28 tail\n'
"""


async def test_danger_full_access_is_byte_for_byte_the_local_executor(tmp_path: Path) -> None:
    local = LocalBashExecutor(cwd=str(tmp_path))
    sandboxed = SandboxBashExecutor(
        cwd=str(tmp_path), mode="danger-full-access", backend="seatbelt"
    )  # never touched in this mode
    try:
        outs = []
        for ex in (local, sandboxed):
            spec = ex.resolve(BashExecRequest(command=IDENTITY_PROBE, stdin="in"))
            scope = await ex._open_scope(spec)
            plan = scope.plan
            scope.close()
            outs.append(
                (
                    plan.argv,
                    dict(plan.env),
                    plan.cwd,
                    plan.preexec_fn,
                    plan.pass_fds,
                    await ex.run(spec),
                )
            )
        (l_argv, l_env, l_cwd, l_pre, l_fds, l_res), (s_argv, s_env, s_cwd, s_pre, s_fds, s_res) = (
            outs
        )
        assert (l_argv, l_env, l_cwd, l_pre, l_fds) == (s_argv, s_env, s_cwd, s_pre, s_fds)
        assert l_res.stdout.text == s_res.stdout.text
        assert l_res.stderr.text == s_res.stderr.text
        assert l_res.exit_code == s_res.exit_code == 0
        assert "Seccomp:\t0" in s_res.stdout.text
        assert l_res.sandbox is None
        assert s_res.sandbox is not None
        assert (
            s_res.sandbox.mode,
            s_res.sandbox.denied,
            s_res.sandbox.enforcement,
            s_res.sandbox.backend,
        ) == ("danger-full-access", False, None, None)
    finally:
        await local.aclose()
        await sandboxed.aclose()


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
async def test_hundreds_of_confined_spawns_while_other_threads_allocate_log_and_import(
    backend: str, tmp_path: Path
) -> None:
    require_backend(backend)
    stop = threading.Event()
    log = logging.getLogger("bash_sandbox.test.noise")
    log.addHandler(logging.NullHandler())
    log.propagate = False
    # Disjoint per thread: each reloads only its own modules, under the import lock.
    modules = (("fractions", "statistics"), ("difflib", "textwrap"), ("csv", "wave"))
    errors: list[BaseException] = []

    def noise(seed: int) -> None:
        mine = [importlib.import_module(name) for name in modules[seed]]
        i = 0
        try:
            while not stop.is_set():
                junk = [bytearray(4096) for _ in range(64)]  # malloc pressure
                log.warning("noise %d %d", seed, len(junk))  # takes logging's locks
                importlib.reload(mine[i % len(mine)])
                i += 1
        except BaseException as exc:  # surfaced below: noise must not die silently
            errors.append(exc)

    threads = [threading.Thread(target=noise, args=(n,), daemon=True) for n in range(3)]
    for t in threads:
        t.start()
    try:
        async with SandboxBashExecutor(backend=backend, workspace_root=str(tmp_path)) as ex:
            sem = asyncio.Semaphore(8)

            async def one(n: int) -> str:
                async with sem:
                    r = await ex.run(
                        ex.resolve(
                            BashExecRequest(
                                command=f"echo {n}; echo x > f{n}", workdir=str(tmp_path)
                            )
                        )
                    )
                    assert file_refusal_reported(r.sandbox, str(tmp_path / f"f{n}"))
                    return r.stdout.text

            outs = await asyncio.wait_for(asyncio.gather(*(one(n) for n in range(200))), 120)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert errors == []
    assert outs == [f"{n}\n" for n in range(200)]
    assert not any(name.startswith("f") for name in os.listdir(tmp_path))


async def test_a_bwrap_failure_the_command_prints_is_its_own_output_not_the_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `bwrap: ...` on stderr and exit 1 read as bwrap failing to set up: the command, having
    # run in full, became `SandboxUnavailableError` ("the host cannot confine: retry with
    # danger-full-access"), its output and git report dropped (red team). bwrap's own JSON
    # status says it exec'd the command: its stderr is then the command's.
    require_backend("bwrap")
    ws = tmp_path / "ws"
    ws.mkdir()
    forge = (
        "echo ran > marker; echo \"bwrap: Can't mount proc on /newroot/proc: "
        'Operation not permitted" >&2; exit 1'
    )
    async with SandboxBashExecutor(
        backend="bwrap", workspace_root=str(ws), mode="workspace-write"
    ) as ex:
        result = await ex.run(ex.resolve(BashExecRequest(command=forge, workdir=str(ws))))
        assert result.exit_code == 1 and "bwrap: Can't mount" in result.stderr.text
        assert result.sandbox is not None and result.sandbox.runner_failed is False
        proc = await ex.start(ex.resolve(BashExecRequest(command=forge, workdir=str(ws))))
        await proc.wait()
        assert proc.sandbox is not None and proc.sandbox.runner_failed is False
        assert (ws / "marker").read_text() == "ran\n"
        (ws / "marker").unlink()
        # bwrap's own setup failure is still one: its status has no exit-code record.
        real = find_bwrap()
        wrapper = _script(
            tmp_path / "bwrap",
            f'exec {real} --ro-bind {tmp_path}/missing {tmp_path}/missing "$@"\n',
        )
        monkeypatch.setattr(BwrapBackend, "_argv_prefix", lambda self: wrapper)
        with pytest.raises(SandboxUnavailableError) as info:
            await ex.run(ex.resolve(BashExecRequest(command="echo ran > marker", workdir=str(ws))))
        assert "bwrap:" in info.value.detail
    assert not (ws / "marker").exists()


async def test_the_command_runs_as_the_user_the_executor_is(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # As bwrap did: an ordinary user's command under Landlock ran as uid 0 of the executor's
    # user namespace, and programs that refuse root (PostgreSQL's `initdb`) failed. As root
    # (CI's first leg) it is 0 on both; the unprivileged leg runs this as nobody.
    ex = make_executor(mode="workspace-write")
    result = await ex.run(
        ex.resolve(
            BashExecRequest(
                command="id -u; id -g; echo x > made; stat -c '%u %g' made; "
                "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status",
                workdir=str(workspace),
            )
        )
    )
    assert result.exit_code == 0, result.stderr.text
    lines = result.stdout.text.splitlines()
    assert lines[:3] == [str(os.getuid()), str(os.getgid()), f"{os.getuid()} {os.getgid()}"]
    assert all(line.split()[1] == "0000000000000000" for line in lines[3:]), lines
    host = (workspace / "made").stat()
    assert (host.st_uid, host.st_gid) == (os.getuid(), os.getgid())


async def test_a_workspace_the_command_made_unenterable_is_a_workdir_error(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # `chmod 0 .` made every later call a `SandboxUnavailableError` (bwrap could not chdir):
    # the harness was told the host cannot confine. It is the workdir that is unusable.
    from bash_seam import WorkdirError

    ex = make_executor(mode="workspace-write")
    spec = ex.resolve(BashExecRequest(command="chmod 0 . && echo done", workdir=str(workspace)))
    try:
        first = await ex.run(spec)
        assert first.stdout.text == "done\n", first.stderr.text
        assert stat.S_IMODE(workspace.stat().st_mode) == 0
        for mode in ("workspace-write", "read-only"):
            request = BashExecRequest(command="true", workdir=str(workspace), sandbox_mode=mode)
            with pytest.raises(WorkdirError, match="cannot enter"):
                await ex.run(ex.resolve(request))
    finally:
        workspace.chmod(0o755)
    again = await ex.run(ex.resolve(BashExecRequest(command="echo ok", workdir=str(workspace))))
    assert again.stdout.text == "ok\n"


async def test_update_checks_are_off_offline_and_git_takes_no_optional_lock(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # Refused lookups (pip's and npm's update checks) and a refused `index.lock` (git status
    # refreshing the index) were reported after work that went fine.
    ex = make_executor()
    for mode, expected in (
        ("read-only", ["1", "false", "0"]),
        ("workspace-write", ["1", "false", "0"]),
    ):
        request = BashExecRequest(
            command='echo "$PIP_DISABLE_PIP_VERSION_CHECK"; echo "$npm_config_update_notifier";'
            ' echo "$GIT_OPTIONAL_LOCKS"',
            workdir=str(workspace),
            sandbox_mode=mode,
        )
        result = await ex.run(ex.resolve(request))
        assert result.stdout.text.splitlines() == expected, mode


async def test_tar_extracts_another_uids_archive_as_it_would_outside(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A usability pass: GNU tar run as root restores each entry's owner, which no confined
    # command can give: a release tarball of uid 1000 failed (`Cannot change ownership`,
    # exit 2). `TAR_OPTIONS=--no-same-owner` now, after the harness's own options.
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("x\n")
    archive = workspace / "own1000.tar"
    subprocess.run(
        ["tar", "cf", str(archive), "--owner=1000", "--group=1000", "-C", str(src), "d"],
        check=True,
    )
    ex = make_executor(mode="workspace-write")
    result = await ex.run(
        ex.resolve(
            BashExecRequest(
                command='mkdir x && tar xf own1000.tar -C x && echo "$TAR_OPTIONS"',
                workdir=str(workspace),
                env={"TAR_OPTIONS": "--warning=no-timestamp"},
            )
        )
    )
    assert result.exit_code == 0, result.stderr.text
    assert result.stdout.text == "--warning=no-timestamp --no-same-owner\n"
    assert (workspace / "x" / "d" / "f").read_text() == "x\n"


async def test_a_root_holding_the_executors_state_is_a_request_error(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # `--writable-root /tmp` was a `SandboxUnavailableError` ("the host cannot confine").
    from bash_seam import InvalidRequestError

    ex = make_executor(mode="workspace-write", writable_roots=("/tmp",))
    with pytest.raises(InvalidRequestError, match="private state"):
        await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
