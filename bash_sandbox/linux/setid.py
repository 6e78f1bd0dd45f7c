"""The supervisor's answer to a call that would leave a set-id bit or a file capability.

Such a file outlives the command: whoever later runs it from the host (another local user,
the user's own tools) runs it as the executor's user, root included. The supervised filter
traps only a mode with S_ISUID or S_ISGID (BPF tests it, so `chmod +x` never traps) and
every xattr write (BPF cannot read the name). Refusing is always safe to decide here: the
kernel never runs the call, so nothing the command changes afterwards matters.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Verdict:
    """``refuse``: answer EPERM; ``denial``: the fact to record (None if the caller left)."""

    refuse: bool
    denial: SandboxDenial | None = None


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
        if name != XATTR_CAPS:
            return CONTINUE  # unreadable: the kernel answers EFAULT itself
        operation, reason = f"{call.name} {XATTR_CAPS.decode()}", REASON_FILE_CAPS
    elif call.mode is not None:
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
        return Verdict(refuse=True)  # the pid was reused: what we read is not the caller's
    denial = SandboxDenial(
        kind=DenialKind.FILE_WRITE,
        target=target,
        operation=operation,
        reason=reason,
        evidence=DenialEvidence.SUPERVISOR,
    )
    return Verdict(refuse=True, denial=denial)
