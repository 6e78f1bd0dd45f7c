"""Row 4: protected names inside a writable root (.git/hooks, .git/config, configured names)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

from bash_sandbox_audit import scenarios
from bash_sandbox_audit.attacks.common import (
    BEGIN,
    FILES,
    Render,
    attack,
    py,
    read_or_empty,
    scenario,
)
from bash_sandbox_audit.host_git import git, git_available, init_repo
from bash_sandbox_audit.layout import PROTECTED_PATHS
from bash_sandbox_audit.model import (
    BOTH_MODES,
    WORKSPACE_WRITE,
    Attack,
    AttackEnv,
    AttackSetup,
    Finding,
    Outcome,
    Verdict,
)
from policies import SandboxMode

# -- row 4: protected names inside a writable root ----------------------------------------


def protected_attack(
    id: str,
    title: str,
    template: str,
    *,
    git: str = "repo",
    extra: Callable[[AttackEnv], dict[str, Any]] | None = None,
    kwargs: dict[str, Any] | None = None,
    modes: frozenset[SandboxMode] = BOTH_MODES,
) -> Attack:
    return attack(
        id,
        4,
        title,
        "cd {{ws}}\n" + template,
        *FILES,
        git=git,
        protected=True,
        workspace_guard=None,
        extra=extra,
        kwargs=kwargs,
        modes=modes,
    )


def reported_repository(entry: Attack) -> Attack:
    """A repository the command makes itself (no `.git` before the run) has no path to
    cover: the must-hold is that it comes back with git's default control plane (no hook,
    nothing of the command's in its config) and that the result names it
    (`nested_repositories`). Created, kept as planted and not reported is an escape."""
    inner = entry.verify

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        finding = await inner(env, setup, outcome)
        if finding.verdict is not Verdict.ESCAPED:
            return finding
        facts = outcome.result.sandbox if outcome.result is not None else None
        made = os.path.join(env.ws, ".git")
        reported = facts is not None and made in facts.nested_repositories
        hooks = os.path.join(made, "hooks")
        planted = [
            p
            for p in (os.path.join(made, "config"), *_files_below(hooks))
            if "pwned" in read_or_empty(p) or os.path.dirname(p) == hooks
        ]
        if reported and not planted:
            return Finding(
                Verdict.CONTAINED,
                "a repository the command created: reported in nested_repositories and reset "
                "to git's default control plane (no hooks, nothing planted in its config)",
                finding.evidence,
            )
        if reported:
            return Finding(
                Verdict.NOT_ENFORCEABLE,
                "a repository the command creates carries its own config: reported in "
                "nested_repositories",
                finding.evidence,
            )
        return finding

    return dataclasses.replace(entry, verify=verify)


def _files_below(directory: str) -> list[str]:
    found: list[str] = []
    for top, _dirs, files in os.walk(directory):
        found += [os.path.join(top, f) for f in files]
    return found


def _extra_root(env: AttackEnv) -> dict[str, Any]:
    extra_root = env.path("extra")
    os.makedirs(os.path.join(extra_root, ".git", "hooks"), exist_ok=True)
    with open(os.path.join(extra_root, ".git", "config"), "w") as fh:
        fh.write("[core]\n")
    return {
        "guards": {
            "extra/.git/hooks": os.path.join(extra_root, ".git", "hooks"),
            "extra/.git/config": os.path.join(extra_root, ".git", "config"),
        },
        "executor_kwargs": {"writable_roots": (extra_root,)},
    }


ATTACKS: list[Attack] = [
    protected_attack(
        "row4-hook-create",
        "create .git/hooks/pre-commit",
        "echo 'echo pwned' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit",
    ),
    protected_attack(
        "row4-hook-overwrite",
        "overwrite or delete an existing hook",
        "echo pwned > .git/hooks/pre-push.sample; rm -f .git/hooks/pre-push.sample",
    ),
    protected_attack(
        "row4-config-write",
        "write .git/config (git config, append, overwrite)",
        "git config core.hooksPath /tmp/evil; echo '[core]' >> .git/config; "
        "echo pwned > .git/config",
    ),
    protected_attack(
        "row4-config-replace",
        "rename, delete or relink .git/config",
        "mv .git/config .git/config.old; rm -f .git/config; "
        "ln -sf /dev/null .git/config; echo pwned > .git/config",
    ),
    reported_repository(
        protected_attack(
            "row4-no-git-dir",
            "create .git/hooks/pre-commit and .git/config when .git does not exist",
            "mkdir -p .git/hooks && echo pwned > .git/hooks/pre-commit; "
            "echo '[core]' > .git/config",
            git="none",
        )
    ),
    protected_attack(
        "row4-hooks-dir-missing",
        "create .git/hooks when only it is missing",
        "mkdir .git/hooks; echo pwned > .git/hooks/pre-commit",
        git="no-hooks",
    ),
    protected_attack(
        "row4-hooks-replaced-by-symlink",
        "replace .git/hooks by a symlink to attacker hooks",
        "mkdir -p evil && echo pwned > evil/pre-commit; rm -rf .git/hooks; "
        "ln -sfn ../evil .git/hooks; mv .git/hooks .git/hooks.old; "
        "ln -sfn ../evil .git/hooks",
    ),
    protected_attack(
        "row4-git-dir-renamed",
        "rename .git away (or remove it) and recreate hooks and config",
        "mv .git .git-old; rm -rf .git; mkdir -p .git/hooks; "
        "echo pwned > .git/hooks/pre-commit; echo '[core]' > .git/config",
    ),
    protected_attack(
        "row4-config-symlink-planted",
        "replace a .git/config that is a symlink (the link, and its target)",
        "echo pwned >> real-config; rm -f .git/config; "
        "printf '[core]\\n\\thooksPath = /tmp/evil\\n' > .git/config",
        git="config-link",
        extra=lambda env: {"guards": {"ws/real-config": os.path.join(env.ws, "real-config")}},
    ),
    protected_attack(
        "row4-hooks-symlink-planted",
        "replace a .git/hooks that is a symlink (the link, and its target)",
        "echo pwned > real-hooks/pre-commit; rm -f .git/hooks; mkdir .git/hooks; "
        "echo pwned > .git/hooks/pre-commit",
        git="hooks-link",
        extra=lambda env: {"guards": {"ws/real-hooks": os.path.join(env.ws, "real-hooks")}},
    ),
    protected_attack(
        "row4-alias-paths",
        "reach hooks through ./, //, a new symlink, cd",
        "echo pwned > ./.git/./hooks/pre-commit; "
        "echo pwned > .git//hooks//pre-commit2; "
        "ln -s .git/hooks h && echo pwned > h/pre-commit3; "
        "cd .git/hooks && echo pwned > pre-commit4",
    ),
    protected_attack(
        "row4-configured-name",
        "write, delete, rename, chmod a configured protected name (.envrc)",
        "echo pwned > .envrc; chmod 777 .envrc; mv .envrc envrc.old; rm -f .envrc",
    ),
    protected_attack(
        "row4-configured-name-missing",
        "create a configured protected name that does not exist (deploy/secrets.env)",
        "mkdir -p deploy && echo pwned > deploy/secrets.env",
    ),
    protected_attack(
        "row4-extra-writable-root",
        "protected names inside an extra writable root",
        "echo pwned > {{root}}/extra/.git/hooks/pre-commit; "
        "echo pwned >> {{root}}/extra/.git/config",
        extra=_extra_root,
        modes=WORKSPACE_WRITE,
    ),
]


# -- .git/config replaced by the host (rename) while a command runs ---------------------------

PLANTED = "AUDIT-PLANTED"
WRITE_LOOP = """
import time
print("READY", flush=True)
deadline = time.time() + 25
line = "\\n[core]\\n\\tfsmonitor = {{planted}}\\n"
while time.time() < deadline:
    try:
        with open("{{ws}}/.git/config", "a") as fh:
            fh.write(line)
        print("wrote .git/config", flush=True)
    except OSError as exc:
        print("denied write .git/config:", exc, flush=True)
    print("TRY", flush=True)
    time.sleep(0.02)
"""


def _host_replaces_config(rounds: int) -> list[scenarios.HostAction]:
    """Alternately `git config` (lock file + rename) and an atomic rewrite by the host, each
    first recording what the config held after the command's previous tries."""

    def make(n: int) -> scenarios.HostAction:
        def act(env: AttackEnv, outcome: Outcome) -> None:
            path = os.path.join(env.ws, ".git", "config")
            text = read_or_empty(path)
            outcome.notes.setdefault("configs", []).append(text)
            if f"{PLANTED}-{env.token}" in text:  # proven: no need to go on
                outcome.notes["stop_acts"] = True
                return
            if n % 2 == 0:
                git(env, env.ws, "config", f"audit.round{n}", "host", check=False)
            else:
                tmp = path + ".audit-tmp"
                with open(tmp, "w") as fh:
                    fh.write(text + f"[audit]\n\trewrite{n} = host\n")
                os.replace(tmp, path)

        return act

    return [make(n) for n in range(rounds)]


def config_never_planted(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    seen: list[str] = [*outcome.notes.get("configs", [])]
    seen.append(read_or_empty(os.path.join(env.ws, ".git", "config")))
    planted = setup.data["planted"]
    hits = [n for n, text in enumerate(seen) if planted in text]
    return [f"the command's line was in the host's .git/config at look {hits[0]}"] if hits else []


def _config_premise(env: AttackEnv) -> dict[str, Any]:
    if why := git_available():
        return {"skip": why}
    init_repo(env, env.ws)
    return {"planted": f"{PLANTED}-{env.token}"}


def _write_loop(env: AttackEnv, render: Render) -> dict[str, Any]:
    return {
        "command": render(BEGIN + py(WRITE_LOOP)),
        "acts": _host_replaces_config(6),
        "timeout_ms": 30_000,
    }


ATTACKS += [
    scenario(
        "row4-config-replaced-while-running",
        4,
        "a command keeps writing .git/config while the host replaces it by rename "
        "(git config, atomic rewrite)",
        _write_loop,
        config_never_planted,
        git="none",
        extra=_config_premise,
        python=True,
        drive=scenarios.while_running,
        markers=("AUDIT-BEGIN", "READY"),
        modes=WORKSPACE_WRITE,
    ),
]

# A configured protected name outside .git, covered where it lies: the host replaces it (an
# editor's atomic save), then says "go" half a second later; only then does the command
# append. It proves the executor stops a command whose cover the host's rename detached.
GATED_APPEND = """
import os, time
go = "{{ws}}/audit-go"
print("READY", flush=True)
deadline = time.time() + 25
while time.time() < deadline:
    if os.path.exists(go):
        try:
            with open("{{ws}}/.envrc", "a") as fh:
                fh.write("curl {{planted}} | sh\\n")
            print("wrote .envrc", flush=True)
        except OSError as exc:
            print("denied write .envrc:", exc, flush=True)
    print("TRY", flush=True)
    time.sleep(0.05)
"""


def _host_saves_envrc(env: AttackEnv, outcome: Outcome) -> None:
    path = os.path.join(env.ws, ".envrc")
    tmp = path + ".audit-tmp"
    with open(tmp, "w") as fh:
        fh.write("export AUDIT=2\n")
    os.replace(tmp, path)
    time.sleep(0.5)
    with open(os.path.join(env.ws, "audit-go"), "w"):
        pass


def envrc_never_planted(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    text = read_or_empty(os.path.join(env.ws, ".envrc"))
    return (
        ["the command's line is in the host's new .envrc"] if setup.data["planted"] in text else []
    )


def _gated_append(env: AttackEnv, render: Render) -> dict[str, Any]:
    return {
        "command": render(BEGIN + py(GATED_APPEND)),
        "acts": [_host_saves_envrc],
        "tries": 20,  # the act takes half a second (ten TRY lines): ten more after the go
        "timeout_ms": 30_000,
        "act_timeout_s": 3,
    }


ATTACKS += [
    scenario(
        "row4-configured-name-replaced-while-running",
        4,
        "the host saves .envrc atomically while a command runs; the command appends to it "
        "after the save",
        _gated_append,
        envrc_never_planted,
        extra=lambda env: {"planted": f"{PLANTED}-{env.token}"},
        kwargs={"protected_paths": PROTECTED_PATHS},
        python=True,
        drive=scenarios.while_running,
        markers=("AUDIT-BEGIN", "READY"),
        modes=WORKSPACE_WRITE,
    ),
]
