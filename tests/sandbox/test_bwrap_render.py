"""Exact-output tests of the pure bwrap renderer: the argv is the confinement."""

from __future__ import annotations

import pytest

from bash_sandbox.backends.bwrap import (
    UNCONFINED_RUNNER_EXIT,
    UNCONFINED_RUNNER_LINE,
    BwrapBackend,
    BwrapOptions,
    confinement_check_argv,
    render_bwrap_argv,
)
from bash_sandbox.backends.mount_plan import PlannedMount
from policies import SandboxPolicy

HEAD = (
    "/usr/bin/bwrap",
    "--new-session",
    "--die-with-parent",
    "--unshare-user",
    "--uid",
    "1000",
    "--gid",
    "1000",
    "--disable-userns",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
)
BASE_MOUNTS = (
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
)
CMD = ("/bin/bash", "-c", "echo hi")


def _options(**kw: object) -> BwrapOptions:
    base: dict[str, object] = {"bwrap_path": "/usr/bin/bwrap", "uid": 1000, "gid": 1000}
    base.update(kw)
    return BwrapOptions(**base)  # type: ignore[arg-type]


def test_read_only_binds_nothing_writable_and_ends_with_the_command(tmp_path: object) -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/", deny_read=())
    argv = render_bwrap_argv(policy, CMD, workdir="/srv", mounts=(), options=_options())
    assert argv == (*HEAD, *BASE_MOUNTS, "--remount-ro", "/dev", "--chdir", "/srv", "--", *CMD)


def test_workspace_write_layers_tmp_roots_then_protected_and_hidden_paths() -> None:
    policy = SandboxPolicy(
        mode="workspace-write", workspace_root="/", writable_roots=("/srv",), deny_read=()
    )
    mounts = (
        PlannedMount("/state/empty", "/.git", create=True),
        PlannedMount("/srv/.git/hooks", "/srv/.git/hooks"),
        PlannedMount("/state/denied-dir", "/home/u/.ssh"),
    )
    argv = render_bwrap_argv(
        policy, CMD, workdir="/", mounts=mounts, options=_options(seccomp_fd=7)
    )
    assert argv == (
        *HEAD,
        *BASE_MOUNTS,
        "--tmpfs",
        "/tmp",
        "--bind",
        "/",
        "/",
        "--bind",
        "/srv",
        "/srv",
        "--ro-bind",
        "/state/empty",
        "/.git",
        "--ro-bind",
        "/srv/.git/hooks",
        "/srv/.git/hooks",
        "--ro-bind",
        "/state/denied-dir",
        "/home/u/.ssh",
        "--remount-ro",
        "/dev",
        "--seccomp",
        "7",
        "--chdir",
        "/",
        "--",
        *CMD,
    )


def test_private_tmp_is_bound_and_tmp_entries_holding_roots_come_back_read_only() -> None:
    policy = SandboxPolicy(
        mode="workspace-write",
        workspace_root="/tmp/run1/ws",
        writable_roots=("/tmp/run1/extra", "/tmp/x"),
        deny_read=(),
    )
    argv = render_bwrap_argv(
        policy, CMD, workdir="/tmp/run1/ws", mounts=(), options=_options(private_tmp="/state/tmp")
    )
    tail = argv[len(HEAD) + len(BASE_MOUNTS) :]
    assert tail == (
        "--bind",
        "/state/tmp",
        "/tmp",
        "--ro-bind",
        "/tmp/run1",
        "/tmp/run1",
        "--bind",
        "/tmp/run1/ws",
        "/tmp/run1/ws",
        "--bind",
        "/tmp/run1/extra",
        "/tmp/run1/extra",
        "--bind",
        "/tmp/x",
        "/tmp/x",
        "--remount-ro",
        "/dev",
        "--chdir",
        "/tmp/run1/ws",
        "--",
        *CMD,
    )


@pytest.mark.parametrize(
    ("network", "unshare", "expected"),
    [
        ("isolated", True, True),
        ("isolated", False, False),  # the executor's prepared namespace is entered instead
        ("host", True, False),
    ],
)
def test_unshare_net_only_when_isolated_without_a_prepared_namespace(
    network: str, unshare: bool, expected: bool
) -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/", network=network, deny_read=())
    argv = render_bwrap_argv(
        policy, CMD, workdir="/", mounts=(), options=_options(unshare_net=unshare)
    )
    assert ("--unshare-net" in argv) is expected


def test_isolated_enters_the_prepared_namespace_through_nsenter_first() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/", deny_read=())
    options = _options(enter_netns="/proc/42/fd/5", nsenter_path="/usr/bin/nsenter")
    argv = render_bwrap_argv(policy, CMD, workdir="/", mounts=(), options=options)
    assert argv[:4] == ("/usr/bin/nsenter", "--net=/proc/42/fd/5", "--", "/usr/bin/bwrap")
    host = SandboxPolicy(mode="read-only", workspace_root="/", network="host", deny_read=())
    assert render_bwrap_argv(host, CMD, workdir="/", mounts=(), options=options)[0] == (
        "/usr/bin/bwrap"
    )


def test_operator_runner_arguments_follow_the_runner_path() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/", deny_read=())
    options = _options(bwrap_path="/opt/runner", runner_args=("--profile", "strict"))
    argv = render_bwrap_argv(policy, CMD, workdir="/", mounts=(), options=options)
    assert argv[:4] == ("/opt/runner", "--profile", "strict", "--new-session")


def test_hostile_paths_stay_single_arguments() -> None:
    policy = SandboxPolicy(
        mode="workspace-write",
        workspace_root="/",
        writable_roots=("/tmp/a b\n--bind / /",),
        deny_read=(),
    )
    argv = render_bwrap_argv(policy, CMD, workdir="/", mounts=(), options=_options())
    hostile = policy.writable_roots[0]
    assert "\n--bind" in hostile
    i = argv.index(hostile)
    assert argv[i - 1] == "--bind" and argv[i + 1] == hostile
    assert argv.count("--bind") == 2


def test_runner_failure_needs_exit_1_and_a_fatal_bwrap_line() -> None:
    backend = BwrapBackend("/usr/bin/bwrap")
    assert backend.runner_failure(1, "bwrap: Can't mount proc on /newroot/proc\n") == (
        "bwrap: Can't mount proc on /newroot/proc"
    )
    assert backend.runner_failure(1, "some tool: failed\n") is None
    assert backend.runner_failure(2, "bwrap: Can't mount proc\n") is None
    assert backend.runner_failure(1, "bwrap: Warning: something harmless\n") is None


def test_operator_signatures_mark_runner_failures_at_any_exit_code() -> None:
    backend = BwrapBackend(runner_prefix=("/opt/runner",), failure_signatures=("RUNNER-FATAL",))
    assert backend.name == "runner"
    assert backend.runner_failure(3, "x\nRUNNER-FATAL: no namespaces\n") == (
        "RUNNER-FATAL: no namespaces"
    )
    assert backend.runner_failure(3, "ordinary failure\n") is None


def test_denial_dialect_is_erofs_or_eacces() -> None:
    backend = BwrapBackend("/usr/bin/bwrap")
    assert backend.is_denial("bash: f: Read-only file system")
    assert backend.is_denial("cat: x: Permission denied")
    assert not backend.is_denial("No such file or directory")


def test_operator_runner_commands_recheck_their_confinement_from_inside() -> None:
    argv = confinement_check_argv(("/bin/bash", "-c", "make; echo '$1'"), 4242)
    assert argv[0:2] == ("/bin/bash", "-c")
    assert argv[3:] == ("/bin/bash", "make; echo '$1'")
    assert "/proc/4242/ns/mnt" in argv[2] and "NoNewPrivs" in argv[2]
    backend = BwrapBackend(runner_prefix=("/opt/runner",))
    assert backend.runner_failure(UNCONFINED_RUNNER_EXIT, UNCONFINED_RUNNER_LINE + "\n") == (
        UNCONFINED_RUNNER_LINE
    )
