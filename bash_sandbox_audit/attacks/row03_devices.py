"""Row 3: /dev/shm, message queues, SysV IPC, devices, /proc/sys and /sys of the host."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import stat
import subprocess
from collections.abc import Sequence
from typing import Any

from bash_sandbox_audit.attacks.common import (
    FILES,
    attack,
    cleanup_paths,
    control,
    read_or_empty,
)
from bash_sandbox_audit.checks import (
    Check,
    host_paths_absent,
)
from bash_sandbox_audit.model import (
    Attack,
    AttackEnv,
    AttackSetup,
    Outcome,
)
from bash_sandbox_audit.targets import (
    remove_path,
)

# -- row 3: devices, IPC and kernel knobs --------------------------------------------------------


def _block_devices() -> list[str]:
    devs = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir("/sys/class/block")):
            path = f"/dev/{name}"
            with contextlib.suppress(OSError):
                if stat.S_ISBLK(os.stat(path).st_mode):
                    devs.append(path)
    return devs


# Character devices opened for writing only (never written). Deliberately absent: watchdog
# (opening it arms it), snapshot, cpu_dma_latency (an open registers a QoS request).
CHAR_DEVICES = (
    "kmsg",
    "mem",
    "port",
    "tty0",
    "console",
    "kvm",
    "fuse",
    "loop-control",
    "btrfs-control",
    "autofs",
    "net/tun",
    "vhost-net",
    "uinput",
    "rfkill",
    "hwrng",
)
PROC_KNOBS = (
    "/proc/sys/kernel/core_pattern",
    "/proc/sys/vm/drop_caches",
    "/proc/sysrq-trigger",
    "/proc/sys/kernel/modprobe",
    "/proc/sys/fs/binfmt_misc/register",
    "/proc/sys/kernel/panic",
)
SYS_KNOBS = (
    "/sys/kernel/uevent_helper",
    "/sys/power/state",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/fs/cgroup/cgroup.procs",
    "/sys/fs/cgroup/unified/cgroup.procs",
    "/sys/module/printk/parameters/time",
)
# A harmless knob whose current value is written back (an escape would change nothing).
SYS_SAME_VALUE = (
    "/sys/block/loop0/queue/read_ahead_kb",
    "/sys/kernel/mm/transparent_hugepage/khugepaged/defrag",
    "/sys/kernel/mm/ksm/sleep_millisecs",
)


def _open_for_write_body(list_name: str) -> str:
    return f"""
for path in "{{{{{list_name}}}}}".split(","):
    if path:
        attempt("open %s for writing (nothing is written)" % path,
                lambda: os.close(os.open(path, os.O_WRONLY | os.O_CLOEXEC)))
"""


def _writable_by_host(paths: Sequence[str]) -> list[str]:
    """Paths the audit itself can open for writing (opened and closed, nothing written):
    only those make a refusal inside the sandbox mean something."""
    usable = []
    for path in paths:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOCTTY))
        except OSError:
            continue
        usable.append(path)
    return usable


def _open_targets(key: str, paths: Sequence[str]) -> dict[str, Any]:
    usable = _writable_by_host(paths)
    if not usable:
        return {"skip": "the host itself cannot open any of them for writing"}
    return {key: ",".join(usable)}


def _unchanged_file(key: str) -> Check:
    """The host file ``setup.data[key]`` still holds what it held before the run."""

    def check(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
        path, before = setup.data[key], setup.data[key + "_before"]
        now = read_or_empty(path)
        return [] if now == before else [f"{path} changed: {before.strip()!r} -> {now.strip()!r}"]

    return check


def _same_value_knob(env: AttackEnv) -> dict[str, Any]:
    for knob in SYS_SAME_VALUE:
        if os.path.exists(knob) and os.stat(knob).st_mode & 0o200:
            return {"knob": knob, "knob_before": read_or_empty(knob)}
    return {"skip": "no harmless writable /sys knob on this host"}


def _librt() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    if not hasattr(lib, "mq_open"):
        lib = ctypes.CDLL(ctypes.util.find_library("rt") or "librt.so.1", use_errno=True)
    return lib


def _mqueue_absent(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    """Look for the queue in the host's IPC namespace; remove it if the attack made one."""
    name = f"/bash-sandbox-audit-{env.token}".encode()
    lib = _librt()
    fd = lib.mq_open(name, os.O_RDONLY)
    if fd < 0:
        return []
    os.close(fd)
    lib.mq_unlink(name)
    return [f"POSIX message queue {name.decode()} exists in the host IPC namespace"]


def _sysv_hits(key: int) -> list[str]:
    hits = []
    for kind in ("shm", "msg", "sem"):
        for line in read_or_empty(f"/proc/sysvipc/{kind}").splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == str(key):
                hits.append(f"SysV {kind} id {fields[1]} with key {key} exists on the host")
                flag = {"shm": "-m", "msg": "-q", "sem": "-s"}[kind]
                with contextlib.suppress(OSError):
                    subprocess.run(["ipcrm", flag, fields[1]], capture_output=True, check=False)
    return hits


def _sysv_absent(env: AttackEnv, setup: AttackSetup, outcome: Outcome) -> list[str]:
    return _sysv_hits(setup.data["ipc_key"])


def _mknod_premise(env: AttackEnv) -> dict[str, Any]:
    devs = _block_devices()
    if not devs:
        return {"skip": "no block device on this host"}
    st = os.stat(devs[0])
    node = os.path.join(env.ws, "audit-blk")
    env.cleanup.add(lambda: remove_path(node))
    return {"major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev), "nodes": [node]}


ATTACKS: list[Attack] = [
    attack(
        "row3-dev-shm",
        3,
        "create a file in /dev/shm",
        "echo pwned > /dev/shm/bash-sandbox-audit-{{token}}; "
        "echo pwned > /dev/shm/bash-sandbox-audit-{{token}}-2",
        *FILES,
        host_paths_absent("shm"),
        extra=lambda env: cleanup_paths(
            env,
            "shm",
            [
                f"/dev/shm/bash-sandbox-audit-{env.token}",
                f"/dev/shm/bash-sandbox-audit-{env.token}-2",
            ],
        ),
    ),
    attack(
        "row3-mqueue",
        3,
        "create a POSIX message queue (mq_open, /dev/mqueue)",
        """
name = b"/bash-sandbox-audit-{{token}}"
lib = libc if hasattr(libc, "mq_open") else ctypes.CDLL(ctypes.util.find_library("rt"),
                                                        use_errno=True)
def mq():
    fd = lib.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return "created (judged from the host's namespace)"
try:
    print("mq_open:", mq())
except OSError as exc:
    print("denied mq_open:", exc)
if os.path.isdir("/dev/mqueue"):
    try:
        os.close(os.open("/dev/mqueue/bash-sandbox-audit-{{token}}", os.O_CREAT | os.O_WRONLY))
        print("created /dev/mqueue entry")
    except OSError as exc:
        print("denied /dev/mqueue:", exc)
""",
        *FILES,
        _mqueue_absent,
        python=True,
    ),
    attack(
        "row3-sysv-ipc",
        3,
        "create SysV shared memory, a message queue, a semaphore",
        """
key = {{ipc_key}}
for name, call in (("shmget", lambda: libc.shmget(key, 4096, 0o1000 | 0o600)),
                   ("msgget", lambda: libc.msgget(key, 0o1000 | 0o600)),
                   ("semget", lambda: libc.semget(key, 1, 0o1000 | 0o600))):
    print(name, "->", call(), "(judged from the host's namespace)")
""",
        *FILES,
        _sysv_absent,
        python=True,
        extra=lambda env: {
            "ipc_key": int.from_bytes(os.urandom(4), "big") & 0x3FFFFFFF | 0x10000000
        },
    ),
    attack(
        "row3-block-device-open",
        3,
        "open every host block device for writing (nothing written)",
        _open_for_write_body("devices"),
        *FILES,
        python=True,
        extra=lambda env: _open_targets("devices", _block_devices()),
    ),
    attack(
        "row3-mknod-block-device",
        3,
        "mknod a block device node in the workspace and open it for writing",
        "mknod {{ws}}/audit-blk b {{major}} {{minor}} && "
        "echo 'ESCAPE mknod made a block device'; "
        "{{py}} -c \"import os; os.close(os.open('{{ws}}/audit-blk', os.O_WRONLY)); "
        "print('ESCAPE opened the made node for writing')\"",
        *FILES,
        host_paths_absent("nodes"),
        extra=_mknod_premise,
        workspace_guard=False,
    ),
    attack(
        "row3-char-devices-open",
        3,
        "open host character devices for writing (kmsg, "
        "mem, port, tty0, console, kvm, fuse, ...; nothing written)",
        _open_for_write_body("chardevs"),
        *FILES,
        python=True,
        extra=lambda env: _open_targets("chardevs", [f"/dev/{d}" for d in CHAR_DEVICES]),
    ),
    attack(
        "row3-proc-sys-same-value",
        3,
        "write /proc/sys/vm/swappiness (its current value)",
        'v=$(cat /proc/sys/vm/swappiness); echo "$v" > /proc/sys/vm/swappiness && '
        'echo "ESCAPE wrote /proc/sys/vm/swappiness (same value $v)"',
        *FILES,
        _unchanged_file("knob"),
        extra=lambda env: {
            "knob": "/proc/sys/vm/swappiness",
            "knob_before": read_or_empty("/proc/sys/vm/swappiness"),
        },
    ),
    attack(
        "row3-proc-open-for-write",
        3,
        "open /proc knobs for writing (core_pattern, "
        "drop_caches, sysrq-trigger, ...; nothing written)",
        _open_for_write_body("knobs"),
        *FILES,
        python=True,
        extra=lambda env: _open_targets("knobs", PROC_KNOBS),
    ),
    attack(
        "row3-sys-same-value",
        3,
        "write a harmless /sys knob (its current value)",
        'v=$(cat {{knob}}); echo "$v" > {{knob}} && echo "ESCAPE wrote {{knob}}"',
        *FILES,
        _unchanged_file("knob"),
        extra=_same_value_knob,
    ),
    attack(
        "row3-sys-open-for-write",
        3,
        "open /sys knobs for writing (uevent_helper, "
        "power/state, cgroup.procs, ...; nothing written)",
        _open_for_write_body("knobs"),
        *FILES,
        python=True,
        extra=lambda env: _open_targets("knobs", SYS_KNOBS),
    ),
]


# -- /tmp and /dev/shm: private in every confined mode -----------------------------------------


def _scratch_paths(env: AttackEnv, key: str, stem: str) -> dict[str, Any]:
    """The host's own /tmp and /dev/shm entries a command's scratch files would become if
    they were not private (removed afterwards either way)."""
    return cleanup_paths(env, key, [f"/tmp/{stem}-{env.token}", f"/dev/shm/{stem}-{env.token}"])


ATTACKS += [
    attack(
        "row3-tmp-and-shm-private",
        3,
        "write /tmp and /dev/shm: the files must land in a private place, not the host's",
        "echo pwned > /tmp/bash-sandbox-audit-scratch-{{token}}; "
        "echo pwned > /dev/shm/bash-sandbox-audit-scratch-{{token}}; "
        "ls -l /tmp/bash-sandbox-audit-scratch-{{token}} "
        "/dev/shm/bash-sandbox-audit-scratch-{{token}} 2>&1",
        *FILES,
        host_paths_absent("scratch"),
        extra=lambda env: _scratch_paths(env, "scratch", "bash-sandbox-audit-scratch"),
    ),
]

CONTROLS: list[Attack] = [
    control(
        "row3-control-private-tmp-and-shm",
        "write, read and remove a scratch file in /tmp and in /dev/shm",
        "for d in /tmp /dev/shm; do f=$d/bash-sandbox-audit-ctl-{{token}}; "
        'echo x > "$f" && [ "$(cat "$f")" = x ] && rm "$f" && echo "SCRATCH-OK $d"; done',
        "SCRATCH-OK /tmp",
        "SCRATCH-OK /dev/shm",
        extra=lambda env: _scratch_paths(env, "scratch", "bash-sandbox-audit-ctl"),
        row=3,
    ),
    control(
        "row3-control-multiprocessing",
        "Python multiprocessing Pool, Queue and Lock work (they need a writable /dev/shm)",
        "{{py}} - <<'PY'\n"
        "import multiprocessing as mp\n"
        "if __name__ == '__main__':\n"
        "    with mp.Pool(2) as pool:\n"
        "        assert pool.map(abs, [-1, -2]) == [1, 2]\n"
        "    q = mp.Queue(); q.put('x'); assert q.get(timeout=10) == 'x'\n"
        "    with mp.Lock():\n"
        "        print('MP-OK', flush=True)\n"
        "PY",
        "MP-OK",
        row=3,
    ),
]
