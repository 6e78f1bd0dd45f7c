"""`bash-sandbox doctor`: the host report, end to end and from fake probes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from cli_probes import HAS_BWRAP

from bash_sandbox.backends.base import BackendProbe, LayerReport
from bash_sandbox.backends.landlock import landlock_abi
from bash_sandbox.cli import main
from bash_sandbox.cli.doctor import (
    LAYERS,
    Check,
    DoctorReport,
    HostFacts,
    backend_status,
    collect_report,
    render_text,
)
from bash_sandbox.config import SandboxBashConfig
from policies import NetworkMode

on_linux_with_bwrap = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and HAS_BWRAP), reason="needs Linux with bwrap"
)


def test_json_report_has_every_backend_layer_and_host_fact(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["doctor", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == (0 if data["usable"] else 1)
    assert [b["name"] for b in data["backends"]] == ["bwrap", "landlock", "seatbelt"]
    for backend in data["backends"]:
        assert set(backend) >= {"usable", "detail", "binary", "version", "layers"}
        assert [layer["layer"] for layer in backend["layers"]] == list(LAYERS)
        for layer in backend["layers"]:
            assert layer["enforcement"] in ("full", "partial", "none") and layer["how"]
    host = data["host"]
    assert host["landlock_abi"] == landlock_abi()
    assert set(host["namespaces"]) == {"available", "detail"}
    assert data["network"] == "isolated"


@on_linux_with_bwrap
def test_on_this_linux_host_bwrap_and_landlock_are_usable_and_seatbelt_is_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    backends = {b["name"]: b for b in data["backends"]}
    assert backends["bwrap"]["usable"] and backends["bwrap"]["binary"]
    assert backends["bwrap"]["version"]
    assert backends["landlock"]["usable"]
    assert not backends["seatbelt"]["usable"]
    assert "macOS" in backends["seatbelt"]["detail"]
    assert data["chosen_backend"] == "bwrap"
    assert data["host"]["namespaces"]["available"]
    bwrap_layers = {layer["layer"]: layer["enforcement"] for layer in backends["bwrap"]["layers"]}
    assert bwrap_layers == dict.fromkeys(LAYERS, "full")


def test_human_report_is_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "Landlock ABI:" in out and "namespaces:" in out
    assert "chosen backend:" in out
    header = next(line for line in out.splitlines() if line.startswith("BACKEND"))
    assert header.split() == ["BACKEND", "USABLE", "ENFORCES", "BINARY", "VERSION", "DETAIL"]
    for name in ("bwrap", "landlock", "seatbelt"):
        assert any(line.startswith(name + " ") for line in out.splitlines())


def test_doctor_network_host_reports_the_network_layer_as_not_enforced(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["doctor", "--json", "--network", "host"])
    data = json.loads(capsys.readouterr().out)
    assert data["network"] == "host"
    for backend in data["backends"]:
        if backend["usable"] and backend["name"] != "seatbelt":
            net = next(layer for layer in backend["layers"] if layer["layer"] == "network")
            assert net["enforcement"] == "none"


# -- what the executor would do, and the pure parts ---------------------------------------------


@on_linux_with_bwrap
def test_doctor_reports_the_runner_the_executor_would_use(tmp_path: Path) -> None:
    # A runner replaces bwrap in the executor; doctor must say so instead of "bwrap".
    runner = tmp_path / "my-bwrap"
    runner.write_text('#!/bin/sh\nexec /usr/bin/bwrap "$@"\n')
    runner.chmod(0o755)
    config = SandboxBashConfig(runner_command=[str(runner)])
    report = collect_report(config, network=NetworkMode.ISOLATED, version="0")
    assert report.chosen_backend == "runner"
    assert report.backends[0].name == "runner" and report.backends[0].usable


@on_linux_with_bwrap
def test_doctor_reports_a_refusal_when_the_configured_backend_cannot_run(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\nexit 7\n")
    broken.chmod(0o755)
    report = collect_report(
        SandboxBashConfig(runner_command=[str(broken)]), network=NetworkMode.ISOLATED, version="0"
    )
    assert report.chosen_backend is None and not report.usable
    assert report.refusal and "runner" in report.refusal


BASE_LAYERS = tuple(LayerReport(name, "full", name) for name in LAYERS)


def host() -> HostFacts:
    return HostFacts(
        platform="linux",
        kernel="6.x",
        landlock_abi=7,
        namespaces=Check(available=True, detail="ok"),
    )


def test_an_unusable_backend_reports_every_layer_as_none() -> None:
    status = backend_status(BackendProbe("bwrap", False, "no bwrap"), ())
    assert status.enforcement is None
    assert {layer.enforcement for layer in status.layers} == {"none"}
    assert all(layer.how.startswith("backend unusable") for layer in status.layers)


def test_a_layer_the_backend_does_not_report_is_none_and_makes_it_partial() -> None:
    status = backend_status(BackendProbe("x", True, "ok"), BASE_LAYERS[:2])
    assert [layer.enforcement for layer in status.layers] == ["full", "full", "none", "none"]
    assert status.enforcement == "partial"


def test_render_text_lists_usable_backends_layers_and_loud_notes() -> None:
    report = DoctorReport(
        version="9.9",
        network=NetworkMode.ISOLATED,
        host=host(),
        backends=(
            backend_status(BackendProbe("bwrap", True, "ok"), BASE_LAYERS),
            backend_status(BackendProbe("seatbelt", False, "macOS only"), ()),
        ),
        chosen_backend="bwrap",
        degraded="weaker than it should be",
        notes=("workspace config is not read",),
    )
    text = render_text(report)
    assert text.startswith("bash-sandbox 9.9 doctor: linux, kernel 6.x\n")
    assert "bwrap layers:" in text and "seatbelt layers:" not in text
    assert "chosen backend:    bwrap" in text
    assert "WARNING: weaker than it should be" in text
    assert "note: workspace config is not read" in text
    assert "compiled parts:    none (the Python paths serve" in text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the compiled parts are Linux's")
def test_doctor_names_the_compiled_parts_this_install_has(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bash_sandbox.linux import compiled_child, fast_writes, sandbox_init

    built = [
        name
        for name, lib in (
            ("write-watch fast path", fast_writes.library()),
            ("spawn helper child", compiled_child.built()),
            ("landlock init", sandbox_init.built()),
        )
        if lib is not None
    ]
    if os.environ.get("CI"):
        assert len(built) == 3  # CI has a C compiler: the package's build made all three
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["host"]["compiled"] == built


@on_linux_with_bwrap
def test_doctor_shows_the_configs_limits_allowlist_and_where_config_comes_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        'allow-domains = ["pypi.org", "*.npmjs.org"]\n'
        "[limits]\nmemory_bytes = 1073741824\nprocesses = 100\n"
    )
    config.chmod(0o600)
    assert main(["doctor", "--json", "--config", str(config)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["allow_domains"] == ["pypi.org", "*.npmjs.org"]
    limits = {entry["limit"]: entry for entry in data["limits"]}
    assert limits["memory"]["value"] == 1 << 30 and limits["processes"]["value"] == 100
    assert set(limits) == {
        "memory", "processes", "cpu", "cpu-time", "open-files", "tmp-space", "shm-space"
    }  # fmt: skip
    assert all(entry["mechanism"] and entry["detail"] for entry in data["limits"])
    assert any(str(config) in note for note in data["notes"])
    assert any("pyproject.toml is never read" in note for note in data["notes"])
    assert main(["doctor", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "egress allowlist: pypi.org, *.npmjs.org" in out
    assert "limits per command (bwrap):" in out
    memory = next(line for line in out.splitlines() if line.strip().startswith("memory "))
    assert "1 GiB" in memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the state's place is Linux's")
def test_doctor_says_where_executor_state_goes_and_whether_git_overlays_fit_there(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from bash_sandbox import state
    from bash_sandbox.linux import dir_watch

    assert main(["doctor", "--json"]) in (0, 1)
    host = json.loads(capsys.readouterr().out)["host"]
    place = Path(host["state"])
    assert place.is_dir() and place.stat().st_uid == os.geteuid()
    assert place == Path(state.state_parent(()))  # where an executor would put it
    assert "MiB free" in host["state_detail"] and "cannot" not in host["state_detail"]
    # A place on overlayfs (a container's disk, with /dev/shm unusable): said, with the fix.
    monkeypatch.setattr(state, "state_parent", lambda roots: str(tmp_path))
    monkeypatch.setattr(dir_watch, "filesystem_type", lambda path: 0x794C7630)
    assert main(["doctor"]) in (0, 1)
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if ln.startswith("executor state:"))
    assert str(tmp_path) in line and "overlayfs" in line
    assert "cannot hold git overlays" in line and "TMPDIR" in line
