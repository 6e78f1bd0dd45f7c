"""The file tree every attack starts from, built by the audit under its own directory.

``ws`` is the workspace (with a planted symlink to a victim file, one to the victim dir, a
dangling one pointing outside, and a hardlink to a host file), ``host`` holds the victims
outside the workspace, ``home`` a fake home whose credential stores hold random canaries
(never the real ``~/.ssh``), and ``ws/secrets`` a denied path inside the workspace.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from bash_sandbox.git_import import fan_out
from bash_sandbox_audit.model import AttackEnv
from bash_sandbox_audit.targets import Snapshot, snapshot, snapshot_diff

VICTIM_TEXT = "original victim content\n"
# Extra protected names configured for row 4 (besides the defaults).
PROTECTED_PATHS: tuple[str, ...] = (".git/hooks", ".git/config", ".envrc", "deploy/secrets.env")


def deny_read_paths(root: str) -> tuple[str, ...]:
    """The `deny_read` list of every attack: the fake home's stores and a workspace path."""
    home = os.path.join(root, "home")
    return (
        os.path.join(home, ".ssh"),
        os.path.join(home, ".netrc"),
        os.path.join(home, ".aws"),
        os.path.join(root, "ws", "secrets"),
    )


@dataclass(frozen=True)
class Secrets:
    """Canary contents of the fake credential stores, and a name only a listing reveals."""

    contents: tuple[str, ...]
    listed_name: str
    public: str


def _write(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)


def build_layout(env: AttackEnv, *, git: str = "repo") -> Secrets:
    """Create the standard tree. ``git``: "repo" (.git with hooks and config), "no-hooks",
    "none" (no .git at all), "config-link" / "hooks-link" (planted symlinks) or "real"
    (a real `git init` repository, for the git control)."""
    tok = env.token
    for d in (env.ws, env.host, env.home, env.observe, env.tmp_area):
        os.makedirs(d, exist_ok=True)
    _write(os.path.join(env.ws, "notes.txt"), "workspace notes\n")
    _write(os.path.join(env.host, "victim.txt"), VICTIM_TEXT)
    _write(os.path.join(env.host, "victim-hl.txt"), VICTIM_TEXT)
    _write(os.path.join(env.host, "victim-dir", "inner.txt"), VICTIM_TEXT)
    os.makedirs(os.path.join(env.host, "empty-dir"), exist_ok=True)
    _write(os.path.join(env.tmp_area, "victim.txt"), VICTIM_TEXT)
    _write(os.path.join(env.tmp_area, "keep.txt"), VICTIM_TEXT)
    # Links planted in the workspace, pointing outside it (row 2).
    os.symlink(os.path.join(env.host, "victim.txt"), os.path.join(env.ws, "link-file"))
    os.symlink(env.host, os.path.join(env.ws, "link-dir"))
    os.symlink(os.path.join(env.host, "created-through-link.txt"), os.path.join(env.ws, "dangling"))
    os.link(os.path.join(env.host, "victim-hl.txt"), os.path.join(env.ws, "hardlink"))
    # Fake credential stores (row 5); `.aws` is a symlink so its target must be hidden too.
    secrets = Secrets(
        contents=tuple(f"AUDIT-SECRET-{kind}-{tok}" for kind in ("SSH", "NETRC", "AWS", "ENV")),
        listed_name=f"id_listed_{tok}",
        public=f"AUDIT-PUBLIC-{tok}",
    )
    _write(os.path.join(env.home, ".ssh", "id_ed25519"), secrets.contents[0] + "\n", 0o600)
    _write(os.path.join(env.home, ".ssh", secrets.listed_name), "listed\n", 0o600)
    _write(
        os.path.join(env.home, ".netrc"),
        f"machine example.invalid login audit password {secrets.contents[1]}\n",
        0o600,
    )
    _write(os.path.join(env.home, "real-aws", "credentials"), secrets.contents[2] + "\n", 0o600)
    os.symlink("real-aws", os.path.join(env.home, ".aws"))
    _write(os.path.join(env.home, "public.txt"), secrets.public + "\n")
    _write(os.path.join(env.ws, "secrets", ".env"), secrets.contents[3] + "\n", 0o600)
    _write(os.path.join(env.ws, ".envrc"), "export AUDIT=1\n")
    _git_layout(env.ws, git)
    return secrets


def _git_layout(ws: str, git: str) -> None:
    gitdir = os.path.join(ws, ".git")
    if git == "none":
        return
    if git == "real":
        subprocess.run(["git", "init", "-q", ws], check=True, capture_output=True)
        subprocess.run(
            ["git", "-C", ws, "config", "user.email", "audit@example.invalid"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            ["git", "-C", ws, "config", "user.name", "audit"], check=True, capture_output=True
        )
        # The fan-out the executor makes once per repository (`git_import.fan_out`): made
        # ahead, so the guards see only what the command changed.
        fan_out(gitdir)
        return
    _write(os.path.join(gitdir, "HEAD"), "ref: refs/heads/main\n")
    os.makedirs(os.path.join(gitdir, "objects"), exist_ok=True)
    fan_out(gitdir)
    if git == "config-link":
        _write(os.path.join(ws, "real-config"), "[core]\n\tbare = false\n")
        os.symlink("../real-config", os.path.join(gitdir, "config"))
    else:
        _write(os.path.join(gitdir, "config"), "[core]\n\tbare = false\n")
    if git == "hooks-link":
        _write(os.path.join(ws, "real-hooks", "pre-push.sample"), "#!/bin/sh\n", 0o755)
        os.symlink("../real-hooks", os.path.join(gitdir, "hooks"))
    elif git != "no-hooks":
        _write(os.path.join(gitdir, "hooks", "pre-push.sample"), "#!/bin/sh\n", 0o755)


# -- guards: areas that must not change, compared from outside ------------------------------


def guard_paths(env: AttackEnv, *, workspace: bool | None = None) -> dict[str, str]:
    """Areas an attack must leave unchanged: outside the roots always, and the workspace
    too in read-only mode (``workspace`` overrides that)."""
    guards = {"host": env.host, "tmp": env.tmp_area}
    read_only = env.mode.value == "read-only"
    if workspace if workspace is not None else read_only:
        guards["ws"] = env.ws
    return guards


def protected_guards(ws: str, names: tuple[str, ...] = PROTECTED_PATHS) -> dict[str, str]:
    return {f"ws/{name}": os.path.join(ws, name) for name in names}


def placeholders(ws: str, names: tuple[str, ...] = PROTECTED_PATHS) -> set[str]:
    """First missing component of each protected name: the sandbox may create it, empty,
    as a mount point (a side effect of protecting it, not a write by the command)."""
    out: set[str] = set()
    for name in names:
        cur = ws
        for part in name.split("/"):
            cur = os.path.join(cur, part)
            if not os.path.lexists(cur):
                out.add(cur)
                break
    return out


def take(guards: dict[str, str]) -> dict[str, Snapshot]:
    return {label: snapshot(path) for label, path in guards.items()}


def compare(
    guards: dict[str, str],
    before: dict[str, Snapshot],
    allowed_placeholders: set[str] | frozenset[str] = frozenset(),
) -> list[str]:
    """Differences between ``before`` and now; an empty placeholder dir is not a change."""
    changes: list[str] = []
    for label, path in guards.items():
        after = snapshot(path)
        if (
            path in allowed_placeholders
            and not before[label]
            and set(after) == {"."}
            and after["."].kind == "dir"
        ):
            continue
        changes += snapshot_diff(before[label], after, label)
    return changes
