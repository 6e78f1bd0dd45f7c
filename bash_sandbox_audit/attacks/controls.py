"""Positive controls: what the threat model says stays allowed must still work."""

from __future__ import annotations

import os
import shutil
import subprocess

from bash_sandbox_audit import drives
from bash_sandbox_audit.attacks.common import (
    control,
    read_or_empty,
)
from bash_sandbox_audit.layout import (
    VICTIM_TEXT,
    Secrets,
)
from bash_sandbox_audit.model import (
    WORKSPACE_WRITE,
    Attack,
    AttackEnv,
    AttackSetup,
    Outcome,
)

# -- positive controls ------------------------------------------------------------------------


def public_readable(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    secrets: Secrets = setup.data["secrets"]
    ok = secrets.public in outcome.all_output() and VICTIM_TEXT in outcome.all_output()
    return [] if ok else ["files outside deny_read were not readable"]


def workspace_written(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    moved = os.path.join(env.ws, "dir", "moved.txt")
    problems = []
    if read_or_empty(moved) != "data\n":
        problems.append("ws/dir/moved.txt was not written")
    if not os.path.islink(os.path.join(env.ws, "dir", "link")):
        problems.append("ws/dir/link was not created")
    if os.path.exists(os.path.join(env.ws, "notes.txt")):
        problems.append("ws/notes.txt was not deleted")
    return problems


def metadata_written(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    st = os.stat(os.path.join(env.ws, "notes.txt"))
    problems = []
    if not st.st_mode & 0o100:
        problems.append("chmod +x of a workspace file did not apply")
    if st.st_mtime > 1e9 + 1e8:  # touch -d 2001-01-01 sets ~9.78e8
        problems.append("touch -d of a workspace file did not apply")
    return problems


def committed(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    done = subprocess.run(
        ["git", "-C", env.ws, "rev-list", "--count", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [] if done.stdout.strip() == "1" else ["the commit is not in the host repository"]


def background_completed(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    if outcome.notes.get("status") != "completed":
        return [f"background process ended {outcome.notes.get('status')}"]
    return []


ATTACKS: list[Attack] = [
    control(
        "control-read-filesystem",
        "read files outside the workspace and deny_read",
        "cat {{victim}}; cat {{home}}/public.txt; head -c 64 /etc/passwd >/dev/null && "
        "echo READ-ETC-OK; ls / >/dev/null && echo LS-OK",
        "READ-ETC-OK",
        "LS-OK",
        checks=[public_readable],
    ),
    control(
        "control-exec",
        "execute programs",
        "/bin/true && echo EXEC-OK; {{py}} -c 'print(\"PY-OK\")'",
        "EXEC-OK",
        "PY-OK",
    ),
    control(
        "control-dev-sinks",
        "write /dev/null, read /dev/zero",
        "echo x > /dev/null && echo NULL-OK; "
        '[ "$(head -c 4 /dev/zero | wc -c)" = 4 ] && echo ZERO-OK',
        "NULL-OK",
        "ZERO-OK",
    ),
    control(
        "control-write-workspace",
        "create, write, rename, link, delete in the workspace",
        "echo data > {{ws}}/made.txt && mkdir -p {{ws}}/dir/sub && "
        "mv {{ws}}/made.txt {{ws}}/dir/moved.txt && ln -s moved.txt {{ws}}/dir/link && "
        "rm -f {{ws}}/notes.txt && echo WS-OK",
        "WS-OK",
        checks=[workspace_written],
        modes=WORKSPACE_WRITE,
    ),
    control(
        "control-workspace-metadata",
        "chmod +x and touch -d a workspace file",
        "chmod +x {{ws}}/notes.txt; touch -d 2001-01-01 {{ws}}/notes.txt; echo META-RAN",
        "META-RAN",
        checks=[metadata_written],
        modes=WORKSPACE_WRITE,
    ),
    control(
        "control-private-tmp",
        "use a temp file",
        'f=$(mktemp) && echo x > "$f" && [ "$(cat "$f")" = x ] && rm "$f" && echo TMP-OK',
        "TMP-OK",
        modes=WORKSPACE_WRITE,
    ),
    control(
        "control-loopback-inside",
        "loopback inside the sandbox (background server + client in one command)",
        "{{py}} -c 'import socket; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        's.bind(("127.0.0.1", 47613)); s.listen(1); c, _ = s.accept(); '
        'print("SERVER-GOT", c.recv(16).decode(), flush=True)\' &\n'
        "{{py}} -c 'import socket, time\nfor _ in range(100):\n    try:\n"
        '        socket.create_connection(("127.0.0.1", 47613), timeout=2)'
        '.sendall(b"LOOPBACK-OK"); break\n    except OSError: time.sleep(0.05)\'\n'
        "wait",
        "SERVER-GOT LOOPBACK-OK",
    ),
    control(
        "control-background-process",
        "a tracked background process runs and completes",
        "sleep 0.2; echo BG-OK",
        "BG-OK",
        checks=[background_completed],
        drive=drives.background_wait,
    ),
    control(
        "control-signal-own-process",
        "signal the command's own child",
        "sleep 30 & p=$!; kill -TERM $p; wait $p; echo SIG-OWN-OK",
        "SIG-OWN-OK",
    ),
    control(
        "control-git-commit",
        "git commit in the workspace (protected paths stay read-only)",
        "cd {{ws}} && echo change > file.txt && git add file.txt && "
        "git commit -q -m audit && echo COMMIT-OK",
        "COMMIT-OK",
        checks=[committed],
        git="real",
        modes=WORKSPACE_WRITE,
        extra=lambda env: {} if shutil.which("git") else {"skip": "git not installed"},
    ),
]
