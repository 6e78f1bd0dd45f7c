"""The supervisor's answer to a call that would leave a set-id bit, a file capability or
any other extended attribute.

Such a file outlives the command: whoever later runs it from the host (another local user,
the user's own tools) runs it as the executor's user, root included. The supervised filter
traps only a mode with S_ISUID or S_ISGID (BPF tests it, so `chmod +x` never traps) and
every xattr write (BPF cannot read the name). Refusing is always safe to decide here: the
kernel never runs the call, so nothing the command changes afterwards matters.

Every xattr write is refused, whatever its name. A POSIX ACL (`system.posix_acl_default`)
left on a workspace directory overrides the host's umask for everything created there
later: a red team's made the `.git/config` of a repository the host initialised afterwards
world-writable, and another local user's `core.fsmonitor` ran as root. And the name is in
the command's memory: judged here and then read again by the kernel, a name another thread
rewrites in between would pass as `user.*` and land as an ACL. So no name is trusted; the
name as read only goes into the denial. The answer is ENOTSUP, as a filesystem without
xattrs gives: coreutils sets a mode through `system.posix_acl_access` and falls back to
chmod, `cp -a` and Python's `copy2` skip the attributes.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass

from bash_sandbox.linux.file_calls import (
    O_CREAT,
    O_TMPFILE_BIT,
    S_ISGID,
    S_ISUID,
    XATTR_CAPS,
    XATTR_NAME_MAX,
    FileCall,
)
from bash_sandbox.linux.proc_paths import (
    PATH_MAX,
    MemoryReader,
    call_path,
    fd_path,
    read_cstring,
    signed_int,
)
from bash_seam import DenialEvidence, DenialKind, SandboxDenial

REASON_SETID = "set-id bits never leave the sandbox"
REASON_FILE_CAPS = "file capabilities never leave the sandbox"
REASON_XATTR = "extended attributes (ACLs among them) never leave the sandbox"
XATTR_ACL_ACCESS = b"system.posix_acl_access"


@dataclass(frozen=True)
class Verdict:
    """``refuse``: answer ``errno``; ``denial``: the fact to record (None if the caller left)."""

    refuse: bool
    denial: SandboxDenial | None = None
    errno: int = errno.EPERM


CONTINUE = Verdict(refuse=False)


def _target(call: FileCall, pid: int, args: tuple[int, ...], read: MemoryReader) -> str:
    if call.fd is not None:
        return fd_path(pid, signed_int(args[call.fd])) or f"fd {signed_int(args[call.fd])}"
    assert call.path is not None
    raw = read_cstring(read, pid, args[call.path], PATH_MAX)
    if raw is None:
        return "(unreadable path)"
    dirfd = signed_int(args[call.dirfd]) if call.dirfd is not None else None
    return call_path(pid, dirfd, raw) or raw.decode(errors="replace")


def setid_call(
    call: FileCall,
    pid: int,
    args: tuple[int, ...],
    read: MemoryReader,
    still_valid: Callable[[], bool],
) -> Verdict:
    """The answer to one trapped mode or xattr call of ``pid``."""
    if call.xattr is not None:
        name = read_cstring(read, pid, args[call.xattr], XATTR_NAME_MAX + 1)
        shown = name.decode(errors="replace") if name is not None else "(unreadable name)"
        operation = f"{call.name} {shown}"
        reason = REASON_FILE_CAPS if name == XATTR_CAPS else REASON_XATTR
        # As a filesystem without xattrs answers: coreutils' `install -m` and `cp -p` set a
        # mode through `system.posix_acl_access` first and fall back to chmod on ENOTSUP.
        answer = errno.ENOTSUP
    elif call.mode is not None:
        answer = errno.EPERM
        mode = args[call.mode] & 0o7777
        # Registers, not memory: what is checked here is what the kernel will run with.
        creates = call.flags is None or args[call.flags] & (O_CREAT | O_TMPFILE_BIT)
        if not (creates and mode & (S_ISUID | S_ISGID)):
            return CONTINUE  # trapped for the write watch, or a mode the open ignores
        operation, reason = f"{call.name} {mode:o}", REASON_SETID
    else:
        return CONTINUE  # a call of the write watch only
    target = _target(call, pid, args, read)
    if not still_valid():
        return Verdict(refuse=True, errno=answer)  # the pid was reused: not the caller's read
    if call.xattr is not None and (name == XATTR_ACL_ACCESS or _routine(name)):
        # How coreutils sets every mode (`install -m`, `cp -p`), then chmod on ENOTSUP, and
        # the `user.*` attributes copies carry (a browser's `user.xdg.origin.url`): refused
        # as routine, never a denial (it would ask the model to widen the mode for a copy
        # that worked). The denial is kept for what could have changed who may do what.
        return Verdict(refuse=True, errno=answer)
    denial = SandboxDenial(
        kind=DenialKind.FILE_WRITE,
        target=target,
        operation=operation,
        reason=reason,
        evidence=DenialEvidence.SUPERVISOR,
    )
    return Verdict(refuse=True, denial=denial, errno=answer)


def _routine(name: bytes | None) -> bool:
    return name is not None and name.startswith(b"user.")
