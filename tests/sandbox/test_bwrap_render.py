"""Exact-output tests of the pure bwrap renderer: the argv is the confinement."""

from __future__ import annotations

import os

import pytest

from bash_sandbox.backends.bwrap import (
    UNCONFINED_RUNNER_EXIT,
    UNCONFINED_RUNNER_LINE,
    BwrapBackend,
    BwrapOptions,
    confinement_check_argv,
    render_bwrap_argv,
    sealed_memfd,
)
from bash_sandbox.backends.mount_plan import MountOp
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


def test_read_only_binds_nothing_writable_and_ends_with_the_command() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/w", deny_read=())
    argv = render_bwrap_argv(policy, CMD, workdir="/w", ops=(), options=_options())
    assert argv == (*HEAD, *BASE_MOUNTS, "--remount-ro", "/dev", "--chdir", "/w", "--", *CMD)


def test_a_prepared_view_is_taken_whole_with_its_flags_and_a_fresh_proc() -> None:
    policy = SandboxPolicy(mode="workspace-write", workspace_root="/w", deny_read=())
    argv = render_bwrap_argv(
        policy, CMD, workdir="/w", ops=(), options=_options(seccomp_fd=9, prepared_view=True)
    )
    assert argv == (
        *HEAD,
        "--cap-drop", "ALL",
        "--dev-bind", "/", "/",
        "--proc", "/proc",
        "--ro-bind", "/proc/sys", "/proc/sys",
        "--seccomp", "9",
        "--chdir", "/w", "--", *CMD,
    )  # fmt: skip


def test_wrap_builds_the_view_in_the_child_before_bwrap_starts() -> None:
    from bash_local.spawn import SpawnPlan
    from bash_sandbox.backends.base import BackendContext
    from bash_sandbox.backends.mount_plan import HostView, PlaceholderSources
    from bash_sandbox.linux.namespaces import NamespaceFds, ScratchPaths

    ctx = BackendContext(
        sources=PlaceholderSources("/st/empty", "/st/denied-dir", "/st/denied-file"),
        view=HostView(),
        namespaces=NamespaceFds(mnt=5, net=6, tmp=7, shm=8, pts=9, listener=10),
        scratch=ScratchPaths("/st/tmp", "/st/shm", "/st/pts"),
        stage="/st/stage",
        private_tmpdir="/st/lt",
        listener_fd=12,
    )
    policy = SandboxPolicy(mode="read-only", workspace_root="/w", deny_read=())
    plan = BwrapBackend("/usr/bin/bwrap").wrap(policy, SpawnPlan(argv=CMD, env={}, cwd="/w"), ctx)
    try:
        names = plan.preexec_fn.step_names()  # type: ignore[union-attr]
        assert names.index("unshare") < names.index("mount(private)")
        assert names.index("mount(private)") < names.index("bind /tmp") < names.index("fork")
        assert names[-2:] == ("no_new_privs", "seccomp(listener)")
        assert "--dev-bind" in plan.argv and "--ro-bind" in plan.argv
        assert "/tmp" not in plan.argv[: plan.argv.index("--")]  # bwrap binds nothing itself
    finally:
        assert plan.release is not None
        plan.release()


def test_without_executor_namespaces_the_view_renders_as_arguments() -> None:
    policy = SandboxPolicy(mode="workspace-write", workspace_root="/w", deny_read=())
    ops = (
        MountOp("tmpfs", "/home/u"),
        MountOp("mkdir", "/home/u/src"),
        MountOp("bind", "/home/u/src", "/home/u/src"),
        MountOp("symlink", "/home/u/link", "/home/u/src"),
        MountOp("bind", "/home/u/.ssh", "/s/denied-dir"),
        MountOp("readonly", "/home/u"),
        MountOp("bind", "/tmp", "/state/tmp", writable=True),
        MountOp("bind", "/w", "/w", writable=True),
        MountOp("overlay", "/w/.git", "/w/.git", writable=True, upper="/u", work="/k"),
        MountOp("bind", "/w/.git/config", "/w/.git/config"),
    )
    argv = render_bwrap_argv(
        policy,
        CMD,
        workdir="/w",
        ops=ops,
        options=_options(seccomp_fd=9, private_shm="/state/shm"),
    )
    assert argv == (
        *HEAD,
        *BASE_MOUNTS,
        "--tmpfs", "/home/u",
        "--ro-bind", "/home/u/src", "/home/u/src",
        "--symlink", "/home/u/src", "/home/u/link",
        "--ro-bind", "/s/denied-dir", "/home/u/.ssh",
        "--remount-ro", "/home/u",
        "--bind", "/state/tmp", "/tmp",
        "--bind", "/w", "/w",
        # the overlay is mounted before bwrap starts (its pre-exec step), so nothing here
        "--ro-bind", "/w/.git/config", "/w/.git/config",
        "--bind", "/state/shm", "/dev/shm",
        "--remount-ro", "/dev",
        "--seccomp", "9",
        "--chdir", "/w", "--", *CMD,
    )  # fmt: skip


def test_unshare_net_only_when_isolated_without_the_executors_namespace() -> None:
    for network, unshare, expected in (
        ("isolated", True, True),
        ("isolated", False, False),
        ("host", True, False),
    ):
        policy = SandboxPolicy(mode="read-only", workspace_root="/", network=network, deny_read=())
        argv = render_bwrap_argv(
            policy, CMD, workdir="/", ops=(), options=_options(unshare_net=unshare)
        )
        assert ("--unshare-net" in argv) is expected


def test_the_seccomp_program_is_a_sealed_memfd() -> None:
    fd = sealed_memfd("test", b"12345678")
    try:
        with pytest.raises(PermissionError):
            os.write(fd, b"x")
        assert os.pread(fd, 8, 0) == b"12345678"
    finally:
        os.close(fd)


def test_operator_runner_arguments_follow_the_runner_path() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/", deny_read=())
    options = _options(bwrap_path="/opt/runner", runner_args=("--profile", "strict"))
    argv = render_bwrap_argv(policy, CMD, workdir="/", ops=(), options=options)
    assert argv[:4] == ("/opt/runner", "--profile", "strict", "--new-session")


def test_hostile_paths_stay_single_arguments() -> None:
    policy = SandboxPolicy(
        mode="workspace-write",
        workspace_root="/",
        writable_roots=("/tmp/a b\n--bind / /",),
        deny_read=(),
    )
    ops = tuple(MountOp("bind", r, r, writable=True) for r in policy.all_writable_roots())
    argv = render_bwrap_argv(policy, CMD, workdir="/", ops=ops, options=_options())
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


def test_operator_runner_commands_recheck_their_confinement_from_inside() -> None:
    argv = confinement_check_argv(("/bin/bash", "-c", "make; echo '$1'"), "/proc/42/fd/7")
    assert argv[0:2] == ("/bin/bash", "-c")
    assert argv[3:] == ("/bin/bash", "make; echo '$1'")
    assert "[ -e /proc/42/fd/7 ]" in argv[2] and "-ef /proc/42/fd/7" in argv[2]
    # Positive evidence too: a user namespace cannot see the executor's descriptor at all.
    assert "! [ /proc/self/ns/pid -ef /proc/1/ns/pid ]" in argv[2]
    backend = BwrapBackend(runner_prefix=("/opt/runner",))
    assert backend.runner_failure(UNCONFINED_RUNNER_EXIT, UNCONFINED_RUNNER_LINE + "\n") == (
        UNCONFINED_RUNNER_LINE
    )
