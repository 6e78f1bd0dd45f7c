"""The probe cache: "this backend confined its probe here", remembered across processes.

A fresh `bash-sandbox run` would otherwise pay a full functional probe (a confined command,
7-30 ms) before its own command. What a cached verdict can change, by construction, is only
*whether that probe runs* before a full backend is tried:

- it carries nothing that confines: no rules, ABI, paths or layers. The spawn is built live,
  exactly as after a fresh probe, and each of its steps is mandatory (a join, mount, rule or
  filter that fails kills the child before exec; bwrap's own setup failure is a runner
  failure), so a wrong "usable" ends in `SandboxUnavailableError`, never in a weaker run;
- candidates keep their order: a verdict is consulted for the next candidate only, so it
  can never make a later, different backend win over one a live probe would choose;
- only "usable" is stored, and only for the full bwrap and Landlock backends (never an
  operator's runner, Seatbelt or the namespace-less fallback, whose choice needs a live
  check that namespaces cannot be made); "unusable" is simply probed again.

An entry is used only while its key equals the key computed now from everything the probe
outcome depends on (`probe_key`): the backend and the identity of its code and binary
(path, device, inode, size, mtime, ctime), the kernel, the Landlock ABI, the credentials,
the namespaces and security state this process starts from, and the sysctls that gate
unprivileged namespaces; and for at most `MAX_AGE_S`. Computing it costs a few small reads
of /proc and two stats, no process.

Entries live in `<user base>/probe-cache/<backend>.json` (`bash_local.userdir`: 0700, this
uid's, hidden from every confined command); the directory and file are opened without
following symlinks and ignored unless owned by this uid and closed to others (the next
store replaces such a file). `doctor` never reads it: it is the audit tool and probes for real.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import sys
import time
from typing import Any

from bash_local.userdir import user_base_dir

FORMAT = 1
MAX_AGE_S = 24 * 3600
_MAX_ENTRY_BYTES = 1 << 16
# What lets an unprivileged process make the namespaces both full backends need.
_SYSCTLS = (
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/user/max_mnt_namespaces",
    "/proc/sys/user/max_net_namespaces",
    "/proc/sys/user/max_pid_namespaces",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
    "/proc/sys/kernel/seccomp/actions_avail",
)
# The security state this process starts from (an outer sandbox or container changes it).
_STATUS_FIELDS = ("CapEff", "CapBnd", "NoNewPrivs", "Seccomp")
_NAMESPACES = ("user", "mnt", "pid")
# The exact classes whose probes may be cached (subclasses, runners and doubles are not).
_BWRAP = "bash_sandbox.backends.bwrap.BwrapBackend"
_LANDLOCK = "bash_sandbox.backends.landlock.LandlockBackend"


def _read_small(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(4096).decode(errors="replace").strip()
    except OSError:
        return None


def _identity(path: str) -> list[int | str] | None:
    """Where ``path`` resolves to and which file that is (replaced or rewritten: changed)."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return None
    return [real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _process_state() -> dict[str, str | None]:
    fields: dict[str, str | None] = dict.fromkeys(_STATUS_FIELDS)
    for line in (_read_small("/proc/self/status") or "").splitlines():
        name, _, value = line.partition(":")
        if name in fields:
            fields[name] = value.strip()
    for ns in _NAMESPACES:
        try:
            fields[f"ns.{ns}"] = os.readlink(f"/proc/self/ns/{ns}")
        except OSError:
            fields[f"ns.{ns}"] = None
    return fields


def probe_key(backend: object) -> dict[str, Any] | None:
    """Everything ``backend``'s probe outcome depends on, or None when its verdict is never
    cached (not a plain bwrap or Landlock backend, no bwrap binary, no Landlock)."""
    cls = type(backend)
    kind = f"{cls.__module__}.{cls.__qualname__}"
    code = getattr(sys.modules.get(cls.__module__), "__file__", None)
    key: dict[str, Any] = {"backend": kind, "code": _identity(code) if code else None}
    if kind == _BWRAP and getattr(backend, "name", None) == "bwrap":
        path = getattr(backend, "path", None)
        binary = _identity(path) if isinstance(path, str) else None
        if binary is None:
            return None
        key["binary"] = binary
    elif kind == _LANDLOCK:
        abi = getattr(backend, "abi", 0)
        if not isinstance(abi, int) or abi <= 0:
            return None
        key["landlock_abi"] = abi
    else:
        return None
    uname = os.uname()
    key["kernel"] = [uname.sysname, uname.release, uname.version, uname.machine]
    key["ids"] = [os.geteuid(), os.getegid()]
    key["sysctls"] = {path: _read_small(path) for path in _SYSCTLS}
    key["process"] = _process_state()
    return key


class ProbeCache:
    """This uid's probe verdicts. ``directory`` None: `<user base>/probe-cache`, resolved at
    each use (so a changed TMPDIR gets its own)."""

    def __init__(self, directory: str | None = None, *, max_age_s: float = MAX_AGE_S) -> None:
        self._directory = directory
        self._max_age_s = max_age_s

    @property
    def directory(self) -> str:
        return self._directory or os.path.join(user_base_dir(), "probe-cache")

    def _open_dir(self) -> int | None:
        """The cache directory, if it is ours and closed to others (made when missing)."""
        try:
            path = self.directory
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            os.close(fd)
            return None
        return fd

    @staticmethod
    def _entry_name(key: dict[str, Any]) -> str:
        return str(key["backend"]).rsplit(".", 1)[-1] + ".json"

    def vouches_for(self, backend: object) -> bool:
        """True only when a stored entry for ``backend`` matches the key computed now, is
        younger than the maximum age, and is a regular file of ours closed to others."""
        key = probe_key(backend)
        if key is None:
            return False
        dir_fd = self._open_dir()
        if dir_fd is None:
            return False
        try:
            fd = os.open(
                self._entry_name(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
            )
        except OSError:
            return False
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if (
                not stat.S_ISREG(st.st_mode)
                or st.st_uid != os.geteuid()
                or st.st_mode & 0o022
                or not 0 <= time.time() - st.st_mtime <= self._max_age_s
            ):
                return False
            raw = fh.read(_MAX_ENTRY_BYTES + 1)
        if len(raw) > _MAX_ENTRY_BYTES:
            return False
        try:
            entry = json.loads(raw)
        except ValueError:
            return False
        return bool(entry == {"format": FORMAT, "usable": True, "key": key})

    def record(self, backend: object, usable: bool) -> None:
        """Store a live probe's "usable"; an "unusable" removes any entry instead."""
        key = probe_key(backend)
        if key is None:
            return
        if not usable:
            self.forget(backend)
            return
        dir_fd = self._open_dir()
        if dir_fd is None:
            return
        name = self._entry_name(key)
        scratch = f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
        data = json.dumps({"format": FORMAT, "usable": True, "key": key}).encode()
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(scratch, flags, 0o600, dir_fd=dir_fd)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            # Atomic: a reader sees the old entry or the new one, never a torn one; a file
            # planted under the name by someone else is replaced, not trusted.
            os.replace(scratch, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(scratch, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

    def forget(self, backend: object) -> None:
        """Drop ``backend``'s entry (its spawn failed, or a live probe found it unusable)."""
        key = probe_key(backend)
        if key is None:
            return
        dir_fd = self._open_dir()
        if dir_fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                os.unlink(self._entry_name(key), dir_fd=dir_fd)
        finally:
            os.close(dir_fd)


# The cache every `BackendSelector` uses unless told otherwise.
USER_PROBE_CACHE = ProbeCache()
