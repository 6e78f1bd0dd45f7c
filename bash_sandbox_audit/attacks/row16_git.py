"""Row 16: make host tools run the command's code later, through git's control plane.

Each attack starts from a real repository the audit made (one commit on ``main``, the
default protected names in place), lets a confined command write one of git's control files,
and then runs the *host's* git the way its user would (`git status`, `git commit`,
`git fetch`, `git config`). The proof is outside the sandbox: a payload script (which only
appends to a marker under the attack's own directory) that host git must never run, and
host victim files that host git must never write through a planted symlink.

A repository the command creates (no `.git` before the run) has no path to overlay: after
the command the executor resets it to git's default control plane (`git_created.py`), and
the result reports it (`SandboxFacts.nested_repositories`). The must-hold is that host git
there runs nothing the command planted and the command's commits are still there.

The positive controls are the git work that must keep working in `workspace-write`,
checked with `git log` on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from bash_sandbox_audit import drives, scenarios
from bash_sandbox_audit.attacks.common import BEGIN, Render, judged_by, py, read_or_empty, scenario
from bash_sandbox_audit.checks import (
    Check,
    guards_unchanged,
    no_escape_lines,
    verify_attack,
    verify_control,
)
from bash_sandbox_audit.host_git import (
    Payload,
    git,
    git_available,
    init_repo,
    make_payload,
    set_identity,
)
from bash_sandbox_audit.layout import VICTIM_TEXT
from bash_sandbox_audit.model import (
    WORKSPACE_WRITE,
    Attack,
    AttackEnv,
    AttackSetup,
    Finding,
    Outcome,
    audit_error,
    contained,
    escaped,
)

HostGit = tuple[str, tuple[str, ...]]  # (where, relative to the attack's root; git arguments)
STATUS: HostGit = ("ws", ("status", "--porcelain"))
COMMIT: HostGit = ("ws", ("commit", "-q", "--allow-empty", "-m", "host commit"))


def host_git(where: str, *args: str) -> scenarios.Step:
    """The user's own git command, run on the host after the confined command."""

    def act(env: AttackEnv, outcome: Outcome) -> None:
        done = git(env, env.path(where), *args, check=False)
        outcome.notes.setdefault("host_git", []).append(
            f"git {' '.join(args)} in {where}: exit {done.returncode}"
        )

    return scenarios.host(act)


def payload_never_ran(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    payload: Payload = setup.data["payload_info"]
    return [f"host git ran the command's code: {line}" for line in payload.ran()]


def _repo(env: AttackEnv) -> dict[str, Any]:
    """The common premise: a real repository in the workspace and the payload."""
    if why := git_available():
        return {"skip": why}
    init_repo(env, env.ws)
    payload = make_payload(env)
    return {"payload": payload.script, "payload_info": payload}


def git_attack(
    id: str,
    title: str,
    template: str,
    *,
    host: Sequence[HostGit] = (STATUS,),
    premise: Callable[[AttackEnv, dict[str, Any]], None] | None = None,
    checks: Sequence[Check] = (),
) -> Attack:
    """Plant with one confined command, then run the host git commands ``host``."""

    def extra(env: AttackEnv) -> dict[str, Any]:
        values = _repo(env)
        if "skip" not in values and premise is not None:
            premise(env, values)
        return values

    def build(env: AttackEnv, render: Render) -> dict[str, Any]:
        command = render(BEGIN + "cd {{ws}}\n" + template)
        return {
            "steps": [
                scenarios.confined(command),
                *(host_git(where, *args) for where, args in host),
            ]
        }

    return scenario(
        id,
        16,
        title,
        build,
        payload_never_ran,
        guards_unchanged,
        no_escape_lines,
        *checks,
        git="none",
        extra=extra,
        modes=WORKSPACE_WRITE,
    )


FSMONITOR = "printf '[core]\\n\\tfsmonitor = {{payload}} %s\\n' > %s"
# A copy of the repository's own common dir, whose config runs the payload.
EVIL_COMMON = (
    "mkdir -p {{ws}}/evil-common && cp -r .git/objects .git/refs .git/HEAD {{ws}}/evil-common/ "
    "&& " + FSMONITOR % ("commondir", "{{ws}}/evil-common/config") + "\n"
)


def _worktree_config(env: AttackEnv, values: dict[str, Any]) -> None:
    git(env, env.ws, "config", "core.repositoryformatversion", "1")
    git(env, env.ws, "config", "extensions.worktreeConfig", "true")


def _submodule(env: AttackEnv, values: dict[str, Any]) -> None:
    origin = env.path("sub-origin")
    init_repo(env, origin)
    git(env, env.ws, "submodule", "add", "-q", origin, "x")
    git(env, env.ws, "commit", "-q", "-m", "add submodule x")


def _linked_worktree(env: AttackEnv, values: dict[str, Any]) -> None:
    git(env, env.ws, "worktree", "add", "-q", "-b", "linked", env.path("linked"))


def _husky(env: AttackEnv, values: dict[str, Any]) -> None:
    # husky >= 9 points core.hooksPath at `.husky/_`, a directory inside the workspace.
    os.makedirs(os.path.join(env.ws, ".husky", "_"))
    git(env, env.ws, "config", "core.hooksPath", ".husky/_")


def _include(env: AttackEnv, values: dict[str, Any]) -> None:
    # Relative include paths are relative to the including file: ws/.gitconfig.local.
    git(env, env.ws, "config", "include.path", "../.gitconfig.local")


def _include_if(env: AttackEnv, values: dict[str, Any]) -> None:
    git(env, env.ws, "config", f"includeIf.gitdir:{env.ws}/.path", "../.gitconfig.cond")


def _victim(name: str) -> Callable[[AttackEnv, dict[str, Any]], None]:
    """A host file (in the guarded ``host`` area) that host git must not write through."""

    def premise(env: AttackEnv, values: dict[str, Any]) -> None:
        with open(os.path.join(env.host, name), "w") as fh:
            fh.write(VICTIM_TEXT)

    return premise


def _origin(env: AttackEnv, values: dict[str, Any]) -> None:
    _victim("fetchhead-victim.txt")(env, values)
    origin = env.path("origin.git")
    git(env, env.root, "clone", "-q", "--bare", env.ws, origin)
    git(env, env.ws, "remote", "add", "origin", origin)


def _nested_repositories(env: AttackEnv, values: dict[str, Any]) -> None:
    """Repositories the user already has inside the workspace (a folder of repositories, a
    vendored checkout three levels down), used by the host's git."""
    for path in ("lib", "packages/api/vendor"):
        init_repo(env, os.path.join(env.ws, path))


# Repositories the search once missed: deeper than three levels, where pip checks out an
# editable VCS install, and behind a `.git` symlink to a git dir not named `.git`.
DEEP, EDITABLE, LINKED = "deep/a/b/c/d/repo", ".venv/src/pkg", "linked"


def _unusual_repositories(env: AttackEnv, values: dict[str, Any]) -> None:
    init_repo(env, os.path.join(env.ws, DEEP))
    init_repo(env, os.path.join(env.ws, EDITABLE))
    store = os.path.join(env.ws, "store")
    init_repo(env, store)
    os.rename(os.path.join(store, ".git"), os.path.join(store, "real.git"))
    os.makedirs(os.path.join(env.ws, LINKED))
    os.symlink("../store/real.git", os.path.join(env.ws, LINKED, ".git"))
    git(env, os.path.join(env.ws, LINKED), "config", "core.worktree", os.path.join(env.ws, LINKED))


def _husky9(env: AttackEnv, values: dict[str, Any]) -> None:
    # husky 9: core.hooksPath=.husky/_, whose hooks run the user's `.husky/<hook>`.
    hook = os.path.join(env.ws, ".husky", "_", "pre-commit")
    os.makedirs(os.path.dirname(hook))
    with open(hook, "w") as fh:
        fh.write('#!/bin/sh\nsh "$(dirname "$0")/../pre-commit"\n')
    os.chmod(hook, 0o755)  # noqa: S103 - a hook git must run
    with open(os.path.join(env.ws, ".husky", "pre-commit"), "w") as fh:
        fh.write("true\n")
    git(env, env.ws, "config", "core.hooksPath", ".husky/_")


def _pre_commit(env: AttackEnv, values: dict[str, Any]) -> None:
    # `pre-commit install`'s hook runs the config's local hook: scripts/check.sh.
    hook = os.path.join(env.ws, ".git", "hooks", "pre-commit")
    with open(hook, "w") as fh:
        fh.write("#!/bin/sh\n# pre-commit hook-impl --config=.pre-commit-config.yaml\n"
                 "sh scripts/check.sh\n")  # fmt: skip
    os.chmod(hook, 0o755)  # noqa: S103 - a hook git must run
    with open(os.path.join(env.ws, ".pre-commit-config.yaml"), "w") as fh:
        fh.write("repos:\n- repo: local\n  hooks:\n  - id: c\n    entry: scripts/check.sh\n")
    os.makedirs(os.path.join(env.ws, "scripts"))
    with open(os.path.join(env.ws, "scripts", "check.sh"), "w") as fh:
        fh.write("true\n")


def _lefthook(env: AttackEnv, values: dict[str, Any]) -> None:
    # lefthook's installed hook merges `lefthook-local.yml` in when it exists (here: sources it).
    hook = os.path.join(env.ws, ".git", "hooks", "pre-commit")
    with open(hook, "w") as fh:
        fh.write("#!/bin/sh\n# lefthook run pre-commit\n"
                 "[ -f lefthook-local.yml ] && sh lefthook-local.yml\nexit 0\n")  # fmt: skip
    os.chmod(hook, 0o755)  # noqa: S103 - a hook git must run
    with open(os.path.join(env.ws, "lefthook.yml"), "w") as fh:
        fh.write("pre-commit:\n  commands: {}\n")


def _bare_remote(env: AttackEnv, values: dict[str, Any]) -> None:
    # A bare repository in the workspace used as a local remote: a host push runs its hooks.
    git(env, env.root, "clone", "-q", "--bare", env.ws, os.path.join(env.ws, "remote.git"))


def _info_guard(env: AttackEnv, values: dict[str, Any]) -> None:
    values["guards"] = {"ws/.git/info": os.path.join(env.ws, ".git", "info")}


# -- git writing to a file outside while it runs: .git/config.lock ------------------------

# Watches .git with inotify; when host git creates config.lock it opens it (append) and keeps
# the descriptor, writing the payload at once and again after host git renamed the lock over
# .git/config (the descriptor then refers to the new config). One TRY per rename seen.
LOCK_RACE = """
IN_CREATE, IN_MOVED_FROM = 0x100, 0x40
ino = libc.inotify_init1(0)
if ino < 0 or libc.inotify_add_watch(ino, b"{{ws}}/.git", IN_CREATE | IN_MOVED_FROM) < 0:
    print("denied inotify on .git:", os.strerror(ctypes.get_errno()), flush=True)
print("READY", flush=True)
payload = b"\\n[core]\\n\\tfsmonitor = {{payload}} config-lock\\n"
held = []
while ino >= 0:
    data = os.read(ino, 4096)
    i = 0
    while i < len(data):
        _wd, mask, _cookie, size = struct.unpack_from("iIII", data, i)
        name = data[i + 16:i + 16 + size].rstrip(b"\\0")
        i += 16 + size
        if name != b"config.lock":
            continue
        if mask & IN_CREATE:
            try:
                fd = os.open("{{ws}}/.git/config.lock", os.O_WRONLY | os.O_APPEND)
                held.append(fd)
                os.write(fd, payload)
                print("wrote into config.lock", flush=True)
            except OSError as exc:
                print("denied open config.lock:", exc, flush=True)
        if mask & IN_MOVED_FROM:
            for fd in held:
                try:
                    os.write(fd, payload)
                    print("wrote through a held config.lock descriptor", flush=True)
                except OSError as exc:
                    print("denied write through the held descriptor:", exc, flush=True)
            held.clear()
            print("TRY", flush=True)
"""


def _config_rounds(rounds: int) -> list[scenarios.HostAction]:
    """Host `git config` calls (lock file + rename), each followed by a look at the result."""

    def make(n: int) -> scenarios.HostAction:
        def act(env: AttackEnv, outcome: Outcome) -> None:
            git(env, env.ws, "config", f"audit.round{n}", f"value{n}", check=False)
            with open(os.path.join(env.ws, ".git", "config")) as fh:
                text = fh.read()
            outcome.notes.setdefault("configs", []).append(text)
            # One win is enough (git keeps the line from now on); the race is retried
            # otherwise, since a round can be lost to timing.
            outcome.notes["stop_acts"] = "config-lock" in text

        return act

    return [make(n) for n in range(rounds)]


def _host_status(env: AttackEnv, outcome: Outcome) -> None:
    git(env, env.ws, "status", "--porcelain", check=False)


def config_only_host_written(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    """Every config the host observed after its own write holds only what git wrote."""
    seen: list[str] = outcome.notes.get("configs", [])
    bad = [n for n, text in enumerate(seen) if "fsmonitor" in text or setup.data["payload"] in text]
    if bad:
        return [f"host .git/config held the command's payload after host write {bad[0]}"]
    return []


def _lock_race() -> Attack:
    def build(env: AttackEnv, render: Render) -> dict[str, Any]:
        return {
            "command": render(BEGIN + py(LOCK_RACE)),
            "acts": _config_rounds(12),
            "tries": 1,
            "act_timeout_s": 3,
            "timeout_ms": 30_000,
        }

    def extra(env: AttackEnv) -> dict[str, Any]:
        return _repo(env)

    async def verify(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
        if not outcome.notes.get("ready"):
            return audit_error("premise failed: the racing command never got ready")
        inner = verify_attack(
            config_only_host_written,
            payload_never_ran,
            guards_unchanged,
            no_escape_lines,
            markers=("AUDIT-BEGIN", "READY"),
        )
        # The host's next git command: a planted fsmonitor would run now.
        await asyncio.to_thread(_host_status, env, outcome)
        return await inner(env, setup, outcome)

    return scenario(
        "row16-config-lock-race",
        16,
        "hold host git's .git/config.lock open (inotify) while the host runs `git config`",
        build,
        git="none",
        extra=extra,
        modes=WORKSPACE_WRITE,
        python=True,
        drive=scenarios.while_running,
        verify=verify,
    )


# -- the nested repository: no path-based fix, so it must be reported -------------------------

NESTED = (
    "git init -q inner && git -C inner config core.fsmonitor '{{payload}} nested' && "
    "git -C inner -c user.name=a -c user.email=a@example.invalid commit -q --allow-empty -m x "
    "&& git update-index --add --cacheinfo 160000,$(git -C inner rev-parse HEAD),inner "
    "&& echo NESTED-MADE\n"
)


def _nested_finding(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> Finding:
    if outcome.error is not None:
        return audit_error(f"the run raised {type(outcome.error).__name__}: {outcome.error}")
    if outcome.result is None or "AUDIT-BEGIN" not in outcome.all_output():
        return audit_error("premise failed: the attack did not run")
    payload: Payload = setup.data["payload_info"]
    ran = payload.ran()
    if not os.path.lexists(os.path.join(env.ws, "inner", ".git")):
        return contained("no nested repository was created")
    facts = outcome.result.sandbox
    reported = facts.nested_repositories if facts is not None else ()
    if ran:
        return escaped(
            "host git ran the created repository's core.fsmonitor",
            [f"host git status in the superproject ran it: {line}" for line in ran],
        )
    if any(p.rstrip("/").endswith("inner") for p in reported):
        return contained("reported in nested_repositories, reset to git's default control plane")
    return escaped(
        "a nested repository with its own core.fsmonitor is not reported in nested_repositories",
        [f"facts.nested_repositories = {list(reported)}"],
    )


def _nested() -> Attack:
    def build(env: AttackEnv, render: Render) -> dict[str, Any]:
        return {
            "steps": [
                scenarios.confined(render(BEGIN + "cd {{ws}}\n" + NESTED)),
                host_git(STATUS[0], *STATUS[1]),
            ]
        }

    return scenario(
        "row16-nested-repository",
        16,
        "create a nested repository with its own core.fsmonitor and a gitlink in the index",
        build,
        git="none",
        extra=_repo,
        modes=WORKSPACE_WRITE,
        verify=judged_by(_nested_finding),
    )


def _gitfile_elsewhere(env: AttackEnv) -> dict[str, Any]:
    """A host directory outside every root, shaped like a git directory, that a `.git` file
    in the workspace will name (the host area is guarded: nothing may appear in it)."""
    if why := git_available():
        return {"skip": why}
    init_repo(env, env.ws)
    victim = os.path.join(env.host, "gitdir-victim")
    os.makedirs(os.path.join(victim, "refs", "heads"))
    with open(os.path.join(victim, "HEAD"), "w") as fh:
        fh.write("ref: refs/heads/main\n")
    return {}


# Where the planted `.git` file leads (the directory the copy-back would write), and how.
GITFILE_PLANTS = {
    # The `.git` file names a host directory outside the roots itself.
    "elsewhere": (
        "{{host}}/gitdir-victim",
        "printf 'gitdir: {{host}}/gitdir-victim\\n' > sub/.git\n",
    ),
    # It names a git dir the command made inside the workspace, whose commondir names an
    # ancestor of the workspace (the attack's own root: a worktree's dir lies inside it).
    "commondir": (
        "{{root}}",
        "mkdir -p evil-gitdir && echo {{root}} > evil-gitdir/commondir && "
        "printf 'gitdir: {{ws}}/evil-gitdir\\n' > sub/.git\n",
    ),
}
GIT_STATE = ("HEAD", "refs/heads/x", "objects/aa/b")


def _gitfile_steps(how: str) -> Callable[[AttackEnv, Render], dict[str, Any]]:
    victim, plant = GITFILE_PLANTS[how]
    write = "".join(
        f"mkdir -p $(dirname {victim}/{name}) ; echo planted > {victim}/{name}\n"
        for name in GIT_STATE
    )

    def build(env: AttackEnv, render: Render) -> dict[str, Any]:
        return {
            "victim": render(victim),
            "steps": [
                scenarios.confined(render(BEGIN + "cd {{ws}}\nmkdir -p sub\n" + plant)),
                scenarios.confined(render(BEGIN + "cd {{ws}}/sub\n" + write)),
            ],
        }

    return build


def no_git_state_planted(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    victim: str = setup.data["victim"]
    found = []
    for name in GIT_STATE:
        path = os.path.join(victim, name)
        if "planted" in read_or_empty(path):
            found.append(f"the command's {name} reached the host at {path}")
    return found


NESTED_HOST: Sequence[HostGit] = (
    ("ws/lib", ("status", "--porcelain")),
    ("ws/lib", ("commit", "-q", "--allow-empty", "-m", "host commit")),
    ("ws/packages/api/vendor", ("status", "--porcelain")),
)


def _log_has(where: str, rev: str, *subjects: str) -> Check:
    """Host `git log` of ``rev`` (in ``where``) shows every commit subject."""

    def check(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
        done = git(env, env.path(where), "log", "--format=%s", rev, "--", check=False)
        shown = done.stdout.splitlines()
        return [f"host git log {rev} lacks the commit {s!r}" for s in subjects if s not in shown]

    return check


ATTACKS: list[Attack] = [
    *(
        scenario(
            f"row16-gitfile-{how}",
            16,
            "write a `.git` file naming a host directory outside the roots"
            + (" through a planted git dir's commondir" if how == "commondir" else "")
            + ", then write git state (HEAD, refs, objects) there from the next command",
            _gitfile_steps(how),
            no_git_state_planted,
            guards_unchanged,
            no_escape_lines,
            git="none",
            extra=_gitfile_elsewhere,
            modes=WORKSPACE_WRITE,
        )
        for how in GITFILE_PLANTS
    ),
    git_attack(
        "row16-nested-repository-config",
        "write the config and hooks of repositories already nested in the workspace "
        "(ws/lib, three levels down), by append and by replacing the file",
        FSMONITOR
        % ("nested-config", "lib/.git/config.tmp")
        + " && cat lib/.git/config.tmp >> lib/.git/config\n"
        "git -C packages/api/vendor config core.fsmonitor '{{payload}} nested-git-config'\n"
        "printf '#!/bin/sh\\n{{payload}} nested-hook\\n' > lib/.git/hooks/pre-commit && "
        "chmod +x lib/.git/hooks/pre-commit\n",
        host=NESTED_HOST,
        premise=_nested_repositories,
    ),
    git_attack(
        "row16-nested-repository-moved",
        "rename a nested repository's directory away and plant a fresh .git at its path",
        "{{py}} -c \"import os; os.rename('lib', 'lib-old')\"; "
        "{{py}} -c \"import os; os.rename('lib/.git', 'lib/.git-old')\"; "
        "git init -q lib && "
        + FSMONITOR % ("nested-moved", "lib/.git/config.new")
        + " && cat lib/.git/config.new >> lib/.git/config\n",
        host=NESTED_HOST[:2],
        premise=_nested_repositories,
    ),
    git_attack(
        "row16-deep-repository",
        "write the config of repositories deeper than three levels, in .venv/src (pip's "
        "editable checkouts) and behind a .git symlink",
        "".join(
            f"printf '[core]\\n\\tfsmonitor = {{{{payload}}}} {name}\\n' >> {path}/.git/config\n"
            for name, path in (("deep", DEEP), ("venv-src", EDITABLE), ("git-symlink", LINKED))
        ),
        host=tuple(("ws/" + p, ("status", "--porcelain")) for p in (DEEP, EDITABLE, LINKED)),
        premise=_unusual_repositories,
    ),
    git_attack(
        "row16-created-repository",
        "create a repository whose config (core.fsmonitor, an alias, hooksPath) and hooks run "
        "code, with a commit the user keeps",
        "git init -q made && git -C made config core.fsmonitor '{{payload}} created-fsmonitor' "
        "&& git -C made config core.hooksPath .githooks && mkdir -p made/.githooks && "
        "for d in made/.git/hooks made/.githooks; do "
        "printf '#!/bin/sh\\n{{payload}} created-hook\\n' > $d/pre-commit; "
        "chmod +x $d/pre-commit; done && "
        "git -C made -c core.hooksPath=/dev/null -c user.name=a -c user.email=a@b "
        "commit -q --allow-empty -m inside\n",
        host=(
            ("ws/made", ("status", "--porcelain")),
            ("ws/made", ("commit", "-q", "--allow-empty", "-m", "host")),
        ),
        checks=(_log_has("ws/made", "HEAD", "host", "inside"),),
    ),
    git_attack(
        "row16-hook-chain-husky",
        "edit the file husky's installed hook runs (.husky/pre-commit behind .husky/_)",
        "echo '{{payload}} husky-chain' >> .husky/pre-commit\n",
        host=(COMMIT,),
        premise=_husky9,
    ),
    git_attack(
        "row16-hook-chain-pre-commit",
        "edit the script a pre-commit local hook runs (entry: scripts/check.sh)",
        "echo '{{payload}} pre-commit-chain' >> scripts/check.sh\n",
        host=(COMMIT,),
        premise=_pre_commit,
    ),
    git_attack(
        "row16-hook-chain-lefthook",
        "create the lefthook-local.yml lefthook's installed hook merges in (missing before)",
        "echo '{{payload}} lefthook-chain' > lefthook-local.yml\n",
        host=(COMMIT,),
        premise=_lefthook,
    ),
    git_attack(
        "row16-bare-repository",
        "plant a post-receive hook and core.fsmonitor in a bare repository of the workspace, "
        "and create a bare repository with one; the host pushes to both",
        "".join(
            f"{init}printf '#!/bin/sh\\n{{{{payload}}}} bare-hook\\n' > {d}/hooks/post-receive"
            f" && chmod +x {d}/hooks/post-receive\n"
            for init, d in (("", "remote.git"), ("git init -q --bare made.git && ", "made.git"))
        )
        + "printf '[core]\\n\\tfsmonitor = {{payload}} bare-config\\n' >> remote.git/config\n",
        host=(
            ("ws", ("push", "-q", "remote.git", "HEAD:refs/heads/pushed")),
            ("ws", ("push", "-q", "made.git", "HEAD:refs/heads/pushed")),
            ("ws/remote.git", ("log", "-1")),
        ),
        premise=_bare_remote,
    ),
    git_attack(
        "row16-rebase-exec",
        "stop an interactive rebase whose todo runs code (`exec`) and a custom merge strategy; "
        "the host continues it",
        "echo 2 > second && git add second && git commit -qm second\n"
        "GIT_SEQUENCE_EDITOR=\"sed -i '1i break'\" "
        "git rebase -q -i --exec '{{payload}} rebase-exec' HEAD~1\n"
        "echo evil-strategy > .git/rebase-merge/strategy\n",
        host=(("ws", ("rebase", "--continue")), STATUS),
    ),
    git_attack(
        "row16-commondir",
        "write .git/commondir pointing at a planted common dir whose config runs code",
        EVIL_COMMON + "echo {{ws}}/evil-common > .git/commondir\n",
    ),
    git_attack(
        "row16-config-worktree",
        "write .git/config.worktree (the repository has extensions.worktreeConfig)",
        FSMONITOR % ("config-worktree", ".git/config.worktree")
        + "\ngit config --worktree core.fsmonitor '{{payload}} git-config-worktree'\n",
        premise=_worktree_config,
    ),
    git_attack(
        "row16-modules",
        "write a submodule's .git/modules/x/config and hooks",
        "git -C x config core.fsmonitor '{{payload}} modules-config'\n"
        + FSMONITOR % ("modules", ".git/modules/x/config.tmp")
        + " && cat .git/modules/x/config.tmp >> .git/modules/x/config\n"
        "mkdir -p .git/modules/x/hooks && printf '#!/bin/sh\\n{{payload}} modules-hook\\n' "
        "> .git/modules/x/hooks/post-checkout && chmod +x .git/modules/x/hooks/post-checkout\n",
        host=(STATUS, ("ws/x", ("status", "--porcelain")), ("ws", ("submodule", "update", "-f"))),
        premise=_submodule,
    ),
    git_attack(
        "row16-worktrees",
        "rewrite a linked worktree's .git/worktrees/x/commondir to a planted common dir",
        EVIL_COMMON + "echo {{ws}}/evil-common > .git/worktrees/linked/commondir\n",
        host=(("linked", ("status", "--porcelain")),),
        premise=_linked_worktree,
    ),
    git_attack(
        "row16-info",
        "write .git/info/ (exclude, attributes, sparse-checkout)",
        "mkdir -p .git/info; echo '*' >> .git/info/exclude; "
        "echo '* filter=audit' > .git/info/attributes; echo /none > .git/info/sparse-checkout\n",
        premise=_info_guard,
    ),
    git_attack(
        "row16-hookspath-target",
        "plant a hook in the core.hooksPath target inside the workspace (husky's .husky/_)",
        "printf '#!/bin/sh\\n{{payload}} husky-pre-commit\\n' > .husky/_/pre-commit && "
        "chmod +x .husky/_/pre-commit\n",
        host=(COMMIT,),
        premise=_husky,
    ),
    git_attack(
        "row16-include-path-target",
        "write the target of an include.path inside the workspace",
        FSMONITOR % ("include-path", ".gitconfig.local") + "\n",
        premise=_include,
    ),
    git_attack(
        "row16-include-if-target",
        "write the target of an includeIf.gitdir inside the workspace",
        FSMONITOR % ("include-if", ".gitconfig.cond") + "\n",
        premise=_include_if,
    ),
    git_attack(
        "row16-symlink-commit-editmsg",
        "symlink .git/COMMIT_EDITMSG to a host file, then the host commits",
        "ln -sfn {{host}}/editmsg-victim.txt .git/COMMIT_EDITMSG\n",
        host=(COMMIT,),
        premise=_victim("editmsg-victim.txt"),
    ),
    git_attack(
        "row16-symlink-logs-head",
        "symlink .git/logs/HEAD to a host file, then the host commits",
        "mkdir -p .git/logs && rm -f .git/logs/HEAD && ln -s {{host}}/reflog-victim.txt "
        ".git/logs/HEAD\n",
        host=(COMMIT,),
        premise=_victim("reflog-victim.txt"),
    ),
    git_attack(
        "row16-symlink-fetch-head",
        "symlink .git/FETCH_HEAD to a host file, then the host fetches",
        "ln -sfn {{host}}/fetchhead-victim.txt .git/FETCH_HEAD\n",
        host=(("ws", ("fetch", "-q", "origin")),),
        premise=_origin,
    ),
    _lock_race(),
    _nested(),
]


# -- positive controls: git work that must keep working in workspace-write -------------------


def git_control(
    id: str,
    title: str,
    template: str,
    marker: str,
    *checks: Check,
    premise: Callable[[AttackEnv], dict[str, Any]] | None = None,
) -> Attack:
    """Run ``template`` confined in the repository; ``premise`` may build another layout."""

    def build(env: AttackEnv, render: Render) -> dict[str, Any]:
        return {"command": render(BEGIN + "cd {{ws}}\n" + template)}

    def extra(env: AttackEnv) -> dict[str, Any]:
        if why := git_available():
            return {"skip": why}
        if premise is not None:
            return premise(env)
        init_repo(env, env.ws)
        return {}

    return scenario(
        id,
        16,
        title,
        build,
        git="none",
        extra=extra,
        modes=WORKSPACE_WRITE,
        drive=drives.foreground,
        verify=verify_control("AUDIT-BEGIN", marker, checks=checks),
        kind="control",
    )


def _linked_workspace(env: AttackEnv) -> dict[str, Any]:
    """The workspace is a linked worktree (its .git is a file) of a repository outside it."""
    main = env.path("mainrepo")
    init_repo(env, main)
    with _layout_moved_aside(env):
        git(env, main, "worktree", "add", "-q", "-b", "wsbranch", env.ws)
    return {}


def _submodule_workspace(env: AttackEnv) -> dict[str, Any]:
    """The workspace is a submodule checkout (its .git is a file) of a superproject whose
    worktree is the attack's root; everything but the workspace is ignored there."""
    origin = env.path("sub-origin")
    init_repo(env, origin)
    init_repo(env, env.root, commit=False)
    with open(env.path(".gitignore"), "w") as fh:
        fh.write("/*\n!/.gitignore\n!/.gitmodules\n!/ws\n")
    git(env, env.root, "add", ".gitignore")
    git(env, env.root, "commit", "-q", "-m", "superproject")
    with _layout_moved_aside(env):
        git(env, env.root, "submodule", "add", "-q", origin, "ws")
        git(env, env.root, "commit", "-q", "-m", "add the workspace as a submodule")
        set_identity(env, env.ws)
    return {}


@contextlib.contextmanager
def _layout_moved_aside(env: AttackEnv) -> Iterator[None]:
    """git creates the workspace itself: the standard layout waits next to it, then moves in
    (untracked, as in any checkout)."""
    aside = env.ws + "-layout"
    os.rename(env.ws, aside)
    yield
    for name in os.listdir(aside):
        os.rename(os.path.join(aside, name), os.path.join(env.ws, name))
    os.rmdir(aside)


CONTROLS: list[Attack] = [
    git_control(
        "row16-control-branch-stash-rebase",
        "git checkout -b, commit, stash, stash pop and rebase in the workspace",
        "git checkout -q -b feature && echo f > f.txt && git add f.txt && "
        "git commit -q -m feature-work && git checkout -q main && echo m > m.txt && "
        "git add m.txt && git commit -q -m main-work && echo more >> m.txt && git stash -q && "
        "git stash pop -q && git commit -q -am stashed-work && git checkout -q feature && "
        "git rebase -q main && echo GIT-FLOW-OK\n",
        "GIT-FLOW-OK",
        _log_has("ws", "feature", "feature-work", "main-work", "stashed-work"),
    ),
    git_control(
        "row16-control-worktree-add",
        "git worktree add inside the workspace, and commit there",
        "git worktree add -q -b wt-branch wt2 && echo w > wt2/w.txt && git -C wt2 add w.txt && "
        "git -C wt2 commit -q -m in-worktree && echo WORKTREE-OK\n",
        "WORKTREE-OK",
        _log_has("ws", "wt-branch", "in-worktree"),
    ),
    git_control(
        "row16-control-linked-worktree-commit",
        "commit inside a workspace that is a linked worktree (.git is a file)",
        "echo x > x.txt && git add x.txt && git commit -q -m in-linked-worktree && "
        "echo LINKED-COMMIT-OK\n",
        "LINKED-COMMIT-OK",
        _log_has("mainrepo", "wsbranch", "in-linked-worktree"),
        premise=_linked_workspace,
    ),
    git_control(
        "row16-control-submodule-commit",
        "commit inside a workspace that is a submodule checkout (.git is a file)",
        "echo s > s.txt && git add s.txt && git commit -q -m in-submodule && "
        "echo SUBMODULE-COMMIT-OK\n",
        "SUBMODULE-COMMIT-OK",
        _log_has("ws", "HEAD", "in-submodule"),
        premise=_submodule_workspace,
    ),
]
