"""The executor's egress proxy, made from its config: the allowlist, the operator's pins and
hosts file in front of DNS, the private-range names, and the credentials to inject."""

from __future__ import annotations

import socket

from bash_sandbox.config import SandboxBashConfig
from bash_sandbox.egress.credentials import credential_vault
from bash_sandbox.egress.proxy import EgressProxy
from bash_sandbox.egress.resolver import PinnedResolver, Resolver


def executor_proxy(
    listener: socket.socket,
    config: SandboxBashConfig,
    bundle_dir_fd: int,
    dns: Resolver | None = None,
) -> EgressProxy:
    """An unstarted proxy on ``listener`` for ``config``; ``bundle_dir_fd`` is the private
    /tmp the credentials' trust bundle goes to, ``dns`` replaces the host's resolver (tests).
    Raises `CredentialError` (a `ValueError`) for a secret that cannot be read."""
    resolver = PinnedResolver(config.pin, hosts_file=config.hosts_file, fallback=dns)
    return EgressProxy(
        listener,
        allow=tuple(config.allow_domains),
        resolver=resolver,
        allow_private=tuple(config.allow_private_domains),
        credentials=credential_vault(config.credentials, bundle_dir_fd),
    )
