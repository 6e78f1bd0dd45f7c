"""The executor's one egress proxy listens in every trust domain's own network namespace
(red team round 7, B F2: the isolated loopback is per trust domain), on both backends: a
read-only and a workspace-write call, each in its own namespace, both reach the allowlist,
judged by the upstream's own request log."""

from __future__ import annotations

from tests.egress.servers import UpstreamServer
from tests.egress.test_egress_sandbox import (  # noqa: F401 - fixtures
    ExecutorFactory,
    backend,
    curl,
    make_executor,
    paths_seen,
    sh,
    status_and_body,
    with_allowed,
    workspace,
)


async def test_calls_of_two_trust_domains_each_reach_the_allowlist_from_their_own_loopback(
    make_executor: ExecutorFactory,  # noqa: F811
    site: UpstreamServer,
) -> None:
    ex = make_executor()
    narrow = with_allowed(ex, mode="read-only")
    wide = with_allowed(ex, mode="workspace-write")
    seen: list[str] = []
    for policy, path in ((narrow, "/hello.txt?narrow"), (wide, "/hello.txt?wide")):
        # The namespace on stderr, the body and status on stdout.
        command = curl(site.url("pkg.test", path)) + "; readlink /proc/self/ns/net >&2"
        result = await sh(ex, command, policy=policy)
        assert status_and_body(result) == ("200", "hello through the proxy\n"), result.stderr.text
        seen.append(result.stderr.text)
    assert seen[0] != seen[1]  # two namespaces, one proxy address in each
    assert paths_seen(site) == ["/hello.txt?narrow", "/hello.txt?wide"]
