"""Exact-output tests of the Landlock ruleset, the child's step sequence, and seccomp rules.

Only end-to-end attacks would otherwise notice two steps swapped: each step needs the
privileges the next ones drop, so the order is part of the confinement.
"""

from __future__ import annotations

import itertools

import pytest

from bash_sandbox.backends import landlock as ll
from bash_sandbox.backends import view_steps as vs
from bash_sandbox.backends.base import BackendContext
from bash_sandbox.backends.mount_plan import GitOverlay, HostView, MountOp, PlaceholderSources
from bash_sandbox.linux import sandbox_init
from bash_sandbox.linux.child_setup import MS_RDONLY
from bash_sandbox.linux.namespaces import NamespaceFds, ScratchPaths
from bash_sandbox.linux.seccomp import (
    SeccompOptions,
    render_notify_rules,
    render_seccomp_rules,
)
from policies import SandboxPolicy

SINKS = tuple(
    (s, ll.WRITE_FILE | ll.TRUNCATE | ll.IOCTL_DEV) for s in ("/dev/null", "/dev/zero", "/dev/full")
)
SCRATCH = ScratchPaths("/st/tmp", "/st/shm", "/st/pts")
TABLE = vs.parse_mount_table(
    "22 1 0:21 / / rw,relatime - ext4 /dev/vda rw\n"
    "23 22 0:22 / /proc rw,nosuid,nodev,noexec - proc proc rw\n"
)


def test_read_only_abi7_reads_everywhere_writes_sinks_and_private_scratch() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/srv", deny_read=())
    rs = ll.render_landlock_ruleset(policy, 7, scratch=("/fd/t", "/fd/s"), ptys="/fd/p")
    assert rs == ll.LandlockRuleset(
        abi=7,
        handled_fs=(1 << 16) - 1,
        scoped=ll.SCOPE_ABSTRACT_UNIX_SOCKET | ll.SCOPE_SIGNAL,
        rules=(
            ("/", ll.EXECUTE | ll.READ_FILE | ll.READ_DIR),
            *SINKS,
            ("/fd/t", ll.READ_RIGHTS | ll.WRITE_RIGHTS),
            ("/fd/s", ll.READ_RIGHTS | ll.WRITE_RIGHTS),
            ("/fd/p", ll.READ_FILE | ll.READ_DIR | ll.WRITE_FILE | ll.IOCTL_DEV),
        ),
    )


def test_workspace_write_adds_the_roots_without_device_creation() -> None:
    policy = SandboxPolicy(
        mode="workspace-write", workspace_root="/srv", writable_roots=("/data",), deny_read=()
    )
    rs = ll.render_landlock_ruleset(policy, 7)
    assert rs.rules[-2:] == (("/srv", ll.WRITE_RIGHTS), ("/data", ll.WRITE_RIGHTS))
    assert not ll.WRITE_RIGHTS & (ll.MAKE_CHAR | ll.MAKE_BLOCK)


def test_old_abi_masks_rights_it_cannot_handle_and_has_no_scopes() -> None:
    policy = SandboxPolicy(mode="workspace-write", workspace_root="/srv", deny_read=())
    rs = ll.render_landlock_ruleset(policy, 2)
    assert rs.handled_fs == (1 << 14) - 1
    assert rs.scoped == 0
    assert all(rights & ~rs.handled_fs == 0 for _, rights in rs.rules)


def test_pid1_wrapper_passes_the_command_as_an_argument() -> None:
    argv = sandbox_init.pid1_argv(("/bin/bash", "-c", "echo '$1'; exit 3"), compiled=False)
    assert argv[:2] == ("/bin/bash", "-c")
    assert argv[3:] == ("/bin/bash", "echo '$1'; exit 3")
    assert "echo" not in argv[2]
    compiled = sandbox_init.pid1_argv(("/bin/bash", "-c", "echo '$1'"), compiled=True)
    assert compiled == (sandbox_init.EXEC_PATH, "/bin/bash", "-c", "echo '$1'")
    # The compiled init does not search PATH: a bare name keeps the bash PID 1.
    bare = sandbox_init.pid1_argv(("bash", "-c", "true"), compiled=True)
    assert bare == sandbox_init.pid1_argv(("bash", "-c", "true"), compiled=False)


def _ctx(*, user: bool, overlays: tuple[GitOverlay, ...] = ()) -> BackendContext:
    return BackendContext(
        sources=PlaceholderSources("/st/empty", "/st/denied-dir", "/st/denied-file"),
        view=HostView(overlays=overlays),
        namespaces=NamespaceFds(
            mnt=5, net=6, tmp=7, shm=8, pts=9, listener=10, user=11 if user else None
        ),
        scratch=SCRATCH,
        stage="/st/stage",
        private_tmpdir="/st/lt",
        listener_fd=12,
    )


def _steps(
    policy: SandboxPolicy,
    ctx: BackendContext,
    ops: tuple[MountOp, ...] = (),
    *,
    setattr: bool = True,
) -> list[str]:
    setup = ll.landlock_child_setup(
        policy,
        ctx,
        ops=ops,
        mount_table=TABLE,
        ruleset_fd=20,
        cwd=policy.workspace_root,
        setattr=setattr,
    )
    # One "capbset" step per capability: collapse runs of the same step.
    return [name for name, _ in itertools.groupby(setup.step_names())]


STAGE = vs.STAGE
DEV = STAGE + "/st/empty"
FRESH_DEV_START = [
    f"mount tmpfs {DEV}",
    *itertools.chain.from_iterable(
        (f"create {DEV}/{n}", f"bind {DEV}/{n}") for n in vs.FRESH_DEV_NODES
    ),
    *(f"symlink {DEV}{link.removeprefix('/dev')}" for _, link in vs.FRESH_DEV_LINKS),
    f"mkdir {DEV}/pts",
    f"mkdir {DEV}/shm",
]
FRESH_DEV_END = [f"move {DEV}", "remount /dev"]
# The executor's ptys and /dev/shm were made read-only with the rest: writable again.
FRESH_DEV = [
    *FRESH_DEV_START,
    f"bind {DEV}/pts",
    f"setattr {DEV}/pts",
    f"bind {DEV}/shm",
    f"setattr {DEV}/shm",
    *FRESH_DEV_END,
]
FRESH_DEV_REMOUNTS = [*FRESH_DEV_START, f"bind {DEV}/pts", f"bind {DEV}/shm", *FRESH_DEV_END]
PRIVILEGE = [
    "fork",
    "mount proc /proc",
    "bind /proc/sys",
    "remount-ro /proc/sys",
    "securebits",
    "capbset",
    "ambient",
    "capset",
    "no_new_privs",
    "landlock_restrict_self",
    "seccomp",
    "no_new_privs",
    "seccomp(listener)",
]


@pytest.mark.parametrize(
    ("user", "network", "joins"),
    [
        (False, "isolated", ["setns(mnt)", "setns(net)"]),
        (False, "host", ["setns(mnt)"]),
        (True, "isolated", ["setns(user)", "setns(mnt)", "setns(net)"]),
        (True, "host", ["setns(user)", "setns(mnt)"]),
    ],
)
def test_the_child_steps_in_order_as_root_and_unprivileged_isolated_and_host(
    user: bool, network: str, joins: list[str]
) -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/srv", network=network, deny_read=())
    ops = (MountOp("bind", "/tmp", "/st/tmp", writable=True), MountOp("bind", "/x", "/x"))
    assert _steps(policy, _ctx(user=user), ops) == [
        "pdeathsig",
        "parent alive",
        *joins,
        "unshare",
        "mount(private)",
        "setattr /",
        "setattr /dev",
        "setattr /proc",
        "bind /st/stage",
        "hold /st/stage",
        "bind /tmp",
        "setattr /tmp",
        "bind /x",
        *FRESH_DEV,
        f"umount {STAGE}",
        f"close {vs.STAGE_FD}",
        "chdir /srv",
        *PRIVILEGE[:4],
        # Unprivileged: the command's own user namespace, mapping the user onto the
        # executor's uid 0 (it runs as the user it is, as under bwrap).
        *(OWN_USER_NAMESPACE if user else []),
        *PRIVILEGE[4:],
    ]


OWN_USER_NAMESPACE = [
    "unshare",
    "write /proc/self/setgroups",
    "write /proc/self/uid_map",
    "write /proc/self/gid_map",
]


def test_without_mount_setattr_every_mount_of_the_table_is_remounted_one_by_one() -> None:
    policy = SandboxPolicy(mode="read-only", workspace_root="/srv", deny_read=())
    ops = (MountOp("bind", "/tmp", "/st/tmp", writable=True), MountOp("bind", "/x", "/x"))
    steps = _steps(policy, _ctx(user=False), ops, setattr=False)
    start = steps.index("mount(private)")
    # /proc stays as the host has it (bwrap writes its uid map there; a fresh one covers it).
    assert steps[start : start + 9] == [
        "mount(private)",
        "remount /",
        "bind /st/stage",
        "hold /st/stage",
        "bind /tmp",
        "remount /tmp",
        "bind /x",
        "remount-ro /x",
        *FRESH_DEV_REMOUNTS[:1],
    ]
    assert not [s for s in steps if s.startswith("setattr")]


def test_a_writable_root_on_a_read_only_host_mount_stays_read_only() -> None:
    policy = SandboxPolicy(mode="workspace-write", workspace_root="/srv", deny_read=())
    table = vs.parse_mount_table(
        "22 1 0:21 / / rw,relatime - ext4 /dev/vda rw\n"
        "24 22 0:23 / /srv ro,nosuid - ext4 /dev/vdb ro\n"
    )
    assert vs.mount_of("/srv/app", table) & MS_RDONLY
    setup = ll.landlock_child_setup(
        policy,
        _ctx(user=False),
        ops=(MountOp("bind", "/srv", "/srv", writable=True),),
        mount_table=table,
        ruleset_fd=20,
        cwd="/srv",
    )
    names = setup.step_names()
    assert "bind /srv" in names
    assert "setattr /srv" not in names and "remount /srv" not in names


def test_git_overlays_are_mounted_before_the_read_only_remounts() -> None:
    policy = SandboxPolicy(mode="workspace-write", workspace_root="/srv", deny_read=())
    ctx = _ctx(user=False, overlays=(GitOverlay("/srv/.git", "/u", "/w"),))
    ops = (
        MountOp("bind", "/srv", "/srv", writable=True),
        MountOp("overlay", "/srv/.git", "/srv/.git", writable=True, upper="/u", work="/w"),
        MountOp("bind", "/srv/.git/config", "/srv/.git/config"),
    )
    steps = _steps(policy, ctx, ops)
    assert steps.index("mount(private)") < steps.index("mount overlay /srv/.git")
    assert steps.index("mount overlay /srv/.git") < steps.index("setattr /")
    # The whole stage is read-only, the overlay's copy included: the root's bind brings
    # the copy back, which is made writable, then covered.
    i = steps.index("bind /srv")
    assert steps[i : i + 4] == [
        "bind /srv",
        "setattr /srv",
        "setattr /srv/.git",
        "bind /srv/.git/config",
    ]
    legacy = _steps(policy, ctx, ops, setattr=False)
    assert legacy.index("mount overlay /srv/.git") < legacy.index("remount /")
    assert "remount-ro /srv/.git/config" in legacy


def test_the_refusal_filter_rules_in_order() -> None:
    names = [(r.syscall, r.errno, tuple((a.index, a.value, a.op) for a in r.args))
             for r in render_seccomp_rules(SeccompOptions())]  # fmt: skip
    assert names[:6] == [
        ("ioctl", 1, ((1, 0x5412, "masked_eq"),)),
        ("ioctl", 1, ((1, 0x541C, "masked_eq"),)),
        ("fcntl", 1, ((1, 1024, "masked_eq"),)),  # F_SETLEASE
        ("unshare", 1, ((0, 0x10000000, "masked_eq"),)),
        ("clone", 1, ((0, 0x10000000, "masked_eq"),)),
        ("clone3", 38, ()),
    ]
    calls = [n for n, _, _ in names]
    for call in ("mount", "open_tree", "fsopen", "keyctl", "bpf", "perf_event_open",
                 "io_uring_setup", "sethostname", "mq_open"):  # fmt: skip
        assert call in calls
    assert "chmod" not in calls  # only without a mount namespace
    assert "chmod" in [r.syscall for r in render_seccomp_rules(SeccompOptions(block_metadata=True))]


def test_the_supervised_filter_hands_over_connect_and_every_foreign_socket() -> None:
    rules = render_notify_rules()
    assert all(r.errno is None for r in rules)
    assert rules[0].syscall == "connect" and rules[0].args == ()
    socket_families = {r.args[0].value for r in rules if r.syscall == "socket" and len(r.args) == 1}
    assert socket_families == set(range(46)) - {1, 2, 10, 16} | {45}
    unix_types = {r.args[1].value for r in rules if r.syscall == "socketpair" and len(r.args) == 2}
    assert unix_types == {2, 3}  # datagram and raw (which AF_UNIX treats as datagram)
    netlink = [r for r in rules if r.syscall == "socket" and r.args[0].value == 16]
    assert [(a.index, a.value, a.op) for a in netlink[0].args] == [
        (0, 16, "masked_eq"),
        (2, 0, "ne"),
    ]
