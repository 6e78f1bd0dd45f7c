"""Landlock backend: a pure `policy -> ruleset` renderer and the child steps that apply it.

Semantics: every filesystem right the running ABI knows is handled; reads and execution
are granted on `/`, writes only on `/dev/null`-like sinks and (workspace-write) the
writable roots plus a private per-executor temp dir (`TMPDIR`; the host `/tmp` stays
read-only because Landlock cannot give a private view of it, and a shared writable `/tmp`
lets a command plant files for host processes). Signals and abstract unix sockets are
scoped to the sandbox (ABI 6).

What Landlock alone cannot do is layered on in the child, in this order (each step needs
the privileges the next ones drop):

1. die with the executor (`PR_SET_PDEATHSIG`), so the tree cannot outlive it;
2. enter the executor's network namespace;
3. new mount, PID, IPC and UTS namespaces (plus a user namespace when not root);
4. every host mount remounted read-only and the writable roots bound back writable, so
   metadata changes Landlock does not govern (chmod, chown, xattrs, utimes, also through a
   read-only descriptor) fail with EROFS outside the roots; protected paths and
   `deny_read` paths mounted over read-only (`mount_plan`), because a Landlock rule on a
   root cannot be narrowed for a subpath; a fresh /dev (no host terminals, consoles,
   input devices or disks) with its own devpts;
5. drop every capability (bounding set included) and set `no_new_privs`;
6. `landlock_restrict_self`;
7. seccomp: the always-on set (`seccomp.py`).

The command then runs under `unshare --fork --kill-child`, whose child is PID 1 of the new
PID namespace: when the group is killed, every process of the command dies with it. That
PID 1 is a bash that runs the command as its child and exits with its status, because PID 1
ignores signals sent from inside its namespace (`kill $$` must still work). Like bwrap, a
command killed by signal n therefore reports exit 128+n.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from bash_local.spawn import SpawnPlan
from bash_sandbox.backends.base import (
    BackendContext,
    BackendProbe,
    LayerReport,
    SandboxBackend,
    run_probe_command,
)
from bash_sandbox.backends.mount_plan import PlannedMount, plan_mounts
from bash_sandbox.linux.child_setup import (
    CLONE_NEWIPC,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MS_NOATIME,
    MS_NODEV,
    MS_NODIRATIME,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_RELATIME,
    MS_STRICTATIME,
    ChildSetup,
)
from bash_sandbox.linux.seccomp import SeccompOptions, compile_seccomp
from policies import NetworkMode, SandboxEnforcement, SandboxMode, SandboxPolicy

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
    policy: SandboxPolicy, abi: int, *, private_tmp: str | None
) -> LandlockRuleset:
    """The ruleset for ``policy`` on a kernel with Landlock ``abi``. Pure."""
    handled = handled_fs_for_abi(abi)
    rules: list[tuple[str, int]] = [("/", READ_RIGHTS)]
    rules += [(sink, SINK_RIGHTS) for sink in WRITABLE_SINKS]
    if policy.mode is SandboxMode.WORKSPACE_WRITE:
        roots = policy.all_writable_roots()
        rules += [(root, WRITE_RIGHTS) for root in roots]
        if private_tmp is not None:
            rules.append((private_tmp, WRITE_RIGHTS))
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


@dataclass(frozen=True)
class ChildPlan:
    """Everything the child does before exec, rendered from the policy. Pure data."""

    join_netns: bool
    join_userns: bool
    unshare_flags: int
    map_ids: tuple[int, int] | None
    mounts: tuple[PlannedMount, ...]
    seccomp: SeccompOptions
    # Every host mount remounted read-only (with its other per-mount flags kept), then the
    # writable roots bound back writable: metadata changes (chmod, utimes on a descriptor)
    # outside them hit EROFS, which Landlock alone would let through.
    read_only_mounts: tuple[tuple[str, int], ...] = ()
    writable_binds: tuple[tuple[str, int], ...] = ()


# The devices a fresh /dev offers (like bwrap's --dev): no host terminals, consoles, input
# devices or disks, so nothing can read keystrokes or raw blocks around the rules.
FRESH_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
FRESH_DEV_LINKS = (
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
    ("pts/ptmx", "/dev/ptmx"),
)

_MOUNT_OPTION_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}


def _unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mount_table(mountinfo: str) -> tuple[tuple[str, int], ...]:
    """(mount point, per-mount flags without MS_RDONLY) for each line of a mountinfo text."""
    table: list[tuple[str, int]] = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        flags = 0
        for option in fields[5].split(","):
            flags |= _MOUNT_OPTION_FLAGS.get(option, 0)
        table.append((_unescape_mountinfo(fields[4]), flags))
    return tuple(table)


def _mount_of(path: str, table: tuple[tuple[str, int], ...]) -> int:
    """Per-mount flags of the deepest mount holding ``path``."""
    best, flags = "", 0
    for point, point_flags in table:
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, flags = point, point_flags
    return flags


def render_child_plan(
    policy: SandboxPolicy,
    *,
    mounts: tuple[PlannedMount, ...],
    has_netns: bool,
    euid: int,
    egid: int,
    has_userns: bool = False,
    mount_table: tuple[tuple[str, int], ...] = (),
    private_tmp: str | None = None,
) -> ChildPlan:
    join_netns = has_netns and policy.network is NetworkMode.ISOLATED
    # Joining the executor's user namespace already grants the privileges the next steps
    # need; otherwise an unprivileged executor makes its own.
    join_userns = join_netns and has_userns
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    own_userns = euid != 0 and not join_userns
    if own_userns:
        flags |= CLONE_NEWUSER
    writable = policy.all_writable_roots()
    if writable and private_tmp is not None:
        writable = (*writable, private_tmp)
    return ChildPlan(
        read_only_mounts=tuple((point, f | MS_RDONLY) for point, f in mount_table),
        writable_binds=tuple((root, _mount_of(root, mount_table)) for root in writable),
        join_netns=join_netns,
        join_userns=join_userns,
        unshare_flags=flags,
        map_ids=(euid, egid) if own_userns else None,
        mounts=mounts,
        seccomp=SeccompOptions(block_unix_sockets=policy.network is NetworkMode.ISOLATED),
    )


def _child_setup(plan: ChildPlan, ctx: BackendContext, ruleset_fd: int, cwd: str) -> ChildSetup:
    setup = ChildSetup()
    setup.die_with_parent()
    if plan.join_userns and ctx.userns_fd is not None:
        setup.join_userns(ctx.userns_fd)
    if plan.join_netns and ctx.netns_fd is not None:
        setup.join_netns(ctx.netns_fd)
    setup.unshare(plan.unshare_flags)
    if plan.map_ids is not None:
        uid, gid = plan.map_ids
        setup.write_file("/proc/self/setgroups", b"deny")
        setup.write_file("/proc/self/uid_map", f"{uid} {uid} 1".encode())
        setup.write_file("/proc/self/gid_map", f"{gid} {gid} 1".encode())
    setup.make_mounts_private()
    for point, flags in plan.read_only_mounts:
        setup.remount(point, flags)
    for root, flags in plan.writable_binds:
        setup.bind(root, root)
        setup.remount(root, flags)
    for m in plan.mounts:
        if m.create:
            setup.make_dir(m.target)
        if m.read_only:
            setup.bind_read_only(m.source, m.target)
        else:
            setup.bind(m.source, m.target)
    _fresh_dev(setup, ctx.sources.empty_dir)
    # subprocess chdir'ed before these mounts: without this, the cwd would still be the
    # directory underneath them, where protected names are unprotected.
    setup.chdir(cwd)
    setup.drop_all_capabilities()
    setup.no_new_privs()
    setup.landlock_restrict(ruleset_fd)
    setup.seccomp(compile_seccomp(plan.seccomp))
    return setup


def _fresh_dev(setup: ChildSetup, stage: str) -> None:
    """A tmpfs /dev with the harmless host nodes bound in and a private devpts, read-only.

    Built on ``stage`` (an empty directory) while the host's /dev is still visible, then
    moved over /dev: a descriptor opened by the parent belongs to the parent's mount
    namespace and cannot be bound here.
    """
    setup.mount_fs("tmpfs", stage, MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name in FRESH_DEV_NODES:
        setup.create_file(f"{stage}/{name}")
        setup.bind(f"/dev/{name}", f"{stage}/{name}")
    for target, link in FRESH_DEV_LINKS:
        setup.symlink(target, stage + link.removeprefix("/dev"))
    setup.make_dir(f"{stage}/pts")
    setup.make_dir(f"{stage}/shm")
    setup.mount_fs(
        "devpts", f"{stage}/pts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"
    )
    setup.move_mount(stage, "/dev")
    setup.remount("/dev", MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def read_mount_table() -> tuple[tuple[str, int], ...]:
    with open("/proc/self/mountinfo") as fh:
        return parse_mount_table(fh.read())


def confined_plan(
    plan: SpawnPlan,
    policy: SandboxPolicy,
    ctx: BackendContext,
    ruleset: object,
    setup: ChildSetup,
    *,
    argv: tuple[str, ...],
) -> SpawnPlan:
    """``plan`` with the child steps, the private TMPDIR (workspace-write), and a release
    that closes the parent's ruleset descriptor once the process has settled."""
    env = dict(plan.env)
    if policy.mode is SandboxMode.WORKSPACE_WRITE and ctx.private_tmp is not None:
        env["TMPDIR"] = ctx.private_tmp
    previous_release = plan.release

    def release() -> None:
        ruleset.close()  # type: ignore[attr-defined]
        if previous_release is not None:
            previous_release()

    return dataclasses.replace(plan, argv=argv, env=env, preexec_fn=setup, release=release)


def pid1_argv(argv: tuple[str, ...]) -> tuple[str, ...]:
    """Wrap ``(bash, "-c", command)`` so the command is PID 2 under a waiting bash PID 1.

    The command is passed as a positional argument, never spliced into the script.
    """
    if len(argv) == 3 and argv[1] == "-c":
        # PID 1's own stderr goes to /dev/null so its "Killed" job notice never shows up.
        script = 'exec 3>&2 2>/dev/null; "$0" -c "$1" 2>&3 3>&-; exit'
        return (argv[0], "-c", script, argv[0], argv[2])
    return argv


class LandlockBackend(SandboxBackend):
    """Confines with Landlock, namespaces, dropped capabilities and seccomp."""

    name = "landlock"
    folds_signals_into_exit_code = True
    network_namespace = "required"

    def __init__(self) -> None:
        self._abi = landlock_abi()
        self._init = shutil.which("unshare") or "/usr/bin/unshare"

    @property
    def abi(self) -> int:
        return self._abi

    def wrap(self, policy: SandboxPolicy, plan: SpawnPlan, ctx: BackendContext) -> SpawnPlan:
        mounts = plan_mounts(policy, ctx.hidden_paths, ctx.sources)
        ruleset = render_landlock_ruleset(policy, self._abi, private_tmp=ctx.private_tmp)
        rs = build_ruleset_fd(ruleset)
        child = render_child_plan(
            policy,
            mounts=mounts,
            has_netns=ctx.netns_fd is not None,
            euid=os.geteuid(),
            egid=os.getegid(),
            has_userns=ctx.userns_fd is not None,
            mount_table=read_mount_table(),
            private_tmp=ctx.private_tmp,
        )
        setup = _child_setup(child, ctx, rs.fileno(), plan.cwd)  # type: ignore[attr-defined]
        return confined_plan(
            plan,
            policy,
            ctx,
            rs,
            setup,
            argv=(self._init, "--fork", "--kill-child", "--", *pid1_argv(plan.argv)),
        )

    def enforcement(self, policy: SandboxPolicy, ctx: BackendContext) -> SandboxEnforcement:
        complete = self._abi >= 6 and (
            policy.network is NetworkMode.HOST or ctx.netns_fd is not None
        )
        return SandboxEnforcement.FULL if complete else SandboxEnforcement.PARTIAL

    def is_denial(self, stderr: str) -> bool:
        return any(
            s in stderr
            for s in (
                "Permission denied",  # Landlock's EACCES
                "Read-only file system",  # protected and hidden paths are read-only mounts
                "Operation not permitted",  # seccomp: mounts, keyrings, new user namespaces
                "Device or resource busy",  # renaming a pinned protected path
            )
        )

    def runner_failure(self, exit_code: int | None, stderr: str) -> str | None:
        # Child-setup failures surface at spawn time; once bash runs, the stderr is its own.
        return None

    def confinement_failure(self, timeout_ms: int) -> str | None:
        """Confine a probe command with `wrap`; None when it wrote the workspace and not
        next to it, else why not. A runner that does not confine would write ../escape."""
        with tempfile.TemporaryDirectory(prefix="bash-sandbox-probe-") as tmp:
            state = os.path.join(tmp, "state")
            ws = os.path.join(tmp, "ws")
            os.mkdir(state, 0o700)
            os.mkdir(ws)
            from bash_sandbox.backends.mount_plan import make_placeholder_sources

            ctx = BackendContext(sources=make_placeholder_sources(state))
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
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
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
                return f"probe could not start: {exc}"
            finally:
                if plan.release is not None:
                    plan.release()
            ok = (
                done.returncode == 0
                and os.path.exists(os.path.join(ws, "probe"))
                and not os.path.exists(os.path.join(tmp, "escape"))
            )
            os.chmod(os.path.join(state, "denied-dir"), 0o700)
        if not ok:
            detail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            return f"probe failed: {detail}"
        return None

    def probe(self, timeout_ms: int) -> BackendProbe:
        if self._abi <= 0:
            return BackendProbe(self.name, False, "kernel has no Landlock (ABI 0)")
        if not os.access(self._init, os.X_OK):
            return BackendProbe(self.name, False, f"{self._init} (util-linux) not found")
        failure = self.confinement_failure(timeout_ms)
        if failure is not None:
            return BackendProbe(self.name, False, failure)
        partial = "full" if self._abi >= 6 else "partial"
        return BackendProbe(
            self.name,
            True,
            f"confined a probe command (Landlock ABI {self._abi})",
            version=f"ABI {self._abi}",
            layers=(
                LayerReport(
                    "files",
                    "full" if self._abi >= 3 else "partial",
                    f"Landlock ABI {self._abi} rules, every host mount read-only (metadata "
                    "too) with the roots bound writable, protected and denied paths "
                    "mounted over, a fresh /dev",
                ),
                LayerReport(
                    "processes",
                    partial,
                    "PID namespace, no capabilities, no_new_privs, Landlock signal scoping"
                    if self._abi >= 6
                    else "PID namespace, no capabilities; no Landlock signal scoping before ABI 6",
                ),
            ),
            extra={"landlock_abi": self._abi},
        )
