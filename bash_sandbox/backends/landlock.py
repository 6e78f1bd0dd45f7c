"""Landlock backend: a pure `policy -> ruleset` renderer and the child steps that apply it.

Semantics: every filesystem right the running ABI knows is handled; reads and execution
are granted on `/`, writes only on `/dev/null`-like sinks, the executor's private /tmp,
/dev/shm and ptys, and (workspace-write) the writable roots. Signals and abstract unix
sockets are scoped to the sandbox (ABI 6).

What Landlock alone cannot do is layered on in the child (`landlock_child_setup`), in this
order (each step needs the privileges the next ones drop):

1. the shared prefix (`linux_child.join_executor`): die with the executor, join the
   executor's user, mount and (isolated) network namespaces, take the limits;
2. new mount, PID, IPC and UTS namespaces;
3. the shared view (`view_steps.apply_view`): every mount private, the git overlays, the
   whole tree read-only, nosuid and nodev (so metadata changes Landlock does not govern,
   chmod, chown, xattrs, utimes, fail with EROFS outside the roots), then shadows, the
   private /tmp, writable roots bound back writable, protected names, covers, and a fresh
   /dev (no host terminals, consoles, input devices or disks) with the executor's /dev/shm
   and ptys, read-only; the working directory re-entered;
4. fork: the parent stays as a waiter (exits with the command's status); the child is PID 1
   of the new PID namespace and mounts its own /proc (only the command's processes);
5. drop every capability (bounding set included) and set `no_new_privs`;
6. `landlock_restrict_self`;
7. seccomp: the refusal filter, then the supervised filter (`linux_child.supervise`).

PID 1 then execs an init that runs the command as its child and exits with its status,
because PID 1 ignores signals sent from inside its namespace (`kill $$` must still work):
the compiled one (`linux/sandbox_init.py`) through the spawn helper where it was built, else
a bash.
Like bwrap, a command killed by signal n therefore reports exit 128+n.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from bash_local.spawn import SpawnPlan
from bash_sandbox.backends.base import (
    BackendContext,
    BackendProbe,
    ConfinedPlan,
    LayerReport,
    MountTable,
    NetworkNamespaceUse,
    SandboxBackend,
    run_probe_command,
)
from bash_sandbox.backends.linux_child import (
    join_executor,
    make_descriptor_room,
    probe_context,
    supervise,
)
from bash_sandbox.backends.mount_plan import MountOp, render_mount_plan
from bash_sandbox.backends.view_steps import apply_view, read_mount_table
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.linux import sandbox_init
from bash_sandbox.linux.child_setup import (
    CLONE_NEWIPC,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    ChildSetup,
    mount_setattr_available,
)
from bash_sandbox.linux.sandbox_init import INIT_FD
from bash_sandbox.linux.seccomp import SeccompOptions, compile_seccomp
from policies import NetworkMode, SandboxEnforcement, SandboxMode, SandboxPolicy
from policies.paths import within

# Access-right bits of linux/landlock.h (mirrored so the renderer stays pure and testable).
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13
TRUNCATE = 1 << 14
IOCTL_DEV = 1 << 15
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

_FS_BY_ABI = {
    1: (1 << 13) - 1,
    2: (1 << 14) - 1,
    3: (1 << 15) - 1,
    4: (1 << 15) - 1,
    5: (1 << 16) - 1,
}
READ_RIGHTS = EXECUTE | READ_FILE | READ_DIR
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
WRITE_RIGHTS = (
    WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE
)
SINK_RIGHTS = WRITE_FILE | TRUNCATE | IOCTL_DEV
WRITABLE_SINKS = ("/dev/null", "/dev/zero", "/dev/full")


def handled_fs_for_abi(abi: int) -> int:
    """Every filesystem right the ABI knows (ABI 5 added the last one we use)."""
    return _FS_BY_ABI[min(max(abi, 1), 5)]


@dataclass(frozen=True)
class LandlockRuleset:
    """A rendered ruleset: handled rights, scopes, and `(path, rights)` grants in order."""

    abi: int
    handled_fs: int
    scoped: int
    rules: tuple[tuple[str, int], ...]
    # TCP bind/connect handled with no port allowed (only without a network namespace).
    handled_net: int = 0


def render_landlock_ruleset(
    policy: SandboxPolicy,
    abi: int,
    *,
    scratch: tuple[str, ...] = (),
    ptys: str | None = None,
) -> LandlockRuleset:
    """The ruleset for ``policy`` on a kernel with Landlock ``abi``. Pure.

    ``scratch`` are the private /tmp and /dev/shm (writable in every confined mode: they are
    the executor's, never the host's); ``ptys`` the private devpts.
    """
    handled = handled_fs_for_abi(abi)
    rules: list[tuple[str, int]] = [("/", READ_RIGHTS)]
    rules += [(sink, SINK_RIGHTS) for sink in WRITABLE_SINKS]
    rules += [(path, READ_RIGHTS | WRITE_RIGHTS) for path in scratch]
    if ptys is not None:
        rules.append((ptys, READ_FILE | READ_DIR | WRITE_FILE | IOCTL_DEV))
    if policy.mode is SandboxMode.WORKSPACE_WRITE:
        rules += [(root, WRITE_RIGHTS) for root in policy.all_writable_roots()]
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    return LandlockRuleset(
        abi=abi,
        handled_fs=handled,
        scoped=scoped,
        rules=tuple((path, rights & handled) for path, rights in rules),
    )


def landlock_abi() -> int:
    """The running kernel's Landlock ABI, 0 when unavailable."""
    try:
        import landlockpy

        return int(landlockpy.abi_version())
    except Exception:
        return 0


def build_ruleset_fd(ruleset: LandlockRuleset) -> object:
    """Create the kernel ruleset in the parent; the child only calls restrict_self on it."""
    import landlockpy

    rs = landlockpy.Ruleset(
        handled_fs=landlockpy.AccessFS(ruleset.handled_fs),
        handled_net=landlockpy.AccessNet(ruleset.handled_net),
        scoped=landlockpy.Scope(ruleset.scoped),
        best_effort=False,
    )
    for path, wanted in ruleset.rules:
        if not os.path.exists(path):
            continue
        # The kernel refuses directory rights on a rule for a file.
        rights = wanted if os.path.isdir(path) else wanted & FILE_RIGHTS
        if rights:
            rs.allow_path(path, landlockpy.AccessFS(rights))
    return rs


def landlock_child_setup(
    policy: SandboxPolicy,
    ctx: BackendContext,
    *,
    ops: tuple[MountOp, ...],
    mount_table: MountTable,
    ruleset_fd: int,
    cwd: str,
    abi: int = 7,
    setattr: bool = True,
    init: str | None = None,
) -> ChildSetup:
    """Every pre-exec step of a Landlock-confined command, in order (module docstring);
    ``setattr``: the kernel has mount_setattr(2) (`view_steps`); ``init``: the compiled
    PID 1 to hold for the exec (`sandbox_init`)."""
    setup = ChildSetup(record_only=ctx.record_only)
    given_back = make_descriptor_room(setup)
    if init is not None:
        # Opened while the helper's view still has the package (`sandbox_init`).
        setup.hold_file(init, INIT_FD)
    join_executor(setup, policy, ctx)
    setup.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS)
    apply_view(setup, ctx, ops, mount_table, cwd=cwd, setattr=setattr)
    setup.fork_waiter(INIT_FD if init is not None else -1)
    setup.mount_fs("proc", "/proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "")
    setup.bind_read_only("/proc/sys", "/proc/sys")
    # A git dir outside the roots is an overlay only this child has (its writes land in the
    # private upper layer): its rule can only be added from here, on the overlay itself.
    roots = policy.all_writable_roots()
    handled = handled_fs_for_abi(abi)
    for overlay in ctx.view.overlays:
        if not any(within(overlay.gitdir, r) for r in roots):
            setup.landlock_allow(ruleset_fd, overlay.gitdir, (READ_RIGHTS | WRITE_RIGHTS) & handled)
    if ctx.namespaces is not None and ctx.namespaces.user is not None:
        # The executor's user namespace maps its uid to 0, which mounting the view needs; the
        # command runs as the user it is (as under bwrap): `id`, file owners, and programs
        # that refuse root (PostgreSQL's `initdb`) see that uid. The new namespace gives its
        # capabilities to nobody: they are all dropped below, and its uid is not 0.
        setup.unshare(CLONE_NEWUSER)
        setup.write_file("/proc/self/setgroups", b"deny")
        setup.write_file("/proc/self/uid_map", f"{os.getuid()} 0 1".encode())
        setup.write_file("/proc/self/gid_map", f"{os.getgid()} 0 1".encode())
    setup.drop_all_capabilities()
    setup.no_new_privs()
    setup.landlock_restrict(ruleset_fd)
    setup.seccomp(compile_seccomp(SeccompOptions()))
    supervise(setup, ctx, given_back)
    return setup


def scratch_rules(ctx: BackendContext) -> tuple[tuple[str, ...], str | None]:
    """The private /tmp, /dev/shm and devpts as paths the parent can open (their tmpfs and
    devpts live only in the executor's mount namespace, so they are reached by descriptor)."""
    ns = ctx.namespaces
    if ns is None:
        return (), None
    # The domain's directories, not the tmpfs roots: bound at /tmp, a directory is its own
    # mount root, so Landlock never walks up to a rule on the tmpfs root.
    sub = f"/{ctx.scratch.domain}" if ctx.scratch is not None and ctx.scratch.domain else ""
    tmp, shm = f"/proc/self/fd/{ns.tmp}{sub}", f"/proc/self/fd/{ns.shm}{sub}"
    return (tmp, shm), f"/proc/self/fd/{ns.pts}"


def confined_plan(
    name: str,
    plan: SpawnPlan,
    ruleset: object,
    setup: ChildSetup,
    *,
    argv: tuple[str, ...],
    folds: bool,
    env: dict[str, str] | None = None,
) -> ConfinedPlan:
    """``plan`` with the child steps, a failure report pipe, and a release that closes the
    parent's ruleset descriptor once the process has settled."""
    report_r, report_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    setup.report_failures_to(report_w)
    previous_release = plan.release

    def release() -> None:
        ruleset.close()  # type: ignore[attr-defined]
        for fd in (report_r, report_w):
            os.close(fd)
        if previous_release is not None:
            previous_release()

    return ConfinedPlan(
        argv=argv,
        env=dict(plan.env) if env is None else env,
        cwd=plan.cwd,
        preexec_fn=setup,
        pass_fds=plan.pass_fds,
        release=release,
        folds_signals=folds,
        backend_name=name,
        report_fd=report_r,
    )


class LandlockBackend(SandboxBackend):
    """Confines with Landlock, namespaces, dropped capabilities and seccomp."""

    name = "landlock"
    folds_signals = True
    # Its namespaces are entered from the executor's, not made per command.
    own_user_namespace = False
    network_namespace: NetworkNamespaceUse = "required"

    def __init__(self) -> None:
        self._abi = landlock_abi()

    @property
    def abi(self) -> int:
        return self._abi

    def wrap(self, policy: SandboxPolicy, plan: SpawnPlan, ctx: BackendContext) -> ConfinedPlan:
        private_tmp = ctx.scratch.tmp if ctx.scratch is not None else None
        ops = render_mount_plan(policy, ctx.view, ctx.sources, private_tmp=private_tmp)
        scratch, ptys = scratch_rules(ctx)
        ruleset = render_landlock_ruleset(policy, self._abi, scratch=scratch, ptys=ptys)
        try:
            rs = build_ruleset_fd(ruleset)
        except OSError as exc:  # landlockpy's errors are OSErrors (Landlock gone, ENOMEM)
            raise SandboxUnavailableError(
                policy.mode, f"landlock: cannot build the ruleset: {exc}"
            ) from exc
        init = sandbox_init.for_spawn(ctx.hold_init)
        setup = landlock_child_setup(
            policy,
            ctx,
            ops=ops,
            mount_table=ctx.mount_table if ctx.mount_table is not None else read_mount_table(),
            ruleset_fd=rs.fileno(),  # type: ignore[attr-defined]
            cwd=plan.cwd,
            abi=self._abi,
            setattr=mount_setattr_available(),
            init=init,
        )
        argv = sandbox_init.pid1_argv(plan.argv, compiled=init is not None)
        return confined_plan(self.name, plan, rs, setup, argv=argv, folds=True)

    def enforcement(self, policy: SandboxPolicy) -> SandboxEnforcement:
        return SandboxEnforcement.FULL if self._abi >= 6 else SandboxEnforcement.PARTIAL

    def layers(self, network: NetworkMode) -> tuple[LayerReport, ...]:
        scoped = self._abi >= 6
        return (
            LayerReport(
                "files",
                "full" if self._abi >= 3 else "partial",
                f"Landlock ABI {self._abi} rules, the whole tree read-only, nosuid and nodev "
                "(metadata too) with the roots bound writable, directories holding denied "
                "paths shadowed, protected names covered and watched, git directories "
                "overlaid, a fresh /dev",
            ),
            LayerReport(
                "processes",
                "full" if scoped else "partial",
                "PID namespace with its own /proc, no capabilities, no_new_privs, "
                + (
                    "Landlock signal scoping"
                    if scoped
                    else "no Landlock signal scoping before ABI 6"
                ),
            ),
            LayerReport("network", "none", "host network requested: the command shares it")
            if network is NetworkMode.HOST
            else LayerReport(
                "network",
                "full",
                "the executor's loopback-only network namespace; every connect() checked by "
                "the executor's seccomp supervisor",
            ),
            LayerReport(
                "unix sockets",
                "full",
                "every connect() resolved in the command's view by the seccomp supervisor: "
                "host sockets outside the writable roots refused; datagram unix sockets refused",
            ),
        )

    def confinement_failure(self, timeout_ms: int) -> str | None:
        """Confine a probe command exactly as `wrap` confines commands (namespaces, mounts,
        rules, filters); None when it wrote the workspace and not next to it, else why not."""
        with probe_context(self.mounts) as (tmp, ctx):
            ws = os.path.join(tmp, "ws")
            os.mkdir(ws)
            policy = SandboxPolicy(
                mode=SandboxMode.WORKSPACE_WRITE,
                workspace_root=ws,
                network=NetworkMode.HOST,
                deny_read=(),
            )
            plan = self.wrap(
                policy,
                SpawnPlan(
                    argv=(
                        "/bin/sh",
                        "-c",
                        "echo ok > probe; echo x > ../escape 2>/dev/null; exit 0",
                    ),
                    env={"PATH": "/usr/bin:/bin"},
                    cwd=ws,
                ),
                ctx,
            )
            try:
                done = run_probe_command(
                    plan.argv,
                    timeout_ms,
                    env=dict(plan.env),
                    cwd=plan.cwd,
                    preexec_fn=plan.preexec_fn,
                )
            except subprocess.TimeoutExpired:
                return f"probe timed out after {timeout_ms} ms"
            except (OSError, subprocess.SubprocessError) as exc:
                return f"probe could not start: {self.explain_failure(plan, exc)}"
            finally:
                if plan.release is not None:
                    plan.release()
            ok = (
                done.returncode == 0
                and os.path.exists(os.path.join(ws, "probe"))
                and not os.path.exists(os.path.join(tmp, "escape"))
            )
        if not ok:
            detail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            return f"probe failed: {detail}"
        return None

    def probe(self, timeout_ms: int) -> BackendProbe:
        if self._abi <= 0:
            return BackendProbe(self.name, False, "kernel has no Landlock (ABI 0)")
        failure = self.confinement_failure(timeout_ms)
        if failure is not None:
            return BackendProbe(self.name, False, failure)
        return BackendProbe(
            self.name,
            True,
            f"confined a probe command (Landlock ABI {self._abi})",
            version=f"ABI {self._abi}",
            layers=self.layers(NetworkMode.ISOLATED),
            extra={"landlock_abi": self._abi},
        )
