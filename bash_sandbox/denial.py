"""Reading an outcome: was a failed command refused by the sandbox, or by the isolated network?

Only failed, non-signal runs are classified: `false`, `exit 3`, a killed command, or a
successful command that merely prints "Permission denied" are never denials.
"""

from __future__ import annotations

from collections.abc import Callable

# What resolvers, curl, wget, ssh, git, pip and Python print when there is no route or DNS.
_NETWORK_DIALECT = (
    "Network is unreachable",
    "Connection refused",
    "Could not resolve host",
    "Temporary failure in name resolution",
    "Name or service not known",
    "No address associated with hostname",
    "nodename nor servname provided",
    "getaddrinfo failed",
    "Couldn't resolve host",
    "unable to resolve host",
    "Failed to establish a new connection",
    "Connection timed out",
    "No route to host",
    "Failed to connect to",
    "Couldn't connect to server",
    "Could not connect to",
)


def _failed_without_signal(
    exit_code: int | None, signal: str | None, signals_as_exit: bool
) -> bool:
    if signal is not None or exit_code is None or exit_code == 0:
        return False
    # A runner that folds "killed by signal n" into exit 128+n leaves no other trace.
    return not (signals_as_exit and 128 < exit_code < 128 + 65)


def classify_denial(
    exit_code: int | None,
    signal: str | None,
    stderr: str,
    dialect: Callable[[str], bool],
    *,
    signals_as_exit: bool = False,
) -> bool:
    """True when the run failed on its own and its stderr speaks the backend's denial dialect."""
    return _failed_without_signal(exit_code, signal, signals_as_exit) and dialect(stderr)


def classify_network_denial(
    exit_code: int | None, signal: str | None, stderr: str, *, signals_as_exit: bool = False
) -> bool:
    """True when a failed run's stderr shows the isolated network refusing it."""
    return _failed_without_signal(exit_code, signal, signals_as_exit) and any(
        marker.lower() in stderr.lower() for marker in _NETWORK_DIALECT
    )
