"""`bash-sandbox doctor`: the host report, end to end and from fake probes."""

from __future__ import annotations

import json
import sys

import pytest
from cli_probes import HAS_BWRAP

from bash_sandbox.backends.base import BackendProbe, LayerReport
from bash_sandbox.backends.landlock import landlock_abi
from bash_sandbox.cli import main
from bash_sandbox.cli.doctor import (
    LAYERS,
    BackendStatus,
    Check,
    HostFacts,
    build_report,
    render_text,
)
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
    assert set(host["user_namespaces"]) == {"available", "detail"}
    assert set(host["network_namespace"]) == {"available", "detail"}
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
    assert data["auto_backend"] == "bwrap"
    assert data["host"]["user_namespaces"]["available"]
    assert data["host"]["network_namespace"]["available"]
    bwrap_layers = {layer["layer"]: layer["enforcement"] for layer in backends["bwrap"]["layers"]}
    assert bwrap_layers == dict.fromkeys(LAYERS, "full")


def test_human_report_is_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "Landlock ABI:" in out and "user namespaces:" in out
    assert "network namespace:" in out
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


# -- the report from fake probes (pure) --------------------------------------------------------


def host(*, abi: int = 7, netns: bool = True) -> HostFacts:
    return HostFacts(
        platform="linux",
        kernel="6.x",
        landlock_abi=abi,
        user_namespaces=Check(available=True, detail="ok"),
        network_namespace=Check(available=netns, detail="ok" if netns else "EPERM"),
    )


BASE_LAYERS = (LayerReport("files", "full", "f"), LayerReport("processes", "full", "p"))


def probe(
    name: str,
    usable: bool = True,
    layers: tuple[LayerReport, ...] = BASE_LAYERS,
) -> BackendProbe:
    return BackendProbe(name, usable, "detail", layers=layers if usable else ())


def layers_of(backend: BackendStatus) -> dict[str, str]:
    return {layer.layer: layer.enforcement for layer in backend.layers}


def test_unusable_backend_reports_every_layer_as_none() -> None:
    report = build_report(
        [probe("bwrap", usable=False)], host(), network=NetworkMode.ISOLATED, version="0"
    )
    (bwrap,) = report.backends
    assert not report.usable and report.auto_backend is None
    assert bwrap.enforcement is None
    assert layers_of(bwrap) == dict.fromkeys(LAYERS, "none")
    assert all(layer.how.startswith("backend unusable") for layer in bwrap.layers)


def test_bwrap_without_a_shared_namespace_still_isolates_with_unshare_net() -> None:
    report = build_report(
        [probe("bwrap")], host(netns=False), network=NetworkMode.ISOLATED, version="0"
    )
    (bwrap,) = report.backends
    net = bwrap.layers[LAYERS.index("network")]
    assert net.enforcement == "full" and "--unshare-net" in net.how
    assert bwrap.enforcement == "full"


def test_landlock_without_a_namespace_cannot_isolate_the_network() -> None:
    report = build_report(
        [probe("bwrap", usable=False), probe("landlock")],
        host(netns=False),
        network=NetworkMode.ISOLATED,
        version="0",
    )
    landlock = report.backends[1]
    assert layers_of(landlock)["network"] == "none"
    assert landlock.enforcement == "partial"
    assert report.auto_backend == "landlock"


def test_probe_layer_reports_win_over_the_defaults() -> None:
    own = (*BASE_LAYERS, LayerReport("network", "partial", "the backend's own words"))
    report = build_report(
        [probe("bwrap", layers=own)], host(), network=NetworkMode.ISOLATED, version="0"
    )
    net = report.backends[0].layers[LAYERS.index("network")]
    assert (net.enforcement, net.how) == ("partial", "the backend's own words")


def test_host_network_leaves_network_and_unix_sockets_unenforced() -> None:
    report = build_report(
        [probe("bwrap"), probe("landlock")], host(abi=7), network=NetworkMode.HOST, version="0"
    )
    bwrap, landlock = report.backends
    assert layers_of(bwrap)["network"] == "none" and layers_of(bwrap)["unix sockets"] == "none"
    # Landlock ABI 6+ still scopes abstract unix sockets to the sandbox.
    assert layers_of(landlock)["unix sockets"] == "partial"


def test_render_text_lists_usable_backends_layers() -> None:
    report = build_report(
        [probe("bwrap"), probe("seatbelt", usable=False)],
        host(),
        network=NetworkMode.ISOLATED,
        version="9.9",
    )
    text = render_text(report)
    assert text.startswith("bash-sandbox 9.9 doctor: linux, kernel 6.x\n")
    assert "bwrap layers:" in text and "seatbelt layers:" not in text
    assert "auto backend:       bwrap" in text
