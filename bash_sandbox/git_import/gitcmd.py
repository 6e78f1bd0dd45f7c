"""Host git, run for the import with nothing the command or the host's config could add.

No system or global config, no hooks, no fsmonitor, no network transport but the local
file one, no lazy fetch, no prompt, a timeout; the object-format and the host repository's
own config are the only inputs git reads besides the arguments.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from bash_sandbox.host_run import run_bounded
from bash_sandbox.linux.binaries import host_git, host_git_path

GIT_TIMEOUT_S = 120.0

# Options every invocation gets: what git would otherwise run or reach on its own.
_SAFE = (
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "core.untrackedCache=false",
    "-c", "protocol.allow=never",
    "-c", "protocol.file.allow=always",
    "-c", "gc.auto=0",
    "-c", "maintenance.auto=false",
    "-c", "fetch.writeCommitGraph=false",
    "-c", "submodule.recurse=false",
    "-c", "core.fsync=committed,index",
    "-c", "advice.detachedHead=false",
    "-c", "safe.directory=*",
)  # fmt: skip

GIT_SAFE_OPTIONS = _SAFE  # for the host git the import runs in a worktree (`git_plane`)
# For writes to the import's own scratch repository only (never the host's): nothing flushed.
SCRATCH_OPTIONS = ("-c", "core.fsync=none")

_KEPT_ENV = ("LANG", "LC_ALL", "TZ")


class GitError(Exception):
    """A git invocation of the import failed; ``stderr`` says why (bounded)."""

    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        self.returncode = returncode
        self.stderr = stderr[-2000:]
        super().__init__(f"git {' '.join(args[:3])} failed ({returncode}): {self.stderr.strip()}")


def git_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _KEPT_ENV}
    env["PATH"] = host_git_path()  # never the harness's: it may hold a workspace's bin dir
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_TERMINAL_PROMPT="0",
        GIT_NO_LAZY_FETCH="1",
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_OPTIONAL_LOCKS="0",
        HOME="/nonexistent",
        LC_ALL="C",
    )
    env.update(extra)
    return env


def git(
    git_dir: str,
    *args: str,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = GIT_TIMEOUT_S,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``git --git-dir=<git_dir> <args>`` for the import (outputs are small: lists of
    names and ids, never object contents)."""
    argv = [host_git(), *_SAFE, f"--git-dir={git_dir}", *args]
    done = run_bounded(
        argv,
        input=input,
        env=env or git_env(),
        cwd="/",
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise GitError(args, done.returncode, done.stderr.decode(errors="replace"))
    return done
