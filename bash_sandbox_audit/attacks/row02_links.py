"""Row 2: the same through planted or self-made links, `..`, /proc and inherited descriptors."""

from __future__ import annotations

from bash_sandbox_audit.attacks.common import (
    FILES,
    attack,
    known_limit,
    victim_attack,
)
from bash_sandbox_audit.model import (
    Attack,
)

# -- row 2: the same through links, `..`, /proc ---------------------------------------------


ATTACKS: list[Attack] = [
    attack(
        "row2-symlink-to-file",
        2,
        "write through a planted symlink to a host file",
        "echo pwned > {{ws}}/link-file",
        *FILES,
    ),
    attack(
        "row2-symlink-to-dir",
        2,
        "write, create, delete through a planted symlink to a host directory",
        "echo pwned > {{ws}}/link-dir/victim.txt; touch {{ws}}/link-dir/new.txt; "
        "rm -f {{ws}}/link-dir/victim-dir/inner.txt",
        *FILES,
    ),
    attack(
        "row2-dangling-symlink",
        2,
        "create a host file through a planted dangling symlink",
        "echo pwned > {{ws}}/dangling",
        *FILES,
    ),
    attack(
        "row2-symlink-made-by-command",
        2,
        "plant a symlink to the host, then write through it",
        "ln -s {{host}} {{ws}}/cmd-link && echo pwned > {{ws}}/cmd-link/victim.txt; "
        "ln -sf {{victim}} {{ws}}/cmd-file-link && echo pwned > {{ws}}/cmd-file-link",
        *FILES,
    ),
    known_limit(
        attack(
            "row2-hardlink-planted",
            2,
            "write through a hardlink (to a host file) that already sits in the workspace",
            "echo pwned > {{ws}}/hardlink",
            *FILES,
        ),
        "a hardlink placed in the workspace before the run is a workspace file to every "
        "path-based sandbox; commands cannot make one (row2-hardlink-made-by-command)",
    ),
    attack(
        "row2-hardlink-made-by-command",
        2,
        "hardlink a host file into the workspace, then write it",
        "ln {{victim}} {{ws}}/cmd-hardlink && echo pwned > {{ws}}/cmd-hardlink",
        *FILES,
    ),
    attack(
        "row2-dotdot",
        2,
        "`..` out of the workspace",
        "echo pwned > {{ws}}/../host/victim.txt; cd {{ws}} && "
        "echo pwned > ../host/created-dotdot.txt",
        *FILES,
    ),
    attack(
        "row2-proc-self-cwd",
        2,
        "write via /proc/self/cwd",
        "cd {{host}} && echo pwned > /proc/self/cwd/victim.txt; "
        "cd {{host}} && touch /proc/self/cwd/new.txt",
        *FILES,
    ),
    attack(
        "row2-proc-self-root",
        2,
        "write via /proc/self/root",
        "echo pwned > /proc/self/root{{victim}}",
        *FILES,
    ),
    victim_attack(
        "row2-proc-pid-root",
        2,
        "write via /proc/<pid>/root, cwd and fd of a host process",
        "echo pwned > /proc/{{vpid}}/root{{victim}}; "
        "echo pwned > /proc/{{vpid}}/cwd/victim.txt; "
        "echo pwned > /proc/{{vpid}}/fd/{{vfd}}",
        *FILES,
    ),
    attack(
        "row2-proc-self-fd",
        2,
        "reopen an inherited read-only descriptor for writing via /proc/self/fd/N",
        "exec 3<{{victim}}; echo pwned > /proc/self/fd/3; echo pwned > /dev/fd/3; "
        "exec 4<{{host}}; echo pwned > /proc/self/fd/4/victim.txt",
        *FILES,
    ),
    attack(
        "row2-inherited-descriptors",
        2,
        "descriptors inherited from the executor: reopen each for writing (nothing written)",
        """
for n in sorted(int(x) for x in os.listdir("/proc/self/fd")):
    if n <= 2:
        continue
    try:
        target = os.readlink("/proc/self/fd/%d" % n)
    except OSError:
        continue
    if target.startswith("/proc/") and target.endswith("/fd"):
        continue
    print("INHERITED %d -> %s" % (n, target), flush=True)
    if target.startswith("/") and not target.startswith("{{ws}}"):
        attempt("reopen inherited fd %d (%s) for writing" % (n, target),
                lambda: os.close(os.open("/proc/self/fd/%d" % n, os.O_WRONLY | os.O_APPEND)))
""",
        *FILES,
        python=True,
    ),
    attack(
        "row2-openat-dirfd",
        2,
        "openat() relative to a host directory descriptor; reopen an O_PATH descriptor",
        """
d = os.open("{{host}}", os.O_RDONLY | os.O_DIRECTORY)
attempt("openat(dirfd, victim, O_WRONLY)",
        lambda: os.close(os.open("victim.txt", os.O_WRONLY, dir_fd=d)))
attempt("openat(dirfd, new, O_CREAT)",
        lambda: os.close(os.open("openat-created", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d)))
p = os.open("{{victim}}", os.O_PATH)
attempt("reopen an O_PATH descriptor for writing",
        lambda: os.close(os.open("/proc/self/fd/%d" % p, os.O_WRONLY)))
""",
        *FILES,
        python=True,
    ),
    attack(
        "row2-open-by-handle",
        2,
        "name_to_handle_at + open_by_handle_at (bypasses paths and mounts)",
        """
class FH(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * 128)]
fh = FH()
fh.handle_bytes = 128
mount_id = ctypes.c_int()
if libc.name_to_handle_at(-100, b"{{victim}}", ctypes.byref(fh), ctypes.byref(mount_id), 0):
    print("denied name_to_handle_at: %s" % os.strerror(ctypes.get_errno()))
else:
    mfd = os.open("{{host}}", os.O_RDONLY | os.O_DIRECTORY)
    def by_handle():
        fd = libc.open_by_handle_at(mfd, ctypes.byref(fh), os.O_RDWR)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        os.write(fd, b"pwned by handle")
        return "wrote"
    attempt("open_by_handle_at O_RDWR", by_handle)
""",
        *FILES,
        python=True,
    ),
    attack(
        "row2-bind-mount",
        2,
        "bind-mount the host directory into the workspace, then write",
        "mkdir -p {{ws}}/mnt; mount --bind {{host}} {{ws}}/mnt && "
        "echo 'ESCAPE mount --bind succeeded'; echo pwned > {{ws}}/mnt/victim.txt",
        *FILES,
    ),
]
