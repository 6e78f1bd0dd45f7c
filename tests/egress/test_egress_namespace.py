"""The proxy listens only inside the namespace it was made in, and is the only way out.

As the executor will: a namespace with only `lo` (made by a short-lived thread), the
listening socket created inside it, the proxy's upstream sockets in the host namespace.
"""

from __future__ import annotations

import socket

import pytest

from tests.egress.conftest import Namespace, ProxyFactory, clean_env
from tests.egress.servers import UpstreamServer, listening_socket_in_netns


def test_the_proxy_is_reachable_inside_its_namespace_only(
    make_proxy: ProxyFactory, namespace: Namespace, site: UpstreamServer, tmp_path: object
) -> None:
    proxy = make_proxy(listen=listening_socket_in_netns(namespace.fd))
    grant = proxy.register(("pkg.test",))
    port = proxy.address[1]
    # From the host namespace: nothing listens at that port on the host's loopback.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    # From inside: through the proxy to the upstream on the host's loopback.
    env = clean_env(tmp_path, grant.environment())  # type: ignore[arg-type]
    inside = namespace.run(
        ["curl", "-sS", "--max-time", "20", site.url("pkg.test", "/hello.txt")], env
    )
    assert inside.stdout.strip() == "hello through the proxy", inside.stderr
    assert len(site.requests) == 1
    # A client that ignores the proxy reaches nothing: the upstream is not on this loopback.
    direct = namespace.run(
        [
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--noproxy",
            "*",
            f"http://127.0.0.1:{site.port}/hello.txt",
        ],
        env,
    )
    assert direct.returncode != 0
    assert len(site.requests) == 1
