"""The executor's private network namespace: loopback only, held by a file descriptor.

One namespace per executor, made on first use and shared by every command it confines, so a
server started in one call is reachable from the next while nothing outside can reach it.
It is never bound under `/run/netns`: the open nsfs descriptor is the only thing keeping it
alive, so closing it (`aclose()`, garbage collection, or the executor's death) frees it.
pyroute2 is used only here, once per executor, never on the per-command path.

As root the namespace is made by a short-lived thread. An unprivileged executor cannot make
one directly, so a holder process makes a user namespace that owns a new network namespace
(`unshare --user --map-root-user --net`), brings `lo` up inside it, and is killed once both
namespace descriptors are open: commands then join the user namespace, then the network one.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

from bash_sandbox.linux.child_setup import CLONE_NEWNET, libc


class NetnsError(OSError):
    """The namespace could not be made; nothing was left behind."""


def _bring_loopback_up() -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname="lo")[0]
        ipr.link("set", index=index, state="up")


def create_isolated_netns() -> int:
    """A new network namespace with only `lo`, up; returns an O_CLOEXEC nsfs descriptor.

    `unshare(CLONE_NEWNET)` is per-thread, so a short-lived thread enters the new namespace,
    configures it and opens it; the executor's own threads never change namespace.
    """
    result: dict[str, object] = {}

    def worker() -> None:
        try:
            if libc().unshare(CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise NetnsError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
            fd = os.open(
                f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY | os.O_CLOEXEC
            )
            try:
                _bring_loopback_up()
            except BaseException:
                os.close(fd)
                raise
            result["fd"] = fd
        except BaseException as exc:  # reported to the caller, which raises it
            result["error"] = exc

    t = threading.Thread(target=worker, name="bash-sandbox-netns", daemon=True)
    t.start()
    t.join()
    if "error" in result:
        err = result["error"]
        raise NetnsError(
            getattr(err, "errno", None) or 1, f"cannot create network namespace: {err}"
        )
    fd = result["fd"]
    assert isinstance(fd, int)
    return fd


_HOLDER_SCRIPT = """
import sys
from pyroute2 import IPRoute
with IPRoute() as ipr:
    ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
sys.stdout.write("ready\\n")
sys.stdout.flush()
sys.stdin.read()
"""


def create_userns_netns(timeout_s: float = 10.0) -> tuple[int, int]:
    """(user-namespace fd, network-namespace fd) made by a holder process, for non-root."""
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    try:
        holder = subprocess.Popen(
            [
                unshare,
                "--user",
                "--map-root-user",
                "--net",
                "--",
                sys.executable,
                "-I",
                "-c",
                _HOLDER_SCRIPT,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise NetnsError(exc.errno or 1, f"cannot start the namespace holder: {exc}") from exc
    fds: list[int] = []
    try:
        assert holder.stdout is not None
        ready = _read_line(holder.stdout.fileno(), timeout_s)
        if ready != b"ready":
            err = holder.stderr.read().decode(errors="replace") if holder.stderr else ""
            holder.kill()
            raise NetnsError(1, f"namespace holder failed: {err.strip() or ready!r}")
        for kind in ("user", "net"):
            fds.append(os.open(f"/proc/{holder.pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC))
        return fds[0], fds[1]
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        # The open descriptors keep both namespaces alive; the holder is no longer needed.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)
        holder.communicate()


def _read_line(fd: int, timeout_s: float) -> bytes:
    import select

    buf = b""
    while not buf.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            return buf
        chunk = os.read(fd, 64)
        if not chunk:
            return buf
        buf += chunk
    return buf.strip()


@dataclass(frozen=True)
class NamespaceFds:
    """The network namespace, and the user namespace to join first (None as root)."""

    net: int
    user: int | None = None


class NetworkNamespace:
    """Lazily created, thread-safe holder of one executor's namespace descriptors."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: NamespaceFds | None = None
        self._closed = False

    def fds(self) -> NamespaceFds:
        """The descriptors, creating the namespaces on first use. Raises `NetnsError`."""
        with self._lock:
            if self._closed:
                raise NetnsError(9, "network namespace already closed")
            if self._fds is None:
                if os.geteuid() == 0:
                    self._fds = NamespaceFds(net=create_isolated_netns())
                else:
                    user, net = create_userns_netns()
                    self._fds = NamespaceFds(net=net, user=user)
            return self._fds

    def fd(self) -> int:
        """The network namespace descriptor (see `fds`)."""
        return self.fds().net

    def close(self) -> None:
        with self._lock:
            self._closed = True
            fds, self._fds = self._fds, None
        if fds is not None:
            for fd in (fds.net, fds.user):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def __del__(self) -> None:
        fds = getattr(self, "_fds", None)
        if fds is not None:
            for fd in (fds.net, fds.user):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
