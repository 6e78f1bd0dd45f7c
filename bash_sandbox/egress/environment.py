"""The environment variables that point a confined command's tools at the egress proxy.

The namespace has no route out, so a tool that ignores all of these reaches nothing; these
are the ones real tools read (``URL`` is ``http://bsx-<token>:x@127.0.0.1:PORT``):

- ``HTTP_PROXY`` / ``http_proxy``, ``HTTPS_PROXY`` / ``https_proxy``, ``ALL_PROXY`` /
  ``all_proxy``: curl, wget, Python (urllib, requests, httpx), Go, Ruby, git (through
  libcurl), Rust's reqwest, ...
- ``NO_PROXY`` / ``no_proxy``: loopback names and addresses, so a dev server on the
  sandbox's own loopback is reached directly (a ``localhost`` allowlist entry therefore
  reaches the host's loopback only for a client told to proxy loopback too).
- ``npm_config_proxy``, ``npm_config_https_proxy``, ``npm_config_noproxy``: npm, which reads
  its own config rather than the standard variables.
- ``PIP_PROXY``: pip's ``--proxy``.
- ``GIT_HTTP_PROXY_AUTHMETHOD=basic``: git otherwise waits for a 407 challenge before sending
  the token, and this proxy never challenges (an unauthenticated request is served under the
  executor's base list), so git's requests would not be attributed to the command.
- ``CARGO_HTTP_PROXY``: cargo's ``http.proxy``.
- ``NODE_USE_ENV_PROXY=1``: Node's built-in fetch and http honour the standard variables
  (Node 24 and later; older Node ignores it).
- ``JAVA_TOOL_OPTIONS``: ``-Dhttp(s).proxyHost/Port`` and ``-Dhttp.nonProxyHosts``. The JVM
  takes no credentials from properties, so JVM traffic is served under the base list.
"""

from __future__ import annotations

LOOPBACK_NO_PROXY = ("localhost", ".localhost", "127.0.0.1", "::1", "[::1]", "127.0.0.0/8")


def proxy_url(host: str, port: int, token: str | None) -> str:
    """The proxy's URL with the grant's token as userinfo (none: anonymous)."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    userinfo = f"bsx-{token}:x@" if token else ""
    return f"http://{userinfo}{authority}"


def proxy_environment(host: str, port: int, token: str | None) -> dict[str, str]:
    """Every variable in the module docstring, for the proxy at ``host:port``."""
    url = proxy_url(host, port, token)
    no_proxy = ",".join(LOOPBACK_NO_PROXY)
    java_host = f"[{host}]" if ":" in host else host
    java_options = " ".join(
        (
            f"-Dhttp.proxyHost={java_host}",
            f"-Dhttp.proxyPort={port}",
            f"-Dhttps.proxyHost={java_host}",
            f"-Dhttps.proxyPort={port}",
            "-Dhttp.nonProxyHosts=localhost|*.localhost|127.*|[::1]",
        )
    )
    env = {
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
        "npm_config_proxy": url,
        "npm_config_https_proxy": url,
        "npm_config_noproxy": no_proxy,
        "PIP_PROXY": url,
        "GIT_HTTP_PROXY_AUTHMETHOD": "basic",
        "CARGO_HTTP_PROXY": url,
        "NODE_USE_ENV_PROXY": "1",
        "JAVA_TOOL_OPTIONS": java_options,
    }
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = url
        env[name.lower()] = url
    return env
