"""Exact-output tests of the pure Landlock ruleset and child-plan renderers."""

from __future__ import annotations

from bash_sandbox.backends import landlock as ll
from bash_sandbox.backends.mount_plan import PlannedMount
from bash_sandbox.linux.child_setup import (
    CLONE_NEWIPC,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_RELATIME,
)
from bash_sandbox.linux.seccomp import SeccompOptions
from policies import SandboxPolicy

SINKS = tuple(
    (s, ll.WRITE_FILE | ll.TRUNCATE | ll.IOCTL_DEV) for s in ("/dev/null", "/dev/zero", "/dev/full")
)


def test_read_only_abi7_grants_reads_everywhere_and_writes_only_to_sinks() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/srv", deny_read=())
    rs = ll.render_landlock_ruleset(policy, 7, private_tmp="/state/tmp")
    assert rs == ll.LandlockRuleset(
        abi=7,
        handled_fs=(1 << 16) - 1,
        scoped=ll.SCOPE_ABSTRACT_UNIX_SOCKET | ll.SCOPE_SIGNAL,
        rules=(("/", ll.EXECUTE | ll.READ_FILE | ll.READ_DIR), *SINKS),
    )


def test_workspace_write_adds_roots_and_private_tmp_without_device_creation() -> None:
    policy = SandboxPolicy(
        mode="workspace-write", workspace_root="/srv", writable_roots=("/data",), deny_read=()
    )
    rs = ll.render_landlock_ruleset(policy, 7, private_tmp="/state/tmp")
    write = ll.WRITE_RIGHTS
    assert rs.rules[-3:] == (("/srv", write), ("/data", write), ("/state/tmp", write))
    assert not write & (ll.MAKE_CHAR | ll.MAKE_BLOCK)


def test_old_abi_masks_rights_it_cannot_handle_and_has_no_scopes() -> None:
    policy = SandboxPolicy(mode="workspace-write", workspace_root="/srv", deny_read=())
    rs = ll.render_landlock_ruleset(policy, 2, private_tmp=None)
    assert rs.handled_fs == (1 << 14) - 1
    assert rs.scoped == 0
    assert all(rights & ~rs.handled_fs == 0 for _, rights in rs.rules)
    assert all(not rights & ll.IOCTL_DEV for _, rights in rs.rules)


def test_child_plan_as_root_uses_no_user_namespace() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/srv", deny_read=())
    mounts = (PlannedMount("/s/empty", "/srv/.git", create=True),)
    plan = ll.render_child_plan(policy, mounts=mounts, has_netns=True, euid=0, egid=0)
    assert plan == ll.ChildPlan(
        join_netns=True,
        join_userns=False,
        unshare_flags=CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS,
        map_ids=None,
        mounts=mounts,
        seccomp=SeccompOptions(block_unix_sockets=True),
    )


def test_child_plan_unprivileged_maps_its_own_ids_and_host_network_joins_nothing() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/srv", network="host", deny_read=())
    plan = ll.render_child_plan(policy, mounts=(), has_netns=True, euid=1000, egid=100)
    assert plan.unshare_flags & CLONE_NEWUSER
    assert plan.map_ids == (1000, 100)
    assert plan.join_netns is False
    assert plan.seccomp == SeccompOptions(block_unix_sockets=False)


def test_child_plan_unprivileged_joins_the_executors_user_namespace_when_isolated() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/srv", deny_read=())
    plan = ll.render_child_plan(
        policy, mounts=(), has_netns=True, euid=1000, egid=100, has_userns=True
    )
    assert (plan.join_userns, plan.join_netns) == (True, True)
    assert not plan.unshare_flags & CLONE_NEWUSER
    assert plan.map_ids is None


def test_pid1_wrapper_passes_the_command_as_an_argument() -> None:
    argv = ll.pid1_argv(("/bin/bash", "-c", "echo '$1'; exit 3"))
    assert argv[:2] == ("/bin/bash", "-c")
    assert argv[3:] == ("/bin/bash", "echo '$1'; exit 3")
    assert "echo" not in argv[2]


def test_child_plan_remounts_every_mount_read_only_and_rebinds_the_roots() -> None:
    policy = SandboxPolicy(mode="workspace-write", workspace_root="/srv/ws", deny_read=())
    table = ll.parse_mount_table(
        "22 1 0:21 / / rw,relatime - ext4 /dev/vda rw\n"
        "23 22 0:22 / /srv rw,nosuid,nodev - ext4 /dev/vdb rw\n"
        "24 22 0:23 / /with\\040space rw,noexec - tmpfs tmpfs rw\n"
    )
    plan = ll.render_child_plan(
        policy,
        mounts=(),
        has_netns=False,
        euid=0,
        egid=0,
        mount_table=table,
        private_tmp="/state/tmp",
    )
    assert plan.read_only_mounts == (
        ("/", MS_RDONLY | MS_RELATIME),
        ("/srv", MS_RDONLY | MS_NOSUID | MS_NODEV),
        ("/with space", MS_RDONLY | MS_NOEXEC),
    )
    assert plan.writable_binds == (("/srv/ws", MS_NOSUID | MS_NODEV), ("/state/tmp", MS_RELATIME))


def test_landlock_denial_dialect() -> None:
    backend = ll.LandlockBackend()
    assert backend.is_denial("bash: /etc/x: Permission denied")
    assert backend.is_denial("chmod: changing permissions of 'a': Operation not permitted")
    assert not backend.is_denial("ls: cannot access 'x': No such file or directory")
    assert backend.runner_failure(1, "unshare: unshare failed: Operation not permitted") is None
