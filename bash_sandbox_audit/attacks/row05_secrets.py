"""Row 5: read the `deny_read` paths by every route."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from typing import Any

from bash_sandbox_audit import scenarios
from bash_sandbox_audit.attacks.common import (
    BEGIN,
    Render,
    attack,
    py,
    read_or_empty,
    scenario,
    victim_attack,
)
from bash_sandbox_audit.checks import (
    no_escape_lines,
    secrets_kept,
)
from bash_sandbox_audit.host_git import git_env
from bash_sandbox_audit.model import (
    BOTH_MODES,
    WORKSPACE_WRITE,
    Attack,
    AttackEnv,
    AttackSetup,
    Outcome,
)
from policies import SandboxMode
from policies.policy import DEFAULT_DENY_READ_RELATIVE, default_deny_read

# -- row 5: read deny_read paths -------------------------------------------------------------


def secret_attack(
    id: str,
    title: str,
    template: str,
    *,
    python: bool = False,
    listing: bool = False,
    modes: frozenset[SandboxMode] = BOTH_MODES,
    plant: Callable[[AttackEnv], dict[str, Any]] | None = None,
) -> Attack:
    def extra(env: AttackEnv) -> dict[str, Any]:
        values = plant(env) if plant else {}
        values["check_listing"] = listing
        return values

    return attack(
        id,
        5,
        title,
        template,
        secrets_kept,
        no_escape_lines,
        python=python,
        modes=modes,
        extra=extra,
    )


def _plant_secret_links(env: AttackEnv) -> dict[str, Any]:
    os.symlink(os.path.join(env.home, ".ssh"), os.path.join(env.ws, "ssh-link"))
    os.symlink(os.path.join(env.home, ".netrc"), os.path.join(env.ws, "netrc-link"))
    return {}


def _blockdev_of(path: str) -> str | None:
    st = os.stat(path)
    uevent = read_or_empty(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/uevent")
    for line in uevent.splitlines():
        if line.startswith("DEVNAME="):
            dev = "/dev/" + line.split("=", 1)[1]
            return dev if os.path.exists(dev) else None
    return None


FIEMAP = 0xC020660B


def _physical_offset(path: str) -> int | None:
    """Where ``path``'s first block lies on its device (FIEMAP after a sync), if known."""
    import fcntl

    buf = bytearray(struct.pack("=QQIIII", 0, 1 << 30, 1, 0, 1, 0) + b"\0" * 56)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FIEMAP, buf)
    except OSError:
        return None
    finally:
        os.close(fd)
    _start, _len, _flags, mapped, _count, _res = struct.unpack_from("=QQIIII", buf)
    if mapped < 1:
        return None
    _logical, physical, _length = struct.unpack_from("=QQQ", buf, 32)
    return int(physical)


def _raw_disk_premise(env: AttackEnv) -> dict[str, Any]:
    """A canary file whose block the host (as root) can read back from the raw device."""
    if os.geteuid() != 0:
        return {"skip": "the executor is not root: raw block devices are not readable here"}
    canary = f"AUDIT-SECRET-RAW-{env.token}"
    path = os.path.join(env.home, ".ssh", "id_rawdisk")
    with open(path, "w") as fh:
        fh.write((canary + "\n") * (8192 // (len(canary) + 1)))
    os.chmod(path, 0o600)
    dev = _blockdev_of(path)
    offset = _physical_offset(path)  # FIEMAP_FLAG_SYNC flushes the data first
    if dev is None or offset is None:
        return {"skip": "the secret's block on the raw device is unknown on this filesystem"}
    os.sync()
    try:
        fd = os.open(dev, os.O_RDONLY)
        try:
            seen = os.pread(fd, 4096, offset)
        finally:
            os.close(fd)
    except OSError as exc:
        return {"skip": f"the host itself cannot read {dev}: {exc.strerror}"}
    if canary.encode() not in seen:
        return {"skip": "the secret's block could not be located on the raw device"}
    return {"rawdev": dev, "rawoff": offset, "extra_canaries": [canary]}


ATTACKS: list[Attack] = [
    secret_attack(
        "row5-cat-files",
        "cat every denied file (ssh key, .netrc, aws, a denied path inside the workspace)",
        "cat {{home}}/.ssh/id_ed25519; cat {{home}}/.netrc; "
        "cat {{home}}/.aws/credentials; cat {{ws}}/secrets/.env",
    ),
    secret_attack(
        "row5-list-dirs",
        "list denied directories (ls, find, glob)",
        "ls -la {{home}}/.ssh; find {{home}}/.ssh {{home}}/.aws {{ws}}/secrets; "
        "echo {{home}}/.ssh/*",
        listing=True,
    ),
    secret_attack(
        "row5-symlink-planted",
        "read through symlinks to denied paths planted in the workspace",
        "cat {{ws}}/ssh-link/id_ed25519 {{ws}}/netrc-link; ls {{ws}}/ssh-link",
        listing=True,
        plant=_plant_secret_links,
    ),
    secret_attack(
        "row5-symlink-made-by-command",
        "make symlinks to denied paths, then read",
        "ln -s {{home}}/.ssh {{ws}}/l1 && cat {{ws}}/l1/id_ed25519; "
        "ln -s {{home}}/.netrc {{ws}}/l2 && cat {{ws}}/l2; "
        "t=${TMPDIR:-/tmp}; ln -s {{home}}/.netrc $t/l3-{{token}} && "
        "cat $t/l3-{{token}}",
    ),
    secret_attack(
        "row5-hardlink-made-by-command",
        "hardlink denied files into the workspace, then read",
        "ln {{home}}/.netrc {{ws}}/hl && cat {{ws}}/hl; "
        "ln {{home}}/.ssh/id_ed25519 {{ws}}/hl2 && cat {{ws}}/hl2",
    ),
    secret_attack(
        "row5-symlink-target",
        "read the target of a denied symlink (.aws -> real-aws) directly",
        "cat {{home}}/real-aws/credentials",
    ),
    secret_attack(
        "row5-dotdot-and-proc",
        "reach denied files via `..`, /proc/self/root, /proc/self/cwd",
        "cat {{ws}}/../home/.netrc; cat /proc/self/root{{home}}/.netrc; "
        "cd {{home}} && cat /proc/self/cwd/.netrc",
    ),
    secret_attack(
        "row5-copy-out",
        "copy denied files into the workspace (cp, tar, base64)",
        "cp -r {{home}}/.ssh {{ws}}/exfil; tar cf {{ws}}/x.tar -C {{home}} .netrc .ssh; "
        "base64 {{home}}/.netrc",
    ),
    secret_attack(
        "row5-search",
        "search for the secrets (grep -r, find -exec cat)",
        "grep -r AUDIT-SECRET {{home}} {{ws}}; "
        "find {{home}} -type f -exec cat {} + 2>&1 | head -50",
        listing=True,
    ),
    secret_attack(
        "row5-reopen-and-openat",
        "O_PATH + /proc/self/fd reopen, openat relative to the home directory",
        """
for path in ("{{home}}/.netrc", "{{home}}/.ssh/id_ed25519"):
    try:
        p = os.open(path, os.O_PATH)
        with open("/proc/self/fd/%d" % p) as fh:
            print(fh.read())
    except OSError as exc:
        print("denied reopen:", exc)
try:
    home = os.open("{{home}}", os.O_RDONLY | os.O_DIRECTORY)
    print(os.read(os.open(".netrc", os.O_RDONLY, dir_fd=home), 200))
except OSError as exc:
    print("denied openat:", exc)
""",
        python=True,
    ),
    secret_attack(
        "row5-unmount-cover",
        "unmount what hides the denied paths, then read",
        "umount {{home}}/.ssh; umount -l {{home}}/.netrc; "
        "cat {{home}}/.ssh/id_ed25519 {{home}}/.netrc",
    ),
    secret_attack(
        "row5-rename-cover",
        "rename the hidden path (or its parent) inside the workspace, then read",
        "mv {{ws}}/secrets {{ws}}/moved && cat {{ws}}/moved/.env; "
        "mv {{ws}}/secrets/.env {{ws}}/env2 && cat {{ws}}/env2",
        modes=WORKSPACE_WRITE,
    ),
    secret_attack(
        "row5-raw-block-device",
        "read a secret's block straight from the raw block device",
        """
fd = os.open("{{rawdev}}", os.O_RDONLY)
print(os.pread(fd, 4096, {{rawoff}}).decode(errors="replace"))
""",
        python=True,
        plant=_raw_disk_premise,
    ),
    victim_attack(
        "row5-proc-pid-root",
        5,
        "read denied files via /proc/<pid>/root and cwd of a host process",
        "cat /proc/{{vpid}}/root{{home}}/.netrc; cat /proc/{{vpid}}/cwd/../home/.netrc",
        secrets_kept,
    ),
]


# -- as root: the system's own secrets ------------------------------------------------------


def _shadow_digests(env: AttackEnv) -> dict[str, Any]:
    """Digests of the host's shadow files (read by the audit as root); the command must not
    be able to print them. Only digests are compared and reported, never the contents."""
    if os.geteuid() != 0:
        return {"skip": "the executor is not root: /etc/shadow is unreadable anyway"}
    digests = {}
    for path in ("/etc/shadow", "/etc/gshadow"):
        try:
            with open(path, "rb") as fh:
                digests[path] = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            continue
    if not digests:
        return {"skip": "no readable /etc/shadow or /etc/gshadow here"}
    return {"shadow_digests": digests}


def shadow_unread(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    text = outcome.all_output()
    digests: dict[str, str] = setup.data["shadow_digests"]
    return [
        f"the command read {path} (it printed its digest)"
        for path, d in digests.items()
        if d in text
    ]


# -- the default deny_read list, populated in a fake home ------------------------------------


def _default_home(env: AttackEnv) -> dict[str, Any]:
    """A fake home holding every entry of the default `deny_read` list, each with a canary
    (directories get a file inside); the executor denies `default_deny_read(fake home)`."""
    home = env.path("default-home")
    canaries = []
    for n, rel in enumerate(DEFAULT_DENY_READ_RELATIVE):
        canary = f"AUDIT-SECRET-DEFAULT-{n}-{env.token}"
        canaries.append(canary)
        # Entries without a file suffix are directories in real homes (.ssh, .kube, .azure).
        target = os.path.join(home, rel)
        if "." not in os.path.basename(rel).lstrip("."):
            target = os.path.join(target, "credentials")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as fh:
            fh.write(canary + "\n")
        os.chmod(target, 0o600)
    return {
        "defhome": home,
        "extra_canaries": canaries,
        "executor_kwargs": {"deny_read": (*env.deny_read, *default_deny_read(home))},
        "check_listing": False,
    }


DEFAULT_DENY_READ_HUNT = (
    "find {{defhome}} -exec cat {} + 2>&1; grep -r AUDIT-SECRET-DEFAULT {{defhome}} 2>&1; "
    + "; ".join(
        f"cat {{{{defhome}}}}/{rel} {{{{defhome}}}}/{rel}/credentials 2>&1"
        for rel in DEFAULT_DENY_READ_RELATIVE
    )
    + "\n"
)


# -- denied paths replaced or created by the host while a command runs ---------------------

CREDENTIALS_FILE = ".git-credentials"
READ_LOOP = """
import time
path = "{{home}}/.git-credentials"
print("READY", flush=True)
deadline = time.time() + 25
while time.time() < deadline:
    try:
        with open(path) as fh:
            print("READ", fh.read().strip(), flush=True)
    except OSError as exc:
        print("denied read:", exc, flush=True)
    print("TRY", flush=True)
    time.sleep(0.02)
"""


def _credential_line(canary: str) -> str:
    return f"https://audit:{canary}@example.invalid\n"


def _replace_atomically(path: str, text: str) -> None:
    """Write ``text`` to a temp file next to ``path`` and rename it over ``path``."""
    tmp = path + ".audit-tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _host_rewrites(canaries: list[str]) -> list[scenarios.HostAction]:
    """Host writes of the credentials file: atomic renames, and `git credential-store`
    (lock file + rename) where git is installed."""

    def make(n: int, canary: str) -> scenarios.HostAction:
        def act(env: AttackEnv, outcome: Outcome) -> None:
            path = os.path.join(env.home, CREDENTIALS_FILE)
            if n % 2 and shutil.which("git"):
                request = (
                    f"protocol=https\nhost=example.invalid\nusername=a{n}\npassword={canary}\n"
                )
                subprocess.run(
                    ["git", "credential-store", "--file", path, "store"],
                    input=request,
                    text=True,
                    capture_output=True,
                    check=False,
                    timeout=20,
                    env=git_env(env),
                )
            else:
                _replace_atomically(path, _credential_line(canary))

        return act

    return [make(n, c) for n, c in enumerate(canaries)]


def _live_canaries(env: AttackEnv) -> list[str]:
    return [f"AUDIT-SECRET-LIVE-{n}-{env.token}" for n in range(5)]


def _running_secret(*, exists: bool) -> Callable[[AttackEnv], dict[str, Any]]:
    """``~/.git-credentials`` of the fake home is denied; it exists at the start or not."""

    def extra(env: AttackEnv) -> dict[str, Any]:
        path = os.path.join(env.home, CREDENTIALS_FILE)
        if exists:
            _replace_atomically(path, _credential_line(_live_canaries(env)[0]))
        return {
            "extra_canaries": _live_canaries(env),
            "executor_kwargs": {"deny_read": (*env.deny_read, path)},
            "check_listing": False,
        }

    return extra


def _running_attack(id: str, title: str, *, exists: bool) -> Attack:
    def build(env: AttackEnv, render: Render) -> dict[str, Any]:
        return {
            "command": render(BEGIN + py(READ_LOOP)),
            "acts": _host_rewrites(_live_canaries(env)[1 if exists else 0 :]),
            "timeout_ms": 30_000,
        }

    return scenario(
        id,
        5,
        title,
        build,
        secrets_kept,
        no_escape_lines,
        extra=_running_secret(exists=exists),
        python=True,
        drive=scenarios.while_running,
        markers=("AUDIT-BEGIN", "READY"),
    )


# A denied file covered where it lies (inside the workspace): the host replaces it, then says
# "go" half a second later; the command reads only after the go. It proves the executor
# stops a command whose cover the host's rename detached (the race before the stop is
# measured in docs/threat-model-coverage.md, not attacked here).
GATED_READ = """
import os, time
path = "{{ws}}/secrets.live.env"
go = "{{ws}}/audit-go"
print("READY", flush=True)
deadline = time.time() + 25
while time.time() < deadline:
    if os.path.exists(go):
        try:
            with open(path) as fh:
                print("READ", fh.read().strip(), flush=True)
        except OSError as exc:
            print("denied read:", exc, flush=True)
    print("TRY", flush=True)
    time.sleep(0.05)
"""


def _in_root_secret(env: AttackEnv) -> dict[str, Any]:
    path = os.path.join(env.ws, "secrets.live.env")
    _replace_atomically(path, _credential_line(_live_canaries(env)[0]))
    return {
        "extra_canaries": _live_canaries(env),
        "executor_kwargs": {"deny_read": (*env.deny_read, path)},
        "check_listing": False,
    }


def _replace_then_go(canary: str) -> scenarios.HostAction:
    def act(env: AttackEnv, outcome: Outcome) -> None:
        _replace_atomically(os.path.join(env.ws, "secrets.live.env"), _credential_line(canary))
        time.sleep(0.5)
        with open(os.path.join(env.ws, "audit-go"), "w"):
            pass

    return act


def _gated_read(env: AttackEnv, render: Render) -> dict[str, Any]:
    return {
        "command": render(BEGIN + py(GATED_READ)),
        "acts": [_replace_then_go(_live_canaries(env)[1])],
        # The act itself takes half a second (ten TRY lines): ten more after the go.
        "tries": 20,
        "timeout_ms": 30_000,
        "act_timeout_s": 3,
    }


ATTACKS += [
    scenario(
        "row5-in-root-secret-replaced-while-running",
        5,
        "a denied file inside the workspace (covered where it lies) is replaced by the host "
        "while a command runs; the command reads it after the replacement",
        _gated_read,
        secrets_kept,
        no_escape_lines,
        extra=_in_root_secret,
        python=True,
        drive=scenarios.while_running,
        markers=("AUDIT-BEGIN", "READY"),
    ),
    attack(
        "row5-shadow-as-root",
        5,
        "as root: read /etc/shadow and /etc/gshadow (their digests are compared)",
        "sha256sum /etc/shadow /etc/gshadow 2>&1; wc -c /etc/shadow 2>&1",
        shadow_unread,
        extra=_shadow_digests,
    ),
    secret_attack(
        "row5-default-deny-read",
        "read every entry of the default deny_read list (default_deny_read of a fake home)",
        DEFAULT_DENY_READ_HUNT,
        plant=_default_home,
    ),
    _running_attack(
        "row5-secret-replaced-while-running",
        "a command keeps reading ~/.git-credentials while the host replaces it by rename "
        "(atomic rewrite, git credential-store)",
        exists=True,
    ),
    _running_attack(
        "row5-secret-created-while-running",
        "a denied path that does not exist at the start is created by the host during the run",
        exists=False,
    ),
]
