"""A confined child's failed setup step, as it reported it, and the error each one means.

The child writes one record on the report pipe before it gives up: the errno as four
little-endian bytes, then the step's name (``bind /home/u/ws``, ``setns(net)``). Nothing the
command prints can reach that pipe (the command never ran), so the record is evidence, and
the executor decides from its fields, never from text.
"""

from __future__ import annotations

import contextlib
import errno as errnos
import os
from dataclasses import dataclass

from bash_sandbox.errors import SandboxUnavailableError, ViewChangedError
from policies import SandboxMode

_RECORD_MAX = 4 + 4096


@dataclass(frozen=True)
class ChildStepFailure:
    """The step the child failed at (``bind /x``) and the errno it got."""

    step: str
    errno: int

    @property
    def kind(self) -> str:
        """The step's verb: ``bind``, ``mkdir``, ``setns(net)``..."""
        return self.step.split(" ", 1)[0]

    def __str__(self) -> str:
        name = errnos.errorcode.get(self.errno, str(self.errno))
        return f"child setup failed at {self.step}: {os.strerror(self.errno)} ({name})"


def read_child_failure(fd: int | None) -> ChildStepFailure | None:
    """The record on the report pipe ``fd`` (non-blocking), or None when there is none."""
    if fd is None:
        return None
    with contextlib.suppress(OSError):
        data = os.read(fd, _RECORD_MAX)
        if len(data) > 4:
            return ChildStepFailure(
                data[4:].decode(errors="replace"), int.from_bytes(data[:4], "little")
            )
    return None


# What a failed step means, in one table: (step kind, errno) -> the error raised. A path the
# view mounts that vanished between the survey and the mount (another executor removed its
# spill directory meanwhile): nothing ran, and the executor may take the view again.
_ERRORS: dict[tuple[str, int], type[SandboxUnavailableError]] = {
    (kind, errnos.ENOENT): ViewChangedError
    for kind in ("bind", "remount-ro", "setattr", "mkdir", "create")
}


def child_error(
    mode: SandboxMode, backend: str, failure: ChildStepFailure | None, exc: BaseException
) -> SandboxUnavailableError:
    """The typed error for a spawn that failed in the child (or before it, with ``exc``)."""
    if failure is None:
        return SandboxUnavailableError(mode, f"{backend} could not start: {exc}")
    error = _ERRORS.get((failure.kind, failure.errno), SandboxUnavailableError)
    made = error(mode, f"{backend} could not start: {failure}")
    made.failure = failure
    return made
