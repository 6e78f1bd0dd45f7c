"""Run one command through an operator runner inside a copy-on-write view of the host.

Enters a private mount namespace, mounts an overlay of / whose writes land in an upper dir
under the audit's own directory, binds the other mounts, chroots into it and then (maybe as
an ordinary user) asks an executor with the operator runner to run the command. Run as
``python -c TEXT CONFIG_JSON``; prints one JSON line.
"""

import ctypes
import json
import os
import sys
import tempfile
from typing import Any

cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
CLONE_NEWNS = 0x00020000


def check(r: int, what: str) -> None:
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, what + ": " + os.strerror(e))


if cfg["overlay"]:
    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    upper, work, merged = cfg["upper"], cfg["work"], cfg["merged"]
    opts = f"lowerdir=/,upperdir={upper},workdir={work}".encode()
    check(libc.mount(b"overlay", merged.encode(), b"overlay", 0, opts), "mount overlay")
    mounts: dict[str, tuple[str, str]] = {}
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            f = line.split()
            mounts[f[0]] = (f[1], f[4])
    root_id = next(i for i, (_, mp) in mounts.items() if mp == "/")
    for parent, mp in mounts.values():
        if parent == root_id and mp != "/" and not mp.startswith(merged):
            target = merged + mp
            if os.path.isdir(mp) and os.path.isdir(target):
                check(
                    libc.mount(mp.encode(), target.encode(), None, MS_BIND | MS_REC, None),
                    "bind " + mp,
                )
    # Every state candidate of the executor is on this overlay, so its state goes to
    # /dev/shm (`state.state_parent`): a tmpfs of this view's own, never the host's.
    if os.path.isdir(merged + "/dev/shm"):
        shm = (merged + "/dev/shm").encode()
        check(libc.mount(b"tmpfs", shm, b"tmpfs", 0, b"mode=1777,size=64m"), "mount /dev/shm")
    os.chroot(merged)
    os.chdir("/")

# Imported only now, from inside the copy-on-write view.
import asyncio  # noqa: E402

from bash_sandbox import SandboxBashExecutor, SandboxUnavailableError  # noqa: E402
from bash_seam import BashExecRequest  # noqa: E402

if cfg.get("uid") is not None:
    for path in cfg["open_up"]:
        os.chmod(path, 0o777 if path in cfg["writable"] else 0o755)
    os.environ["TMPDIR"] = cfg["tmpdir"]
    tempfile.tempdir = cfg["tmpdir"]
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])


async def main() -> None:
    out: dict[str, Any] = {"uid": os.getuid()}
    ex = SandboxBashExecutor(**cfg["executor"])
    try:
        r = await ex.run(ex.resolve(BashExecRequest(command=cfg["command"])))
        out.update(exit_code=r.exit_code, stdout=r.stdout.text[-500:], stderr=r.stderr.text[-500:])
    except SandboxUnavailableError as exc:
        out["raised"] = "SandboxUnavailableError: " + exc.detail
    except Exception as exc:
        out["raised"] = type(exc).__name__ + ": " + str(exc)
    finally:
        await ex.aclose()
    print(json.dumps(out), flush=True)


asyncio.run(main())
