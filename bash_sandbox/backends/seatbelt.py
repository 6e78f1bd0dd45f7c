"""Seatbelt backend (macOS): a pure `policy -> SBPL profile` renderer and the part that runs it.

Semantics of the rendered profile, in rule order (in SBPL the last matching rule wins, so
every narrowing comes after the grant it narrows):

1. `(deny default)`: whatever is not allowed below fails with EPERM ("Operation not
   permitted").
2. Processes may exec and fork (children inherit the sandbox); they may signal and inspect
   only processes of their own sandbox, never the executor or other host processes.
3. A few platform lookups a shell and common tools need (user names, the temp dir,
   preferences, sysctl reads).
4. Reads are allowed everywhere; `deny_read` is taken away in step 7.
5. Writes go only to the tty-less sinks (`/dev/null`, `/dev/fd/N`) and, in workspace-write,
   to the writable roots: the workspace, the extra roots, the executor's private temp dir,
   `/private/tmp` and the per-user temp dir (`/private/var/folders/...`).
6. Protected names are denied inside every writable root, whether they exist or not, and
   the entries leading to them (`.git` of `.git/hooks`) cannot be created or replaced.
7. `deny_read` paths (and executor-private paths) can be neither read nor written.
8. Ancestors of protected and secret paths cannot be renamed or deleted, because moving a
   directory away would sidestep the path-based rules of steps 6 and 7.
9. Network: `isolated` has no IP traffic at all (Seatbelt cannot give the command a
   loopback of its own, and the host's loopback is the host's services); `host` has the
   host's IP network and name resolution. Unix sockets connect or bind only under the
   workspace and extra roots in both modes: the temp dirs hold host daemons' sockets.

Paths never appear in the profile text: each is a `(param "NAME")` whose value is passed as
`-D NAME=VALUE`, so a quote, backslash, newline or parenthesis in a path cannot change what
the profile means. NUL cannot pass through argv and is rejected before anything spawns.
"""

from __future__ import annotations

import os
import platform as platform_module
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
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
from bash_sandbox.errors import SandboxUnavailableError
from policies import NetworkMode, SandboxEnforcement, SandboxMode, SandboxPolicy

# Absolute and fixed: a PATH lookup would let whoever controls PATH pick the "sandbox".
SANDBOX_EXEC = "/usr/bin/sandbox-exec"
MACOS_SHARED_TMP = "/private/tmp"
DARWIN_USER_TEMP_PREFIX = "/private/var/folders/"
DENIAL_DIALECT = "Operation not permitted"


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


# What a workspace-write profile cannot hold, which the Linux backends do with mounts and
# the git import: named in every such result and in `doctor` (threat rows 3, 4, 16, 20).
WORKSPACE_WRITE_GAPS = (
    "Seatbelt writes in place: git's control files other than .git/hooks and .git/config, "
    "repositories the command creates, and the files host git configs or installed hooks "
    "name in the roots are not kept from it (no git import through git's parser); "
    "protected names are matched with their exact case, and on a case-insensitive volume "
    "(APFS's default) `.VSCODE` is `.vscode`; /private/tmp and the per-user temp dir are "
    "the host's, shared with later calls"
)
LOOPBACK_GAP = "isolated shares the host's loopback: services on its 127.0.0.1 are reachable"
# Row 11 in every mode: the executor kills the command's process group, and macOS has no
# PID namespace or cgroup to find a process that left it.
PROCESS_GAP = (
    "a process that leaves the command's process group (setsid, a double fork) can outlive "
    "the run: macOS gives no PID namespace or cgroup to find it"
)
# `_CS_DARWIN_USER_TEMP_DIR` from <unistd.h>; Python's `os.confstr_names` does not list it.
_CS_DARWIN_USER_TEMP_DIR = 65537


@dataclass(frozen=True)
class SeatbeltProfile:
    """SBPL text that references every path as `(param NAME)`, and the ordered values."""

    text: str
    params: tuple[tuple[str, str], ...]


class _Params:
    """Hands out `PREFIX_N` names for path values, in the order the profile uses them."""

    def __init__(self) -> None:
        self._pairs: list[tuple[str, str]] = []
        self._counts: dict[str, int] = {}

    def add(self, prefix: str, value: str) -> str:
        if "\x00" in value:
            # argv is NUL-terminated: the value would be cut short, silently naming another path.
            raise ValueError(f"{prefix} path contains a NUL byte: {value!r}")
        if not value.startswith("/"):
            raise ValueError(f"{prefix} path must be absolute, got {value!r}")
        index = self._counts.get(prefix, 0)
        self._counts[prefix] = index + 1
        name = f"{prefix}_{index}"
        self._pairs.append((name, value))
        return f'(param "{name}")'

    def pairs(self) -> tuple[tuple[str, str], ...]:
        return tuple(self._pairs)


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _rule(comment: str, head: str, filters: Iterable[str]) -> str:
    """One commented rule, one filter a line (filters of a rule are alternatives)."""
    lines = [f"; {line}" for line in comment.splitlines()]
    body = "\n".join(f"  {f}" for f in filters)
    return "\n".join(lines) + f"\n({head}\n{body})"


def _entries_leading_to(root: str, name: str) -> list[str]:
    """The paths strictly between ``root`` and ``root/name`` (`root/.git` for `.git/hooks`)."""
    out: list[str] = []
    parent = os.path.dirname(name)
    while parent:
        out.append(os.path.join(root, parent))
        parent = os.path.dirname(parent)
    return out


def _ancestors(path: str) -> list[str]:
    """Every ancestor of ``path`` except `/`, nearest first."""
    out: list[str] = []
    parent = os.path.dirname(path)
    while parent not in ("/", ""):
        out.append(parent)
        parent = os.path.dirname(parent)
    return out


_BASE = """\
(version 1)

; Closed by default: anything not allowed below fails with EPERM.
(deny default)

; Processes: exec and fork freely (children inherit this sandbox); signal and
; inspect only processes of this sandbox.
(allow process-exec)
(allow process-fork)
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))

; Platform lookups a shell and common tools need: user names, the temp dir,
; preferences, sysctl reads, POSIX semaphores (Python multiprocessing).
(allow sysctl-read)
(allow user-preference-read)
(allow mach-lookup
  (global-name "com.apple.system.opendirectoryd.libinfo")
  (global-name "com.apple.system.opendirectoryd.membership")
  (global-name "com.apple.bsd.dirhelper")
  (global-name "com.apple.cfprefsd.daemon")
  (global-name "com.apple.cfprefsd.agent")
  (global-name "com.apple.system.notification_center")
  (global-name "com.apple.system.logger")
  (local-name "com.apple.cfprefsd.agent"))
(allow ipc-posix-shm-read* (ipc-posix-name-prefix "apple.cfprefs."))
(allow ipc-posix-sem)
(allow system-socket (socket-domain AF_UNIX))

; Reads: the whole filesystem; deny_read is taken away below.
(allow file-read*)

; Writes: the tty-less sinks a shell needs.
(allow file-write-data
  (literal "/dev/null")
  (regex #"^/dev/fd/[0-9]+$"))"""

_NO_SETUGID = """\
; No set-user-id or set-group-id bit, wherever the command may write.
(deny file-write-setugid)"""

_HOST_NETWORK = """\
; Network: the host's IP network and its name resolution (mDNSResponder, configd).
(allow network-bind (local ip "*:*"))
(allow network-inbound (local ip "*:*"))
(allow network-outbound (remote ip "*:*"))
(allow network-outbound (literal "/private/var/run/mDNSResponder"))
(allow system-socket (require-all (socket-domain AF_SYSTEM) (socket-protocol 2)))
(allow mach-lookup
  (global-name "com.apple.SystemConfiguration.DNSConfiguration")
  (global-name "com.apple.SystemConfiguration.configd")
  (global-name "com.apple.networkd")
  (global-name "com.apple.trustd.agent")
  (global-name "com.apple.ocspd")
  (global-name "com.apple.SecurityServer"))"""

_ISOLATED_NETWORK = """\
; Network: none. There is no loopback of the sandbox's own to allow: 127.0.0.1
; here is the host's, with the host's services listening on it."""

_LOOPBACK_NETWORK = """\
; Network: loopback only. This is the host's loopback, so host services
; listening on it are reachable too (the network layer is partial).
(allow network-bind (local ip "localhost:*"))
(allow network-inbound (local ip "localhost:*"))
(allow network-outbound (remote ip "localhost:*"))"""


def seatbelt_writable_roots(
    policy: SandboxPolicy, *, user_temp_dir: str | None, private_tmp: str | None = None
) -> tuple[str, ...]:
    """Where ``policy`` lets the command write under Seatbelt, in profile order."""
    if policy.mode is not SandboxMode.WORKSPACE_WRITE:
        return ()
    temp = [os.path.normpath(t) for t in (private_tmp, MACOS_SHARED_TMP, user_temp_dir) if t]
    return _unique((*policy.all_writable_roots(), *temp))


def render_seatbelt_profile(
    policy: SandboxPolicy,
    *,
    user_temp_dir: str | None,
    private_tmp: str | None = None,
    extra_deny_read: tuple[str, ...] = (),
    protected_aliases: tuple[str, ...] = (),
    allow_loopback: bool = False,
) -> SeatbeltProfile:
    """The SBPL profile confining a command under ``policy``. Pure: no filesystem access.

    The caller resolves host facts first: ``user_temp_dir`` (realpath, or None),
    ``extra_deny_read`` (realpaths of symlinked `deny_read` entries, executor-private
    paths) and ``protected_aliases`` (realpaths of protected paths that resolve elsewhere).
    Raises `ValueError` for danger-full-access and for a NUL byte or relative path.
    """
    if not policy.confined:
        raise ValueError("danger-full-access is unconfined: it has no Seatbelt profile")
    params = _Params()
    sections = [_BASE]

    roots = seatbelt_writable_roots(policy, user_temp_dir=user_temp_dir, private_tmp=private_tmp)
    root_refs = {root: params.add("WRITABLE_ROOT", root) for root in roots}
    if roots:
        sections.append(
            _rule(
                "Writes: the writable roots (workspace, extra roots, temp dirs).",
                "allow file-write*",
                (f"(subpath {ref})" for ref in root_refs.values()),
            )
        )
        # Named although `file-write*` may not cover it: a set-id bit left in a root runs
        # with its owner's rights for another user or a later host process (row 19).
        sections.append(_NO_SETUGID)

    in_root = [(root, name) for root in roots for name in policy.protected_paths]
    protected = (
        _unique(
            (
                *(os.path.join(r, n) for r, n in in_root),
                *map(os.path.normpath, protected_aliases),
            )
        )
        if roots
        else ()
    )
    # `.git` of `.git/hooks`: were it creatable, a symlink or gitfile there would redirect
    # the protected names to a writable place (bwrap mounts it read-only for the same reason).
    entries = _unique(
        p for r, n in in_root for p in _entries_leading_to(r, n) if p not in protected
    )
    if protected:
        refs = [params.add("PROTECTED", path) for path in protected]
        entry_refs = [params.add("PROTECTED_PARENT", path) for path in entries]
        sections.append(
            _rule(
                # literal as well as subpath: creating the protected path itself must fail too.
                "Protected names stay read-only inside every writable root, existing or\n"
                "not, and the directory entries leading to them cannot be created, moved\n"
                "or replaced; after the allows, because the last matching rule wins.",
                "deny file-write*",
                (
                    *(f for ref in refs for f in (f"(literal {ref})", f"(subpath {ref})")),
                    *(f"(literal {ref})" for ref in entry_refs),
                ),
            )
        )

    secrets = _unique((*policy.deny_read, *map(os.path.normpath, extra_deny_read)))
    if secrets:
        refs = [params.add("DENY_READ", path) for path in secrets]
        sections.append(
            _rule(
                "Secrets: neither read nor written, wherever they sit.",
                "deny file-read* file-write*",
                (f for ref in refs for f in (f"(literal {ref})", f"(subpath {ref})")),
            )
        )
    tmp = os.path.normpath(private_tmp) if private_tmp else ""
    if tmp in root_refs and any(_within(tmp, secret) for secret in secrets):
        # The command's own TMPDIR lies in the executor's state, which is hidden: given back
        # after the secrets' rule (the last match wins), or every `mktemp` failed (a red
        # team's review).
        sections.append(
            _rule(
                "The command's own temp dir, inside the executor's hidden state.",
                "allow file-read* file-write*",
                (f"(subpath {root_refs[tmp]})",),
            )
        )
        # That grant would take back the set-id refusal above (the last match wins).
        sections.append(_NO_SETUGID)

    # Only a writable sandbox can rename; read-only needs no guard.
    guarded = set(protected) | set(entries) | set(secrets)
    ancestors = (
        _unique(a for path in (*protected, *secrets) for a in _ancestors(path) if a not in guarded)
        if roots
        else ()
    )
    if ancestors:
        refs = [params.add("GUARDED_ANCESTOR", path) for path in ancestors]
        sections.append(
            _rule(
                "No renaming or deleting the directories above a protected or secret\n"
                "path: moving one away would sidestep the path rules above.",
                "deny file-write-unlink",
                (f"(literal {ref})" for ref in refs),
            )
        )

    if policy.network is NetworkMode.HOST:
        sections.append(_HOST_NETWORK)
    else:
        sections.append(_LOOPBACK_NETWORK if allow_loopback else _ISOLATED_NETWORK)

    # Temp dirs are left out on purpose: tmux, ssh-agent and IDEs keep their sockets there.
    socket_refs = [root_refs[r] for r in policy.all_writable_roots() if r in root_refs]
    if socket_refs:
        bind = _rule(
            "Unix sockets: bind and connect only under the workspace and extra roots.",
            "allow network-bind",
            (f"(local unix-socket (subpath {ref}))" for ref in socket_refs),
        )
        connect = (
            "\n".join(
                [
                    "(allow network-outbound",
                    *(f"  (remote unix-socket (subpath {ref}))" for ref in socket_refs),
                ]
            )
            + ")"
        )
        sections.append(f"{bind}\n{connect}")

    return SeatbeltProfile(text="\n\n".join(sections) + "\n", params=params.pairs())


def seatbelt_argv(profile: SeatbeltProfile, argv: tuple[str, ...]) -> tuple[str, ...]:
    """`sandbox-exec -p PROFILE -D NAME=VALUE... -- ARGV`: the command runs only once applied."""
    if not argv:
        raise ValueError("nothing to run under sandbox-exec")
    out = [SANDBOX_EXEC, "-p", profile.text]
    for name, value in profile.params:
        out += ["-D", f"{name}={value}"]
    # `--` ends sandbox-exec's getopt options, so argv can never be read as one of them.
    out += ["--", *argv]
    return tuple(out)


def seatbelt_supported(platform: str = sys.platform) -> bool:
    """Seatbelt exists only on macOS; elsewhere this backend fails closed."""
    return platform == "darwin"


def user_temp_dir_from(candidate: str | None) -> str | None:
    """``candidate`` resolved, when it is a per-user temp dir under `/private/var/folders/`.

    Anything else (a TMPDIR pointing at `/` or the home directory) is refused, because the
    result becomes writable: widening it must not be one environment variable away.
    """
    if not candidate or "\x00" in candidate or not os.path.isabs(candidate):
        return None
    resolved = os.path.realpath(candidate)
    return resolved if resolved.startswith(DARWIN_USER_TEMP_PREFIX) else None


def darwin_user_temp_dir() -> str | None:
    """The per-user temp dir macOS assigns (`confstr`), else the executor's own temp dir."""
    try:
        found = user_temp_dir_from(os.confstr(_CS_DARWIN_USER_TEMP_DIR))
    except (ValueError, OSError):
        found = None
    # The executor's tempfile dir, not the command's env: the request may set TMPDIR.
    return found or user_temp_dir_from(tempfile.gettempdir())


def _aliases(paths: Iterable[str]) -> tuple[str, ...]:
    """Realpaths that differ from their path: Seatbelt matches the resolved path."""
    out: list[str] = []
    for path in paths:
        resolved = os.path.realpath(path)
        if resolved != path:
            out.append(resolved)
    return _unique(out)


def _runner_present() -> bool:
    return os.path.isfile(SANDBOX_EXEC) and os.access(SANDBOX_EXEC, os.X_OK)


class SeatbeltBackend(SandboxBackend):
    """Confines with `/usr/bin/sandbox-exec` and a rendered profile.

    ``allow_loopback`` lets an isolated command use 127.0.0.1; because that is the host's
    loopback, the network layer then reports `partial`.
    """

    name = "seatbelt"
    network_namespace: NetworkNamespaceUse = "none"  # Seatbelt filters the network itself
    mounts = False
    write_refusals = frozenset({"EPERM"})

    def __init__(self, *, allow_loopback: bool = False, platform: str = sys.platform) -> None:
        self._allow_loopback = allow_loopback
        self._platform = platform

    def _unavailable_reason(self) -> str | None:
        if not seatbelt_supported(self._platform):
            return f"sandbox-exec is macOS only (this is {self._platform})"
        if not _runner_present():
            return f"{SANDBOX_EXEC} is missing or not executable"
        return None

    def render(self, policy: SandboxPolicy, ctx: BackendContext) -> SeatbeltProfile:
        """Resolve this host's facts for ``policy`` and render its profile."""
        user_temp = darwin_user_temp_dir()
        # The executor made this dir itself; Seatbelt matches resolved paths (/var is a link).
        private_tmp = os.path.realpath(ctx.private_tmpdir) if ctx.private_tmpdir else None
        roots = seatbelt_writable_roots(policy, user_temp_dir=user_temp, private_tmp=private_tmp)
        # The roots are used as the policy fixed them (canonical at resolve time); resolving
        # them again here could follow a symlink planted since and widen the grant.
        protected = [os.path.join(r, n) for r in roots for n in policy.protected_paths]
        return render_seatbelt_profile(
            policy,
            user_temp_dir=user_temp,
            private_tmp=private_tmp,
            extra_deny_read=_unique(
                (*_aliases(policy.deny_read), *ctx.view.hidden, *_aliases(ctx.view.hidden))
            ),
            protected_aliases=_aliases(protected),
            allow_loopback=self._allow_loopback,
        )

    def wrap(self, policy: SandboxPolicy, plan: SpawnPlan, ctx: BackendContext) -> ConfinedPlan:
        if not policy.confined:
            raise ValueError("danger-full-access never goes through a backend")
        reason = self._unavailable_reason()
        if reason is not None:
            raise SandboxUnavailableError(policy.mode, reason)
        try:
            profile = self.render(policy, ctx)
            argv = seatbelt_argv(profile, plan.argv)
        except ValueError as exc:
            raise SandboxUnavailableError(
                policy.mode, f"cannot render a Seatbelt profile: {exc}"
            ) from exc
        env = plan.env
        if policy.mode is SandboxMode.WORKSPACE_WRITE and ctx.private_tmpdir:
            # Like Landlock alone: temp files go to the executor's private dir.
            env = {**plan.env, "TMPDIR": ctx.private_tmpdir}
        return ConfinedPlan(
            argv=argv,
            env=env,
            cwd=plan.cwd,
            pass_fds=plan.pass_fds,
            release=plan.release,
            backend_name=self.name,
        )

    def enforcement(self, policy: SandboxPolicy) -> SandboxEnforcement:
        if self.partial_reasons(policy):
            return SandboxEnforcement.PARTIAL
        return SandboxEnforcement.FULL

    def partial_reasons(self, policy: SandboxPolicy) -> tuple[str, ...]:
        reasons: list[str] = [PROCESS_GAP]
        if policy.mode is SandboxMode.WORKSPACE_WRITE:
            reasons.append(WORKSPACE_WRITE_GAPS)
        if self._allow_loopback and policy.network is NetworkMode.ISOLATED:
            reasons.append(LOOPBACK_GAP)
        return tuple(reasons)

    def runner_failure(
        self, exit_code: int | None, stderr: str, started: bool | None = None
    ) -> str | None:
        # sandbox-exec fails before the command starts, so its message is the first line.
        if exit_code is None or exit_code == 0:
            return None
        first = next((line.strip() for line in stderr.splitlines() if line.strip()), "")
        if first.startswith("sandbox-exec:") or "sandbox_apply:" in first:
            return first
        return None

    def layers(self, network: NetworkMode = NetworkMode.ISOLATED) -> tuple[LayerReport, ...]:
        """What each layer enforces here (for `doctor`)."""
        if network is NetworkMode.HOST:
            net = LayerReport("network", "full", "host network requested: IP allowed")
        elif self._allow_loopback:
            net = LayerReport(
                "network",
                "partial",
                "no IP except loopback, which is the "
                "host's: services on the host's 127.0.0.1 are reachable",
            )
        else:
            net = LayerReport(
                "network",
                "full",
                "no IP traffic at all (no loopback either: "
                "Seatbelt cannot give the command a loopback of its own)",
            )
        return (
            LayerReport(
                "files",
                "partial",
                "SBPL deny default: writes only to /dev/null, "
                "/dev/fd and (workspace-write) the roots plus /private/tmp and the "
                "per-user temp dir; protected paths and deny_read win; read-only is full; "
                f"workspace-write is partial: {WORKSPACE_WRITE_GAPS}",
            ),
            LayerReport(
                "processes",
                "partial",
                "signal and process-info only within the same "
                f"sandbox; lifetime is the executor's process group: {PROCESS_GAP}",
            ),
            net,
            LayerReport(
                "unix sockets", "full", "bind and connect only under the workspace and extra roots"
            ),
        )

    def probe(self, timeout_ms: int) -> BackendProbe:
        reason = self._unavailable_reason()
        if reason is not None:
            return BackendProbe(self.name, False, reason, binary=None)
        version = platform_module.mac_ver()[0] or None
        workspace = tempfile.mkdtemp(prefix="bash-sandbox-probe-")
        try:
            failure = self._probe_in(os.path.realpath(workspace), timeout_ms)
        finally:
            shutil.rmtree(workspace, ignore_errors=True)
        if failure is not None:
            return BackendProbe(self.name, False, failure, binary=SANDBOX_EXEC, version=version)
        return BackendProbe(
            self.name,
            True,
            "confined a probe command",
            binary=SANDBOX_EXEC,
            version=version,
            layers=self.layers(),
        )

    def _probe_in(self, workspace: str, timeout_ms: int) -> str | None:
        """None when a write inside the workspace worked and one into a protected path failed,
        under both network modes (so every section of the profile compiled here)."""
        os.makedirs(os.path.join(workspace, ".git", "hooks"))
        script = ': > "$1/ok-$2"; : > "$1/.git/hooks/escape-$2"'
        for network in (NetworkMode.ISOLATED, NetworkMode.HOST):
            policy = SandboxPolicy(
                mode=SandboxMode.WORKSPACE_WRITE,
                workspace_root=workspace,
                network=network,
                deny_read=(os.path.join(workspace, "s"),),
            )
            profile = render_seatbelt_profile(policy, user_temp_dir=darwin_user_temp_dir())
            argv = seatbelt_argv(profile, ("/bin/sh", "-c", script, "sh", workspace, network.value))
            try:
                # The group is killed on timeout: a grandchild cannot hold the pipes open.
                done = run_probe_command(argv, timeout_ms, cwd=workspace)
            except subprocess.TimeoutExpired:
                return f"probe timed out after {timeout_ms} ms"
            except OSError as exc:
                return f"cannot execute {SANDBOX_EXEC}: {exc}"
            failed = self.runner_failure(done.returncode, done.stderr)
            if failed is not None:
                return f"probe failed: {failed}"
            if not os.path.exists(os.path.join(workspace, f"ok-{network.value}")):
                lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
                return f"probe could not write its workspace: {lines[-1]}"
            if os.path.exists(os.path.join(workspace, ".git", "hooks", f"escape-{network.value}")):
                return "probe wrote a protected path: the profile is not enforced"
        return None
