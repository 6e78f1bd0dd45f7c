"""The executor's private network namespace: loopback only, held by a file descriptor.

One namespace per executor, made on first use and shared by every command it confines, so a
server started in one call is reachable from the next while nothing outside can reach it.
It is never bound under `/run/netns`: the open nsfs descriptor is the only thing keeping it
alive, so closing it (`aclose()`, garbage collection, or the executor's death) frees it.
pyroute2 is used only here, once per executor, never on the per-command path.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

from bash_sandbox.child_setup import CLONE_NEWNET, libc


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


class NetworkNamespace:
    """Lazily created, thread-safe holder of one executor's namespace descriptor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._closed = False

    def fd(self) -> int:
        """The descriptor, creating the namespace on first use. Raises `NetnsError`."""
        with self._lock:
            if self._closed:
                raise NetnsError(9, "network namespace already closed")
            if self._fd is None:
                self._fd = create_isolated_netns()
            return self._fd

    @property
    def created(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
