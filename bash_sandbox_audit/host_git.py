"""Host-side git: the repositories the git attacks start from, and the user's own git
commands that run after a confined command (the moment a planted control file would act).

Every call runs the host's real `git` outside any sandbox, with a clean environment: no
system config, `HOME` pointing at the attack's fake home (no global config), no prompts,
a fixed identity, a timeout. The "payload" a planted hook or `core.fsmonitor` would run is a
script that only appends a line to a marker file under the attack's own directory: its
existence afterwards is the proof that host git ran the command's code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from bash_sandbox_audit.model import AttackEnv

GIT_TIMEOUT_S = 20


def git_available() -> str | None:
    """None when git is installed, else the reason to skip."""
    return None if shutil.which("git") else "git is not installed here"


def git_env(env: AttackEnv) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": env.home,
        "LANG": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": "audit",
        "GIT_AUTHOR_EMAIL": "audit@example.invalid",
        "GIT_COMMITTER_NAME": "audit",
        "GIT_COMMITTER_EMAIL": "audit@example.invalid",
        # Local paths as submodule sources (git >= 2.38 refuses the file transport there).
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "protocol.file.allow",
        "GIT_CONFIG_VALUE_0": "always",
    }


def git(
    env: AttackEnv, cwd: str, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run host git in ``cwd``; raises `subprocess.CalledProcessError` when ``check``."""
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=git_env(env),
        capture_output=True,
        text=True,
        check=check,
        timeout=GIT_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def init_repo(env: AttackEnv, path: str, *, commit: bool = True) -> None:
    """A repository on branch ``main`` with one commit (``README``) and an identity."""
    os.makedirs(path, exist_ok=True)
    git(env, path, "init", "-q", "-b", "main")
    set_identity(env, path)
    if commit:
        with open(os.path.join(path, "README"), "w") as fh:
            fh.write("audit repository\n")
        git(env, path, "add", "README")
        git(env, path, "commit", "-q", "-m", "initial")


def set_identity(env: AttackEnv, path: str) -> None:
    """A committer identity in the repository's own config: confined git commands must not
    depend on the user's global config (an unprivileged audit has none)."""
    git(env, path, "config", "user.name", "audit")
    git(env, path, "config", "user.email", "audit@example.invalid")


@dataclass(frozen=True)
class Payload:
    """A script host git must never run: it appends its argument to ``marker``."""

    script: str
    marker: str

    def ran(self) -> list[str]:
        """What the payload recorded (empty: it never ran)."""
        try:
            with open(self.marker) as fh:
                return [line for line in fh.read().splitlines() if line]
        except FileNotFoundError:
            return []


def make_payload(env: AttackEnv) -> Payload:
    """The payload script, outside the workspace (the command may name it, not change it)."""
    directory = env.path("payload")
    os.makedirs(directory, exist_ok=True)
    marker = os.path.join(directory, "ran.log")
    script = os.path.join(directory, "run.sh")
    with open(script, "w") as fh:
        fh.write(f'#!/bin/sh\necho "host ran the payload: $0 $*" >> {marker}\nexit 1\n')
    os.chmod(script, 0o755)  # noqa: S103 - a hook must be executable to prove it would run
    return Payload(script, marker)
