"""The audit itself: its catalog covers every row, its report fails on any escape, the CLI
entry point works end to end, and an interrupted audit leaves nothing behind."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import glob
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bash_sandbox_audit import ATTACKS, audit_main
from bash_sandbox_audit.attacks import by_id
from bash_sandbox_audit.model import LINUX_BACKENDS, Finding, Verdict
from bash_sandbox_audit.report import as_json_data, render_json, render_table
from bash_sandbox_audit.runner import AuditReport, AuditSession, CellResult, ProbeResult
from policies import SandboxMode
from tests.sandbox.conftest import probe
from tests.workflows.workspaces import remove_tree

# Row 17 (resource limits) is audited by the limits work, not by this catalog.
THREAT_MODEL_ROWS = {*range(1, 17), 18, 19, 20, 21}
COVERAGE_DOC = Path(__file__).resolve().parents[2] / "docs" / "threat-model-coverage.md"


def test_every_threat_model_row_has_attacks_and_ids_name_their_row() -> None:
    rows = {a.row for a in ATTACKS if a.kind == "attack"}
    assert rows == set(THREAT_MODEL_ROWS)
    ids = [a.id for a in ATTACKS]
    assert len(ids) == len(set(ids))
    for a in ATTACKS:
        if a.kind == "control":
            # General controls are row 0; a row's own controls name their row.
            prefix = "control-" if a.row == 0 else f"row{a.row}-control-"
        else:
            prefix = f"row{a.row}-"
        assert a.id.startswith(prefix), a.id
        assert a.modes and a.backends


def test_catalog_is_in_row_order_and_every_module_row_matches_its_entries() -> None:
    import importlib
    import pkgutil

    import bash_sandbox_audit.attacks as catalog

    rows = [a.row for a in ATTACKS]
    assert rows == sorted(rows)
    for info in pkgutil.iter_modules(catalog.__path__):
        if not info.name.startswith("row"):
            continue
        module = importlib.import_module(f"{catalog.__name__}.{info.name}")
        row = int(info.name[3:5])
        entries = [*module.ATTACKS, *getattr(module, "CONTROLS", [])]
        assert entries and {a.row for a in entries} == {row}, info.name
        assert all(a in ATTACKS for a in entries), info.name


def test_positive_controls_cover_what_stays_allowed() -> None:
    controls = {a.id for a in ATTACKS if a.kind == "control"}
    for needed in (
        "control-read-filesystem",
        "control-exec",
        "control-dev-sinks",
        "control-write-workspace",
        "control-loopback-inside",
        "control-background-process",
    ):
        assert needed in controls


def test_coverage_document_describes_every_attack() -> None:
    text = COVERAGE_DOC.read_text()
    missing = [a.id for a in ATTACKS if f"`{a.id}`" not in text]
    assert not missing, f"document these in {COVERAGE_DOC.name}: {missing}"


def _report(*verdicts: Verdict) -> AuditReport:
    attack = next(a for a in ATTACKS if a.kind == "attack")
    results = [
        CellResult(
            attack.id,
            attack.row,
            attack.title,
            attack.kind,
            "bwrap",
            mode,
            v,
            f"detail {v.value}",
            ("evidence line",),
        )
        for v, mode in zip(verdicts, ("read-only", "workspace-write"), strict=False)
    ]
    return AuditReport(
        columns=[("bwrap", "read-only"), ("bwrap", "workspace-write")],
        attacks=[attack],
        results=results,
        probes={"bwrap": ProbeResult("bwrap", True, "ok")},
        host={"kernel": "6.x", "landlock_abi": "7", "euid": "0"},
    )


@pytest.mark.parametrize(
    ("verdicts", "code"),
    [
        ((Verdict.CONTAINED, Verdict.CONTAINED), 0),
        ((Verdict.CONTAINED, Verdict.SKIPPED), 0),
        ((Verdict.NOT_ENFORCEABLE, Verdict.PASSED), 0),
        ((Verdict.CONTAINED, Verdict.ESCAPED), 1),
        ((Verdict.BROKEN, Verdict.CONTAINED), 1),
        ((Verdict.ERROR, Verdict.CONTAINED), 1),
    ],
)
def test_exit_code_is_zero_only_without_escapes_broken_controls_or_errors(
    verdicts: tuple[Verdict, ...], code: int
) -> None:
    report = _report(*verdicts)
    assert report.exit_code == code
    assert as_json_data(report)["exit_code"] == code


def test_table_and_json_carry_the_same_cells_and_the_evidence() -> None:
    report = _report(Verdict.CONTAINED, Verdict.ESCAPED)
    table = render_table(report)
    header = next(line for line in table.splitlines() if line.startswith("row "))
    assert "bwrap/ro" in header and "bwrap/ww" in header
    assert re.search(r"contained\s+ESCAPED", table)
    assert "evidence line" in table and "FAIL" in table
    data = json.loads(render_json(report))
    assert [r["verdict"] for r in data["results"]] == ["contained", "ESCAPED"]
    assert data["summary"]["ESCAPED"] == 1 and data["results"][1]["evidence"] == ["evidence line"]


def test_a_skipped_premise_is_never_counted_as_contained() -> None:
    report = _report(Verdict.SKIPPED, Verdict.NOT_ENFORCEABLE)
    assert as_json_data(report)["summary"]["contained"] == 0
    assert "never counted as contained" in render_table(report)
    assert Finding(Verdict.SKIPPED).verdict.fails is False


@pytest.mark.skipif(not os.environ.get("CI"), reason="enforced in CI only")
def test_ci_has_every_linux_backend_usable() -> None:
    for backend in LINUX_BACKENDS:
        result = probe(backend)
        assert result.usable, f"{backend} must be usable in CI: {result.detail}"


@pytest.fixture
def audit_tag(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This test's label in its audit's directory and token names: only what this test
    started is judged, whatever other audit runs on the machine meanwhile. Afterwards,
    what an audit killed outright (a failed or skipped test) could not remove is: this
    tag's processes, by pid, and its directories."""
    tag = "t" + os.urandom(5).hex()
    monkeypatch.setenv("BASH_SANDBOX_AUDIT_TAG", tag)
    yield tag
    dirs, pids = _leftovers(tag)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for path in dirs:
        remove_tree(Path(path))


def _leftovers(tag: str) -> tuple[set[str], set[int]]:
    """This run's audit directories, and processes carrying its token or its paths."""
    name = f"bash-sandbox-audit-{tag}-"
    dirs = set(
        glob.glob(f"/var/tmp/{name}*")
        + glob.glob(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"{name}*"))
    )
    token = f"BASH_SANDBOX_AUDIT_RUN=bsa{tag}".encode()
    pids = set()
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{proc}/environ", "rb") as fh:
                environ = fh.read()
            with open(f"{proc}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        # Victims carry the run's paths in their argv; attacked commands carry its token.
        if token in environ or name.encode() in cmdline:
            pids.add(int(proc.split("/")[2]))
    return dirs, pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux backends only")
def test_audit_command_reports_json_and_cleans_up(audit_tag: str) -> None:
    if not any(probe(b).usable for b in LINUX_BACKENDS):
        pytest.skip("no usable Linux backend here")
    before = _leftovers(audit_tag)
    out = io.StringIO()
    args = argparse.Namespace(
        backend="all", mode="all", json=True, attack=["control-exec", "row6-kill-term-victim"]
    )
    with contextlib.redirect_stdout(out):
        code = audit_main(args)
    data = json.loads(out.getvalue())
    assert {a["id"] for a in data["attacks"]} == {"control-exec", "row6-kill-term-victim"}
    assert len(data["results"]) == 2 * len(data["columns"])
    assert code == data["exit_code"]
    assert _leftovers(audit_tag) == before


def test_audit_command_rejects_an_unknown_attack_glob(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(backend="all", mode="all", json=False, attack=["no-such-*"])
    assert audit_main(args) == 2
    assert "no attack matches" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux backends only")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_audit_kills_and_removes_everything_it_started(
    sig: int, audit_tag: str
) -> None:
    if not any(probe(b).usable for b in LINUX_BACKENDS):
        pytest.skip("no usable Linux backend here")
    before = _leftovers(audit_tag)
    script = (
        # SIGUSR1 dumps every thread's stack: where an audit that never got going waits.
        "import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True); "
        "import argparse, sys; from bash_sandbox_audit import audit_main; "
        "sys.exit(audit_main(argparse.Namespace(backend='all', mode='all', json=False, "
        # Enough attacks (about 12 s unloaded) that a loaded machine's slow /proc scan
        # still finds them live.
        "attack=['row11-*', 'row6-*'])))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # A default SIGINT disposition, as in a terminal (a background job may inherit SIG_IGN).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )
    try:
        # Generous: on a loaded machine (CI runs two workers on two cores) the audit's start,
        # imports and live probes of every backend, has taken more than a minute.
        deadline = time.monotonic() + 150
        # Interrupt while attacks are live: their daemons and victims exist. Only processes
        # seen for half a second count: the audit's own short children (a backend probe's,
        # a git) carry its token too, and a scan that caught one, then a second scan that
        # no longer did, once passed for an audit that never got going.
        first_seen: dict[int, float] = {}
        live: set[int] = set()
        while time.monotonic() < deadline and not live:
            if proc.poll() is not None:
                break  # it ended before anything was seen: say how
            now = time.monotonic()
            first_seen = {p: first_seen.get(p, now) for p in _leftovers(audit_tag)[1] - before[1]}
            live = {p for p, seen in first_seen.items() if now - seen >= 0.5}
            time.sleep(0.05)
        if not live:
            if proc.poll() is None:
                proc.send_signal(signal.SIGUSR1)
                time.sleep(1)
                proc.kill()
            # Every thread's stack (the one holding the others back may come first).
            dump = proc.communicate(timeout=30)[1].decode()[-16000:]
            if "run_probe_command" in dump:
                # Still waiting on the host to start a probe's sandbox (namespaces) after
                # minutes: this machine cannot give the premise, which is not what is tested.
                pytest.skip(f"the host did not start a backend probe in time: {dump}")
            pytest.fail(f"the audit never got going (exit {proc.poll()}): {dump}")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err.decode()
    assert b"interrupted" in err
    deadline = time.monotonic() + 30  # a loaded CI machine; returns as soon as it holds
    while _leftovers(audit_tag) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _leftovers(audit_tag) == before


# One attack per kind of outside check: snapshot, canary, victim log, terminal, server count,
# survivor scan, spill file. Run unconfined, each must be seen escaping, or the audit could
# pass by checking nothing. (Not here: the session-log symlink and the terminal sequences,
# whose protection lives in the log opener and the CLI's renderer, so they hold unconfined
# too; their own unit tests plant the attack against those directly.)
DETECTOR_CANARIES = (
    "row1-overwrite",
    "row2-symlink-to-file",
    "row3-tmp-and-shm-private",
    "row4-hook-create",
    "row4-config-replaced-while-running",
    "row5-cat-files",
    "row5-secret-replaced-while-running",
    "row6-kill-term-victim",
    "row7-list-host-processes",
    "row9-write-terminal",
    "row10-tcp-loopback",
    "row10-unix-every-route-host-network",
    "row11-after-exit",
    "row13-spill-same-executor",
    "row13-spill-local-executor",
    "row13-credential-env-by-any-name",
    "row16-commondir",
    "row16-symlink-commit-editmsg",
    "row16-config-lock-race",
    "row16-deep-repository",
    "row16-created-repository",
    "row16-bare-repository",
    "row16-hook-chain-husky",
    "row16-hook-chain-pre-commit",
    "row16-hook-chain-lefthook",
    "row16-nested-repository",
    "row16-import-index-paths",
    "row16-import-cache-tree",
    "row16-import-planted-object",
    "row16-import-sequencer-opts",
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_detectors_see_each_attack_escape_when_nothing_confines_it() -> None:
    unconfined = SandboxMode.DANGER_FULL_ACCESS
    attacks = [
        dataclasses.replace(by_id(i), modes=frozenset({unconfined})) for i in DETECTOR_CANARIES
    ]

    async def run() -> list[CellResult]:
        async with AuditSession() as session:
            return await session.run_cells([(a, "bwrap", unconfined) for a in attacks])

    results = asyncio.run(run())
    not_seen = [
        f"{r.attack_id}: {r.verdict.value} {r.detail}"
        for r in results
        if r.verdict is not Verdict.ESCAPED
    ]
    assert not not_seen


@pytest.mark.parametrize(
    ("enforcement", "warnings", "verdict"),
    [
        ("full", (), Verdict.ESCAPED),
        # Partial for an unrelated reason proves nothing about this escape (a red team's).
        ("partial", ("cannot watch covers: inotify instances exhausted",), Verdict.ESCAPED),
        # Partial naming what escaped: the run declared it.
        ("partial", ("/aud/host/victim.txt is a symlink, which a command can re-point",),
         Verdict.NOT_ENFORCEABLE),
        # Partial with no reason of its own: the backend's, on this host.
        ("partial", (), Verdict.NOT_ENFORCEABLE),
    ],
)  # fmt: skip
async def test_only_a_partial_that_names_the_escape_makes_it_not_enforceable(
    enforcement: str, warnings: tuple[str, ...], verdict: Verdict, tmp_path: Path
) -> None:
    from bash_sandbox_audit.checks import verify_attack
    from bash_sandbox_audit.model import AttackEnv, AttackSetup, Outcome
    from bash_seam import BashRunResult, SandboxFacts
    from policies import SandboxMode

    def host_file_written(env: object, setup: object, outcome: object) -> list[str]:
        return ["/aud/host/victim.txt changed on the host"]

    env = AttackEnv(
        attack_id="row1-overwrite",
        backend="bwrap",
        mode=SandboxMode.WORKSPACE_WRITE,
        root=str(tmp_path),
        tmp_area=str(tmp_path / "t"),
        token="x",
        python=None,
        audit_pid=0,
        cleanup=None,  # type: ignore[arg-type]
    )
    facts = SandboxFacts.model_validate(
        {
            "mode": "workspace-write",
            "denied": False,
            "enforcement": enforcement,
            "backend": "bwrap",
            "warnings": warnings,
        }
    )
    result = BashRunResult.model_validate(
        {
            "exit_code": 0,
            "signal": None,
            "timed_out": False,
            "aborted": False,
            "timeout_ms": 1000,
            "stdout": {"text": "AUDIT-BEGIN\n"},
            "stderr": {"text": ""},
            "sandbox": facts.model_dump(),
        }
    )
    found = await verify_attack(host_file_written)(env, AttackSetup(), Outcome(result=result))
    assert found.verdict is verdict, found
