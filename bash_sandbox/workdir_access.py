"""Whether a confined command can enter its working directory, judged before it is spawned.

A confined command has no capability that overrides file permissions (root's included), so
a directory on the way to its workdir without search permission for the executor's user
stops the runner at its `chdir` (bwrap: "Can't chdir ... Permission denied"). That used to
come back as `SandboxUnavailableError`, which tells a harness the host cannot confine: a
command could make every later call say so with `chmod 0 .` (a red team's), steering a
harness or a user toward an unconfined mode. It is the request's workdir that is unusable:
`WorkdirError`, naming the directory and its mode.
"""

from __future__ import annotations

import os
import stat

from bash_seam import WorkdirError


def check_enterable(workdir: str) -> None:
    """Raise `WorkdirError` unless every directory from `/` down to ``workdir`` (absolute,
    existing) grants search permission to this process's user by its mode bits alone."""
    uid, groups = os.geteuid(), {os.getegid(), *os.getgroups()}
    path = "/"
    for part in [p for p in workdir.split("/") if p]:
        path = os.path.join(path, part)
        try:
            st = os.stat(path)
        except OSError:
            return  # `check_workdir` names a missing one
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            raise WorkdirError(
                f"workdir {workdir!r}: a confined command cannot enter {path} (mode "
                f"{stat.filemode(st.st_mode)}, owner {st.st_uid}): it has no capability "
                "that overrides permissions; give the directory search permission back "
                "(`chmod u+rx`), or use another workdir"
            )
