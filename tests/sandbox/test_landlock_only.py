"""Landlock alone (no namespace can be made): what it still enforces, and that it says partial."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.backends.landlock import READ_RIGHTS
from bash_sandbox.backends.landlock_only import (
    NET_BIND_TCP,
    NET_CONNECT_TCP,
    LandlockOnlyBackend,
    list_ancestors,
    render_landlock_only_ruleset,
    render_read_grants,
)
from bash_sandbox.selection import Candidates
from bash_seam import BashExecRequest
from policies import SandboxPolicy
from tests.facts.evidence import file_refusal_reported
from tests.sandbox.conftest import require_backend

LISTING = {
    "/": ("bin", "home", "tmp"),
    "/home": ("alice", "bob"),
    "/home/alice": (".bashrc", ".ssh", "proj"),
}


def test_read_grants_cover_every_sibling_on_the_way_to_a_denied_path() -> None:
    grants = render_read_grants(frozenset({"/home/alice/.ssh"}), LISTING)
    assert grants == ("/bin", "/home/alice/.bashrc", "/home/alice/proj", "/home/bob", "/tmp")
    assert render_read_grants(frozenset(), LISTING) == ("/",)


def test_a_symlink_onto_the_way_to_a_secret_is_never_granted() -> None:
    listing = {"/": ("home", "h", "x"), "/home": ("alice",), "/home/alice": (".ssh", "p")}
    links = {"/h": "/home/alice", "/x": "/usr"}
    grants = render_read_grants(frozenset({"/home/alice/.ssh"}), listing, links)
    assert grants == ("/home/alice/p", "/x")


def test_ruleset_replaces_root_read_and_handles_tcp_only_when_isolated() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/srv", deny_read=())
    rs = render_landlock_only_ruleset(policy, 7, read_grants=("/bin", "/tmp"), private_tmp=None)
    assert rs.rules[:2] == (("/bin", READ_RIGHTS), ("/tmp", READ_RIGHTS))
    assert all(path != "/" for path, _ in rs.rules)
    assert rs.handled_net == NET_BIND_TCP | NET_CONNECT_TCP
    host = SandboxPolicy(mode="read-only", workspace_root="/srv", network="host", deny_read=())
    assert (
        render_landlock_only_ruleset(host, 7, read_grants=("/",), private_tmp=None).handled_net == 0
    )


def test_list_ancestors_reads_only_the_directories_on_the_way(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "secret").write_text("s")
    (tmp_path / "b").mkdir()
    os.symlink(tmp_path / "a", tmp_path / "link")
    listing, links = list_ancestors(frozenset({str(tmp_path / "a" / "secret")}))
    assert links[str(tmp_path / "link")] == str(tmp_path / "a")
    assert listing[str(tmp_path)] == ("a", "b", "link")
    assert listing[str(tmp_path / "a")] == ("secret",)
    assert "/" in listing


async def test_landlock_alone_confines_and_reports_partial(tmp_path: Path) -> None:
    require_backend("landlock")
    backend = LandlockOnlyBackend()
    probe = backend.probe(10_000)
    assert probe.usable, probe.detail
    ws = tmp_path / "ws"
    ws.mkdir()
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "key").write_text("TOPSECRET")
    outside = tmp_path / "outside.txt"
    outside.write_text("host")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        async with SandboxBashExecutor(
            backend="landlock",
            mode="workspace-write",
            workspace_root=str(ws),
            deny_read=(str(secrets),),
        ) as ex:
            # As on a host without namespaces.
            ex._selector._candidates = Candidates((backend,))
            result = await ex.run(
                ex.resolve(
                    BashExecRequest(
                        command=f"echo in > in.txt; echo out > {outside}; chmod 777 {outside}; "
                        f"cat {secrets}/key; "
                        f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED",
                        workdir=str(ws),
                    )
                )
            )
        with pytest.raises(TimeoutError):
            server.accept()  # nothing reached the host server
    finally:
        server.close()
    assert (ws / "in.txt").read_text() == "in\n"
    assert outside.read_text() == "host"
    assert os.stat(outside).st_mode & 0o777 != 0o777
    assert "TOPSECRET" not in result.stdout.text, (result.stderr.text, result.sandbox)
    assert "CONNECTED" not in result.stdout.text
    assert result.sandbox is not None
    assert (result.sandbox.backend, result.sandbox.enforcement) == ("landlock", "partial")
    # The write and the read of the secret are refused (Landlock's EACCES, no read-only
    # mount for the write watch to judge); the output names both.
    assert file_refusal_reported(result.sandbox, str(outside), witnessable=False)
    assert file_refusal_reported(result.sandbox, str(secrets / "key"), witnessable=False)
