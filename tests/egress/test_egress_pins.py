"""Operator-pinned answers are honoured, DNS is not trusted: end to end through the executor.

`make_pinned_executor` (conftest): a temp hosts file (never the host's /etc/hosts) pins
`registry.test` to the host's 127.0.0.1, where a real upstream listens; a stub resolver
plays DNS (unpinned) for the other names. The sandboxed curl's fate is judged from
outside: the upstream's request log and the result's facts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bash_seam import DenialEvidence, DenialKind
from tests.egress.conftest import ExecutorFactory
from tests.egress.servers import UpstreamServer
from tests.egress.test_egress_sandbox import curl, facts_denials, sh, status_and_body


async def test_a_hosts_file_pin_to_loopback_is_honoured_and_named(
    make_pinned_executor: ExecutorFactory, site: UpstreamServer, hosts_file: Path
) -> None:
    ex = make_pinned_executor(allow_domains=("registry.test",))
    result = await sh(ex, curl(site.url("registry.test", "/hello.txt")))
    assert status_and_body(result) == ("200", "hello through the proxy\n"), result.stderr.text
    assert [r.path for r in site.requests] == ["/hello.txt"]
    assert result.sandbox is not None and facts_denials(result) == ()
    assert any(
        "registry.test reached at 127.0.0.1" in w and str(hosts_file) in w
        for w in result.sandbox.warnings
    ), result.sandbox.warnings


async def test_a_config_pin_is_honoured_without_a_hosts_file(
    make_pinned_executor: ExecutorFactory, site: UpstreamServer
) -> None:
    ex = make_pinned_executor(
        allow_domains=("loop.test",), hosts_file=None, pin={"loop.test": "127.0.0.1"}
    )
    result = await sh(ex, curl(site.url("loop.test", "/hello.txt")))
    assert status_and_body(result)[0] == "200", result.stderr.text
    assert result.sandbox is not None
    assert any("pinned by pin" in w for w in result.sandbox.warnings)


async def test_dns_answers_in_private_loopback_or_metadata_ranges_are_refused(
    make_pinned_executor: ExecutorFactory, site: UpstreamServer
) -> None:
    ex = make_pinned_executor(allow_domains=("lan.test", "loop.test", "meta.test"))
    lan = await sh(ex, curl(site.url("lan.test", "/hello.txt"), "--fail-with-body"))
    status, body = status_and_body(lan)
    assert status == "403"
    assert "10.9.8.7" in body and "allow_private_domains" in body
    (denial,) = facts_denials(lan)
    assert (denial.kind, denial.target, denial.evidence) == (
        DenialKind.NETWORK_CONNECT,
        f"lan.test:{site.port}",
        DenialEvidence.PROXY,
    )
    assert "allow_private_domains" in denial.reason
    # DNS to the host's loopback (where the upstream really listens) and to metadata:
    # refused, and only a pin is offered as the way.
    for name in ("loop.test", "meta.test"):
        result = await sh(ex, curl(site.url(name, "/hello.txt"), "--fail-with-body"))
        status, body = status_and_body(result)
        assert status == "403", name
        assert "pin = {" in body and "allow_private_domains" not in body, body
    assert site.requests == []


async def test_allow_private_domains_never_opens_loopback_from_dns(
    make_pinned_executor: ExecutorFactory, site: UpstreamServer
) -> None:
    # (A private answer admitted by allow_private_domains is tested in admission: here the
    # proxy would really connect to it, and the tests send nothing off this host.)
    ex = make_pinned_executor(allow_domains=("loop.test",), allow_private_domains=("loop.test",))
    loop = await sh(ex, curl(site.url("loop.test", "/hello.txt"), "--fail-with-body"))
    assert status_and_body(loop)[0] == "403"
    assert site.requests == []


async def test_a_hosts_file_commands_could_write_is_refused(
    make_pinned_executor: ExecutorFactory, tmp_path: Path
) -> None:
    from bash_sandbox import SandboxUnavailableError
    from bash_seam import BashExecRequest

    planted = tmp_path / "ws" / "hosts"
    planted.write_text("127.0.0.1 registry.test\n")
    ex = make_pinned_executor(
        allow_domains=("registry.test",), hosts_file=str(planted), mode="workspace-write"
    )
    with pytest.raises(SandboxUnavailableError, match="lies in the writable root"):
        await ex.run(ex.resolve(BashExecRequest(command="true")))
