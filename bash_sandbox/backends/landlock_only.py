"""Landlock without namespaces: the fallback for hosts that cannot make any namespace.

Some hosts refuse every namespace to an unprivileged process (user namespaces disabled, a
container's seccomp profile), so neither bwrap nor the full Landlock backend can run. This
mode keeps what Landlock, dropped capabilities and seccomp can do alone, and says what it
cannot: every result it confines reports `enforcement="partial"`.

What it keeps: writes only to the sinks and the writable roots (plus a private TMPDIR);
reads everywhere except `deny_read` and the executor's spill files, by granting read on every
sibling along the path to each denied entry instead of on `/`; metadata changes refused
everywhere by seccomp (no mount namespace can make the host read-only); signals and abstract
unix sockets scoped (ABI 6); under `isolated`, TCP bind and connect refused by Landlock
(ABI 4) and unix sockets by seccomp.

What it cannot: protected names inside a writable root, UDP, a private /dev, /proc, or PID
namespace (a daemonised grandchild can outlive the run), and metadata changes in the
workspace (`chmod +x` fails).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from bash_local.spawn import SpawnPlan
from bash_sandbox.backends.base import BackendContext, BackendProbe, ConfinedPlan, LayerReport
from bash_sandbox.backends.landlock import (
    READ_RIGHTS,
    LandlockBackend,
    LandlockRuleset,
    build_ruleset_fd,
    confined_plan,
    render_landlock_ruleset,
)
from bash_sandbox.backends.linux_child import join_executor, supervise
from bash_sandbox.linux.child_setup import ChildSetup
from bash_sandbox.linux.seccomp import SeccompOptions, compile_seccomp
from policies import NetworkMode, SandboxEnforcement, SandboxPolicy
from policies.paths import within

NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1


def render_read_grants(
    denied: frozenset[str],
    listing: Mapping[str, tuple[str, ...]],
    links: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """Paths to grant read on so that everything but ``denied`` is readable. Pure.

    Landlock only adds rights, so instead of `/` it grants every entry beside the path to
    a denied one; the directories on that path themselves become unlistable. A rule follows
    symlinks, so an entry that is a link (``links`` maps it to its target) is granted only
    when its target neither holds nor lies inside a denied path.
    """
    if not denied:
        return ("/",)
    links = links or {}
    grants: list[str] = []

    def walk(directory: str) -> None:
        for name in listing.get(directory, ()):
            path = os.path.join(directory, name)
            if path in denied:
                continue
            target = links.get(path)
            if target is not None:
                if not any(within(d, target) or within(target, d) for d in denied):
                    grants.append(path)
                continue  # a link onto the way to a secret is left unreadable
            if any(within(d, path) for d in denied):
                walk(path)  # an ancestor of a denied path: descend, grant its other entries
            else:
                grants.append(path)

    walk("/")
    return tuple(grants)


def list_ancestors(
    denied: frozenset[str],
) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """The entries of every directory on the way to a denied path, as the host has them now,
    and the targets of those entries that are symlinks."""
    listing: dict[str, tuple[str, ...]] = {}
    links: dict[str, str] = {}
    for path in denied:
        parent = os.path.dirname(path)
        chain = [parent]
        while chain[-1] != "/":
            chain.append(os.path.dirname(chain[-1]))
        for directory in chain:
            if directory not in listing:
                try:
                    listing[directory] = tuple(sorted(os.listdir(directory)))
                except OSError:
                    listing[directory] = ()
                for name in listing[directory]:
                    entry = os.path.join(directory, name)
                    if os.path.islink(entry):
                        links[entry] = os.path.realpath(entry)
    return listing, links


def render_landlock_only_ruleset(
    policy: SandboxPolicy, abi: int, *, read_grants: tuple[str, ...], private_tmp: str | None
) -> LandlockRuleset:
    """The full backend's ruleset with `/` replaced by ``read_grants``, the private TMPDIR
    readable and writable, and, under an isolated network (ABI 4+), TCP bind/connect
    handled with no port allowed. Pure."""
    scratch = (private_tmp,) if private_tmp is not None else ()
    base = render_landlock_ruleset(policy, abi, scratch=scratch)
    rules = [(path, READ_RIGHTS & base.handled_fs) for path in read_grants]
    rules += [rule for rule in base.rules if rule[0] != "/"]
    handled_net = 0
    if policy.network is NetworkMode.ISOLATED and abi >= 4:
        handled_net = NET_BIND_TCP | NET_CONNECT_TCP
    return dataclasses.replace(base, rules=tuple(rules), handled_net=handled_net)


class LandlockOnlyBackend(LandlockBackend):
    """The Landlock backend where no namespace can be made; always reported partial."""

    folds_signals = False
    network_namespace = "none"
    mounts = False
    # Landlock alone refuses with EACCES; its only scratch dir is the private TMPDIR.
    write_refusals = frozenset({"EROFS", "EACCES"})
    scratch_is_private_tmpdir = True

    def wrap(self, policy: SandboxPolicy, plan: SpawnPlan, ctx: BackendContext) -> ConfinedPlan:
        denied = frozenset(
            os.path.realpath(p) for p in (*policy.deny_read, *ctx.view.hidden) if os.path.lexists(p)
        )
        ruleset = render_landlock_only_ruleset(
            policy,
            self.abi,
            read_grants=render_read_grants(denied, *list_ancestors(denied)),
            private_tmp=ctx.private_tmpdir,
        )
        rs = build_ruleset_fd(ruleset)
        setup = ChildSetup(record_only=ctx.record_only)
        join_executor(setup, policy, ctx)
        setup.drop_all_capabilities()
        setup.no_new_privs()
        setup.landlock_restrict(rs.fileno())  # type: ignore[attr-defined]
        setup.seccomp(
            compile_seccomp(
                SeccompOptions(
                    block_metadata=True,
                    block_fastopen=policy.network is not NetworkMode.HOST,
                )
            )
        )
        supervise(setup, ctx)
        env = dict(plan.env)
        env["TMPDIR"] = ctx.private_tmpdir
        return confined_plan(self.name, plan, rs, setup, argv=plan.argv, folds=False, env=env)

    def enforcement(self, policy: SandboxPolicy) -> SandboxEnforcement:
        return SandboxEnforcement.PARTIAL

    def layers(self, network: NetworkMode) -> tuple[LayerReport, ...]:
        return (
            LayerReport(
                "files",
                "partial",
                "Landlock rules; metadata refused everywhere by seccomp; protected names "
                "inside roots, private /tmp and git overlays not enforceable without mounts",
            ),
            LayerReport(
                "processes",
                "partial",
                "no capabilities, no_new_privs, Landlock scoping; no PID namespace, so a "
                "daemon can outlive the run and host processes are visible",
            ),
            LayerReport("network", "none", "host network requested")
            if network is NetworkMode.HOST
            else LayerReport(
                "network",
                "partial",
                "no network namespace: every connect() refused by the seccomp supervisor; "
                "UDP sendto without connect is not covered",
            ),
            LayerReport(
                "unix sockets",
                "full",
                "every connect() resolved by the seccomp supervisor; datagram unix sockets refused",
            ),
        )

    def probe(self, timeout_ms: int) -> BackendProbe:
        if self.abi <= 0:
            return BackendProbe(self.name, False, "kernel has no Landlock (ABI 0)")
        failure = self.confinement_failure(timeout_ms)
        if failure is not None:
            return BackendProbe(self.name, False, f"Landlock-only {failure}")
        return BackendProbe(
            self.name,
            True,
            f"no namespaces here: Landlock ABI {self.abi} alone, reported partial",
            version=f"ABI {self.abi} (no namespaces)",
            layers=self.layers(NetworkMode.ISOLATED),
            extra={"landlock_abi": self.abi, "namespaces": False},
        )
