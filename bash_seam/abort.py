"""Cancellation tokens: `AbortController` owns an `AbortSignal`; both are thread-safe."""

from __future__ import annotations

import threading
from collections.abc import Callable


class AbortSignal:
    """Read side of an abort: `.aborted`, `.reason`, and listeners fired once on abort."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aborted = False
        self._reason: object = None
        self._listeners: dict[int, Callable[[], None]] = {}
        self._next_token = 0

    @property
    def aborted(self) -> bool:
        with self._lock:
            return self._aborted

    @property
    def reason(self) -> object:
        with self._lock:
            return self._reason

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` (from the aborting thread) once when aborted; returns a disposer.

        Subscribing to an already aborted signal calls the listener immediately.
        """
        with self._lock:
            if not self._aborted:
                token = self._next_token
                self._next_token += 1
                self._listeners[token] = listener

                def dispose() -> None:
                    with self._lock:
                        self._listeners.pop(token, None)

                return dispose
        listener()
        return lambda: None

    def _abort(self, reason: object) -> None:
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            self._reason = reason
            listeners = list(self._listeners.values())
            self._listeners.clear()
        # Outside the lock: a listener may read `.aborted` or subscribe again.
        for listener in listeners:
            listener()


class AbortController:
    """Write side of an abort. `abort()` is idempotent; the first reason wins."""

    def __init__(self) -> None:
        self._signal = AbortSignal()

    @property
    def signal(self) -> AbortSignal:
        return self._signal

    def abort(self, reason: object = None) -> None:
        self._signal._abort("aborted" if reason is None else reason)
