"""Trust domains: which commands may share state that outlives a command.

Two commands share a private `/tmp`, `/dev/shm` or tool cache only when they have exactly
the same rights: the same writable roots, mode, network, allowlist, unix sockets,
`deny_read` and protected names. Sharing between commands of different widths is how code
planted by a narrow command (read-only, isolated) runs in a wider one (approved for the
network, or another project's roots): the wider one now gets its own. Sharing between equal
commands stays, so multi-step work (`make` then `./a.out` from /tmp, a warm pip cache)
keeps working. The workspace itself is the user's and stays shared: a narrower command can
only write it when it holds it as a writable root too.

The key is exact, not an order: a narrower call after a wider one gets a fresh scratch too
(sharing downwards would let the narrow call read what the wide one fetched). The resource
limits and, in read-only, the workspace root are not part of it: neither grants anything.
"""

from __future__ import annotations

import functools
import hashlib
import json

from policies import SandboxPolicy


def domain_fields(policy: SandboxPolicy) -> dict[str, object]:
    """What decides a command's rights, order-free (the key's input, also shown to users)."""
    return {
        "mode": policy.mode.value,
        "writable_roots": sorted(policy.all_writable_roots()),
        "network": policy.network.value,
        "allow_domains": sorted(policy.allow_domains),
        "allow_unix_sockets": sorted(policy.allow_unix_sockets),
        "deny_read": sorted(policy.deny_read),
        "protected_paths": sorted(policy.protected_paths),
    }


@functools.lru_cache(maxsize=64)
def domain_key(policy: SandboxPolicy) -> str:
    """A short stable name for ``policy``'s trust domain (hex of SHA-256 of its fields).
    Kept per policy (a frozen value; each spawn asks three times)."""
    canonical = json.dumps(domain_fields(policy), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]
