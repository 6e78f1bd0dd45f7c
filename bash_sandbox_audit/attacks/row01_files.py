"""Row 1: write, create, delete, rename, chmod, truncate outside the writable roots."""

from __future__ import annotations

from bash_sandbox_audit.attacks.common import (
    FILES,
    attack,
)
from bash_sandbox_audit.checks import (
    host_paths_absent,
)
from bash_sandbox_audit.model import (
    READ_ONLY,
    Attack,
)

# -- row 1: write outside the writable roots ----------------------------------------------------

ATTACKS: list[Attack] = [
    attack(
        "row1-overwrite", 1, "overwrite a file outside the roots", "echo pwned > {{victim}}", *FILES
    ),
    attack(
        "row1-append", 1, "append to a file outside the roots", "echo pwned >> {{victim}}", *FILES
    ),
    attack(
        "row1-write-in-place",
        1,
        "write without truncating (dd conv=notrunc)",
        "printf pwned | dd of={{victim}} conv=notrunc status=none",
        *FILES,
    ),
    attack(
        "row1-copy-over",
        1,
        "cp over a file outside the roots",
        "cp /etc/hostname {{victim}}",
        *FILES,
    ),
    attack(
        "row1-sed-in-place",
        1,
        "sed -i (temp file + rename) outside the roots",
        "sed -i s/original/pwned/ {{victim}}",
        *FILES,
    ),
    attack(
        "row1-create",
        1,
        "create a file outside the roots",
        "echo pwned > {{host}}/created.txt",
        *FILES,
    ),
    attack("row1-delete", 1, "delete a file outside the roots", "rm -f {{victim}}", *FILES),
    attack(
        "row1-delete-tree",
        1,
        "rm -rf a directory outside the roots",
        "rm -rf {{host}}/victim-dir",
        *FILES,
    ),
    attack(
        "row1-rename",
        1,
        "rename a file outside the roots",
        "mv {{victim}} {{host}}/renamed.txt",
        *FILES,
    ),
    attack(
        "row1-move-into-workspace",
        1,
        "move a host file into the workspace",
        "mv {{victim}} {{ws}}/stolen.txt",
        *FILES,
    ),
    attack(
        "row1-rename-exchange",
        1,
        "renameat2(RENAME_EXCHANGE) a workspace file with a host file",
        """
AT = -100
attempt("renameat2 RENAME_EXCHANGE", lambda: sys_call(
    "renameat2", AT, b"{{ws}}/notes.txt", AT, b"{{victim}}", 2))
attempt("rename a workspace file over the victim",
        lambda: os.rename("{{ws}}/notes.txt", "{{victim}}"))
""",
        *FILES,
        python=True,
    ),
    attack(
        "row1-chmod",
        1,
        "chmod a file and a directory outside the roots",
        "chmod 0777 {{victim}}; chmod 0700 {{host}}",
        *FILES,
    ),
    attack(
        "row1-chown", 1, "chown a file outside the roots", "chown 65534:65534 {{victim}}", *FILES
    ),
    attack(
        "row1-truncate",
        1,
        "truncate(2) a file outside the roots",
        "truncate -s 0 {{victim}}",
        *FILES,
    ),
    attack(
        "row1-truncate-on-open",
        1,
        "open O_TRUNC a file outside the roots",
        ": > {{victim}}",
        *FILES,
    ),
    attack("row1-mkdir", 1, "mkdir outside the roots", "mkdir {{host}}/newdir", *FILES),
    attack("row1-rmdir", 1, "rmdir outside the roots", "rmdir {{host}}/empty-dir", *FILES),
    attack(
        "row1-symlink",
        1,
        "create a symlink outside the roots",
        "ln -s /etc/hostname {{host}}/link",
        *FILES,
    ),
    attack(
        "row1-hardlink",
        1,
        "create a hardlink outside the roots",
        "ln {{victim}} {{host}}/hardlink",
        *FILES,
    ),
    attack("row1-mkfifo", 1, "create a fifo outside the roots", "mkfifo {{host}}/fifo", *FILES),
    attack(
        "row1-touch-mtime",
        1,
        "touch -d (utimensat by path) outside the roots",
        "touch -d 2000-01-01 {{victim}}; touch -d 2000-01-01 {{host}}/empty-dir",
        *FILES,
    ),
    attack(
        "row1-syscalls",
        1,
        "every write syscall directly (open, creat, truncate, rename, "
        "unlink, mkdir, rmdir, symlink, link, chmod, chown, utime, mknod, setxattr)",
        """
V, H = "{{victim}}", "{{host}}"
attempt("open O_WRONLY", lambda: os.close(os.open(V, os.O_WRONLY)))
attempt("open O_CREAT", lambda: os.close(os.open(H + "/py-created", os.O_WRONLY | os.O_CREAT)))
attempt("truncate", lambda: os.truncate(V, 0))
attempt("rename", lambda: os.rename(V, H + "/py-renamed"))
attempt("unlink", lambda: os.unlink(H + "/victim-dir/inner.txt"))
attempt("mkdir", lambda: os.mkdir(H + "/py-dir"))
attempt("rmdir", lambda: os.rmdir(H + "/empty-dir"))
attempt("symlink", lambda: os.symlink("/etc/hostname", H + "/py-link"))
attempt("link", lambda: os.link(V, H + "/py-hardlink"))
attempt("chmod", lambda: os.chmod(V, 0o777))
attempt("chown", lambda: os.chown(V, 4242, 4242))
attempt("utime", lambda: os.utime(V, (1, 1)))
attempt("mkfifo", lambda: os.mkfifo(H + "/py-fifo"))
attempt("setxattr", lambda: os.setxattr(V, "user.audit", b"x"))
""",
        *FILES,
        python=True,
    ),
    attack(
        "row1-metadata-via-descriptor",
        1,
        "futimens/fchmod/fchown/fsetxattr on a descriptor opened read-only",
        """
fd = os.open("{{victim}}", os.O_RDONLY)
dfd = os.open("{{host}}", os.O_RDONLY | os.O_DIRECTORY)
attempt("futimens on a read-only file descriptor", lambda: os.utime(fd, (1, 1)))
attempt("futimens on a directory descriptor", lambda: os.utime(dfd, (1, 1)))
attempt("fchmod on a read-only descriptor", lambda: os.fchmod(fd, 0o777))
attempt("fchown on a read-only descriptor", lambda: os.fchown(fd, 4242, 4242))
attempt("fsetxattr on a read-only descriptor", lambda: os.setxattr(fd, "user.audit", b"x"))
""",
        *FILES,
        python=True,
    ),
    attack(
        "row1-real-tmp",
        1,
        "write, create and delete in the host's /tmp",
        "echo pwned > {{tmp}}/victim.txt; echo new > {{tmp}}/new.txt; rm -f {{tmp}}/keep.txt",
        *FILES,
    ),
    attack(
        "row1-write-workspace-read-only",
        1,
        "write, create, delete, chmod in the workspace under read-only",
        "echo pwned > {{ws}}/notes.txt; echo new > {{ws}}/new.txt; mkdir {{ws}}/d; "
        "chmod 777 {{ws}}/notes.txt; touch -d 2000-01-01 {{ws}}/notes.txt; "
        "rm -f {{ws}}/notes.txt",
        *FILES,
        modes=READ_ONLY,
    ),
    attack(
        "row1-move-workspace-root",
        1,
        "rename or remove the workspace root itself",
        "mv {{ws}} {{ws}}-moved; rmdir {{ws}}; mv {{ws}}/.. {{root}}-moved",
        *FILES,
        host_paths_absent("moved"),
        extra=lambda env: {
            "moved": [env.ws + "-moved", env.root + "-moved"],
            "guards": {"ws-root": env.ws},
        },
        # The root's own mtime and ctime are the evidence here, and the placeholders of
        # missing auto-run names (made and removed by the executor in the root) move them:
        # only the git names, which need no host placeholder.
        kwargs={"protected_paths": (".git/hooks", ".git/config")},
        workspace_guard=False,
    ),
]
