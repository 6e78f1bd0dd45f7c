"""The pre-exec steps both Linux backends share: join the executor's namespaces, take the
limits, mount the git overlays, and hand the supervised syscalls to the executor.

Order, and why: PDEATHSIG first (from here on the child dies with the executor's spawning
thread); the user namespace before the others (it grants the privilege to join them); the
cgroups and rlimits before anything forks; the git overlays in a mount namespace of the
command's own (never in the executor's shared one); the supervised filter last, with
no_new_privs, so nothing before it is supervised.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

from bash_sandbox.backends.base import BackendContext
from bash_sandbox.backends.mount_plan import GitOverlay
from bash_sandbox.linux.child_setup import (
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWUSER,
    MS_NODEV,
    MS_NOSUID,
    ChildSetup,
)
from bash_sandbox.linux.limits import apply_rlimits, enter_cgroups
from bash_sandbox.linux.namespaces import NamespaceFds
from bash_sandbox.linux.rlimits import RlimitSetting, descriptor_room
from bash_sandbox.linux.seccomp import compile_notify_filter
from policies import NetworkMode, SandboxPolicy


def make_descriptor_room(setup: ChildSetup) -> RlimitSetting | None:
    """The first step where the open-files limit is below the descriptors the child holds
    at fixed numbers (`rlimits.descriptor_room`); returns the limits to give back, for
    `supervise`."""
    room = descriptor_room()
    if room is None:
        return None
    raised, given_back = room
    why = (
        f"the open-files limit raised to {raised.soft} for the set-up's descriptors "
        "(a hard limit below it takes CAP_SYS_RESOURCE: `ulimit -Hn 1024` first)"
    )
    setup.set_rlimit(raised.resource, raised.soft, raised.hard, why)
    return given_back


def join_executor(setup: ChildSetup, policy: SandboxPolicy, ctx: BackendContext) -> None:
    """The command's cgroups, PDEATHSIG, the executor's namespaces (network only under
    `isolated`). Cgroups first: the child moves itself before it can fork anything, while it
    still has the rights to write there."""
    if ctx.limits is not None:
        enter_cgroups(setup, ctx.limits)
    setup.die_with_parent()
    ns = ctx.namespaces
    if ns is not None:
        if ns.user is not None:
            setup.join_ns(ns.user, CLONE_NEWUSER, "user")
        setup.join_ns(ns.mnt, CLONE_NEWNS, "mnt")
        if policy.network is NetworkMode.ISOLATED:
            setup.join_ns(ns.net, CLONE_NEWNET, "net")


def _escape(path: str) -> str:
    # overlayfs splits its options on ',' and lowerdir on ':'; both may appear in paths.
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def overlay_options(overlay: GitOverlay, *, in_userns: bool) -> str:
    options = (
        f"lowerdir={_escape(overlay.gitdir)},upperdir={_escape(overlay.upper)},"
        f"workdir={_escape(overlay.work)}"
    )
    # In a user namespace overlayfs keeps its metadata in user.* xattrs.
    return options + (",userxattr" if in_userns else "")


def mount_overlays(setup: ChildSetup, overlays: tuple[GitOverlay, ...], in_userns: bool) -> None:
    for overlay in overlays:
        setup.mount_fs(
            "overlay",
            overlay.gitdir,
            MS_NOSUID | MS_NODEV,
            overlay_options(overlay, in_userns=in_userns),
        )


def supervise(
    setup: ChildSetup, ctx: BackendContext, given_back: RlimitSetting | None = None
) -> None:
    """The rlimits, no_new_privs, then the supervised filter with its listener sent to the
    executor. Last, so that the setup itself runs under none of them. ``given_back``: the
    open-files limit `make_descriptor_room` raised, as the command would have had it."""
    if given_back is not None:
        setup.set_rlimit(given_back.resource, given_back.soft, given_back.hard)
    if ctx.limits is not None:
        apply_rlimits(setup, ctx.limits)
    setup.no_new_privs()
    if ctx.listener_fd >= 0:
        setup.seccomp_listener(compile_notify_filter(), ctx.listener_fd)


def in_user_namespace(ctx: BackendContext) -> bool:
    return (ctx.namespaces is not None and ctx.namespaces.user is not None) or os.geteuid() != 0


@contextlib.contextmanager
def probe_context(with_namespaces: bool) -> Iterator[tuple[str, BackendContext]]:
    """A throwaway directory and context shaped like an executor's, for a functional probe
    that confines exactly the way commands are confined (namespaces included)."""
    from bash_sandbox.backends.mount_plan import HostView, make_placeholder_sources, tmp_tops
    from bash_sandbox.linux.namespaces import ScratchPaths, create_namespaces
    from bash_sandbox.state import remove_tree

    tmp = tempfile.mkdtemp(prefix="bash-sandbox-probe-")
    namespaces: NamespaceFds | None = None
    try:
        state = os.path.join(tmp, "state")
        os.mkdir(state, 0o700)
        for name in ("tmp", "shm", "pts", "stage", "landlock-tmp"):
            os.mkdir(os.path.join(state, name), 0o700)
        scratch = ScratchPaths(*(os.path.join(state, n) for n in ("tmp", "shm", "pts")))
        if with_namespaces:
            namespaces = create_namespaces(scratch, tmp_bytes=1 << 20, shm_bytes=1 << 20)
        ctx = BackendContext(
            sources=make_placeholder_sources(state),
            view=HostView(tmp_tops=tmp_tops((tmp + "/ws",))),
            namespaces=namespaces,
            scratch=scratch if with_namespaces else None,
            stage=os.path.join(state, "stage"),
            private_tmpdir=os.path.join(state, "landlock-tmp"),
            listener_fd=-1,
        )
        yield tmp, ctx
    finally:
        if namespaces is not None:
            for fd in (
                namespaces.mnt,
                namespaces.net,
                namespaces.tmp,
                namespaces.shm,
                namespaces.pts,
                namespaces.listener,
                namespaces.user,
            ):
                if fd is not None:
                    os.close(fd)
        remove_tree(tmp)
