"""Trust domains: which commands may share state that outlives a command.

Two commands share a private `/tmp`, `/dev/shm` or tool cache only when they have exactly
the same rights: the same writable roots, mode, network, allowlist, unix sockets,
`deny_read`, protected names and the names lifted from protection (`unprotected_paths`).
Sharing between commands of different widths is how code planted by a narrow command
(read-only, isolated) runs in a wider one (approved for the network, or another project's
roots): the wider one now gets its own. Sharing between equal commands stays, so
multi-step work (`make` then `./a.out` from /tmp, a warm pip cache) keeps working. The
workspace itself is the user's and stays shared: a narrower command can only write it when
it holds it as a writable root too.

The key is exact, not an order: a narrower call after a wider one gets a fresh scratch too
(sharing downwards would let the narrow call read what the wide one fetched). The resource
limits and, in read-only, the workspace root are not part of it: neither grants anything.

The tool cache homes are shared by every executor of the user, so their key also holds what
an executor's own settings add to each of its calls (`executor_reach`): the secrets its
proxy injects, the private addresses it lets names reach (`allow_private_domains`, `pin`, a
hosts file other than `/etc/hosts`). A field at its default is left out of the key, so the
homes made before a field was added keep their names.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import TYPE_CHECKING

from policies import SandboxPolicy

if TYPE_CHECKING:
    from bash_sandbox.config import SandboxBashConfig

_DEFAULT_HOSTS_FILE = "/etc/hosts"


def domain_fields(policy: SandboxPolicy, reach: str = "") -> dict[str, object]:
    """What decides a command's rights, order-free (the key's input, also shown to users).
    ``reach``: the executor's own widening (`executor_reach`), for the shared cache homes."""
    fields: dict[str, object] = {
        "mode": policy.mode.value,
        "writable_roots": sorted(policy.all_writable_roots()),
        "network": policy.network.value,
        "allow_domains": sorted(policy.allow_domains),
        "allow_unix_sockets": sorted(policy.allow_unix_sockets),
        "deny_read": sorted(policy.deny_read),
        "protected_paths": sorted(policy.protected_paths),
    }
    if policy.unprotected_paths:
        # What is lifted, as given: a lifted name outside `protected_paths` (a home's
        # `.gitconfig`, an `.envrc` chain file) leaves that list as it was, yet widens the
        # call; a narrow call's plant in /tmp would run in the wider one.
        fields["unprotected_paths"] = sorted(policy.unprotected_paths)
    if not policy.protect_hook_chain:
        # Off, a call may edit the files installed hooks run: code a call with it on plants
        # in /tmp or a cache would be written into a hook by the wider one.
        fields["protect_hook_chain"] = False
    if reach:
        fields["executor_reach"] = json.loads(reach)
    return fields


@functools.lru_cache(maxsize=64)
def domain_key(policy: SandboxPolicy, reach: str = "") -> str:
    """A short stable name for ``policy``'s trust domain (hex of SHA-256 of its fields).
    Kept per policy (a frozen value; each spawn asks three times)."""
    canonical = json.dumps(domain_fields(policy, reach), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def executor_reach(config: SandboxBashConfig) -> str:
    """What ``config`` adds to the rights of every call of its executor, as canonical JSON
    ("" for none): the credentials its proxy injects (which secret, for which domain, under
    which name; never the secret), the names it lets reach private addresses, its pins and
    a hosts file other than the system's."""
    reach: dict[str, object] = {}
    if config.credentials:
        reach["credentials"] = sorted(
            json.dumps(c.model_dump(mode="json"), sort_keys=True) for c in config.credentials
        )
    if config.allow_private_domains:
        reach["allow_private_domains"] = sorted(config.allow_private_domains)
    if config.pin:
        reach["pin"] = {name: sorted(addresses) for name, addresses in config.pin.items()}
    if config.hosts_file != _DEFAULT_HOSTS_FILE:
        reach["hosts_file"] = config.hosts_file
    return json.dumps(reach, sort_keys=True, separators=(",", ":")) if reach else ""
