"""What the executor checks about its egress settings before a spawn, and where the
configured credentials' secrets live (so that no command can read them there).

Kept outside `bash_sandbox.egress` (which loads the proxy and its TLS stack): the executor
consults this for every policy it stamps, with or without an allowlist.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from policies import SandboxPolicy
from policies.egress import EgressCredential


def credential_files(credentials: Sequence[EgressCredential]) -> tuple[str, ...]:
    """The ``file:`` sources, for `deny_read` (both the name given and its real path)."""
    out: dict[str, None] = {}
    for credential in credentials:
        kind, _, path = credential.source.partition(":")
        if kind == "file":
            out[os.path.normpath(path)] = None
            out[os.path.realpath(path)] = None
    return tuple(out)


def exposed_credential_files(
    credentials: Sequence[EgressCredential], deny_read: Sequence[str]
) -> list[str]:
    """The ``file:`` sources a policy with ``deny_read`` would let a command read."""
    denied = [os.path.normpath(p) for p in deny_read]

    def hidden(path: str) -> bool:
        return any(path == d or path.startswith(d.rstrip("/") + "/") for d in denied)

    return [
        path
        for path in credential_files(credentials)
        if not hidden(path) and path == os.path.realpath(path)
    ]


def egress_setting_problem(
    policy: SandboxPolicy,
    *,
    credentials: Sequence[EgressCredential],
    hosts_file: str | None,
) -> str | None:
    """Why this executor's egress settings cannot be used with ``policy`` (an allowlist
    whose secrets or pins a command could read or write), or None."""
    if not policy.allow_domains:
        return None
    exposed = exposed_credential_files(credentials, policy.deny_read)
    if exposed:
        return (
            f"the credential file(s) {exposed} are not in this call's deny_read: a command "
            "could read the secret; keep them in deny_read"
        )
    if hosts_file is not None:
        top = _writable_root_holding(hosts_file, policy)
        if top is not None:
            return (
                f"hosts_file {hosts_file} lies in the writable root {top}: a command could "
                "pin any name to any address; keep it outside every writable root"
            )
    for credential in credentials:
        bundle = credential.upstream_ca_file
        top = _writable_root_holding(bundle, policy) if bundle else None
        if top is not None:
            return (
                f"the upstream_ca_file {bundle} of {credential.domain} lies in the writable "
                f"root {top}: a command could make the proxy trust its own server with the "
                "secret; keep it outside every writable root"
            )
    return None


def _writable_root_holding(path: str, policy: SandboxPolicy) -> str | None:
    real = os.path.realpath(path)
    for root in policy.all_writable_roots():
        top = os.path.realpath(root)
        if real == top or real.startswith(top.rstrip("/") + "/"):
            return top
    return None
