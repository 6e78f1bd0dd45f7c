"""`SpawnHelper`: the executor's end of its spawn helper (`spawn_helper.py`), a `Launcher`.

Started once per executor on the loop thread (the helper's PR_SET_PDEATHSIG follows the
thread that started it), used only for plans whose pre-exec step is a `ChildSetup`: the
plan goes over as the setup's recorded calls (`ChildSetup.calls`) plus the descriptors
those steps, the report pipe and ``pass_fds`` name, placed in the child at the numbers they
have here. The executor no longer forks itself for a confined command: the loop waits for
one round trip (the helper's fork of a small process, the steps, the exec).

Process groups stay as with `Popen`: the helper makes the command a session leader (pid ==
pgid) and keeps it unreaped after it exits until `wait()` here says "reap", which
`SpawnedCommand` calls only after its last `killpg`, so a group id is never reused while the
executor may still signal it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as errnos
import logging
import marshal
import os
import socket
import subprocess
import sys
from collections.abc import Callable

from bash_local.spawn import LaunchedChild, Launcher, SpawnPlan
from bash_sandbox.linux import child_setup as child_setup_module
from bash_sandbox.linux import compiled_child
from bash_sandbox.linux.child_setup import ChildSetup
from bash_sandbox.loop_turns import follow_loop

logger = logging.getLogger("bash_sandbox")

HELPER_SCRIPT = os.path.join(os.path.dirname(__file__), "spawn_helper.py")
_MAX_MESSAGE = 1 << 22
_START_TIMEOUT_S = 10.0
_REPLY_TIMEOUT_S = 30.0
# The step methods whose argument is a descriptor of the executor's (by position).
_FD_ARGS = {"join_ns": 0, "landlock_allow": 0, "landlock_restrict": 0, "seccomp_listener": 1}


class SpawnHelperError(Exception):
    """The helper could not be started (the executor spawns from itself instead)."""


def helper_can_launch(plan: SpawnPlan) -> bool:
    return isinstance(plan.preexec_fn, ChildSetup)


def placed_fds(setup: ChildSetup, plan: SpawnPlan) -> tuple[int, ...]:
    """The descriptors ``plan``'s child must find at their numbers: those its steps name,
    the failure report's, and the plan's ``pass_fds``."""
    targets: dict[int, None] = {}
    for name, args, _ in setup.calls():
        index = _FD_ARGS.get(name)
        fd = args[index] if index is not None else None
        if isinstance(fd, int) and fd >= 0:
            targets[fd] = None
    if setup.report_fd >= 0:
        targets[setup.report_fd] = None
    for fd in plan.pass_fds:
        targets[fd] = None
    return tuple(targets)


class _HelperChild(LaunchedChild):
    def __init__(self, helper: SpawnHelper, pid: int) -> None:
        self._helper = helper
        self.pid = pid
        self.returncode: int | None = None
        self._callback: Callable[[], None] | None = None
        self._reaped = False

    def on_exit(self, callback: Callable[[], None]) -> None:
        if self.returncode is not None:
            asyncio.get_running_loop().call_soon(callback)
        else:
            self._callback = callback

    def exited(self, returncode: int) -> None:
        self.returncode = returncode
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()

    def wait(self) -> int:
        if not self._reaped:
            self._reaped = True
            self._helper.reap(self.pid)
        return self.returncode if self.returncode is not None else -9


class SpawnHelper(Launcher):
    """One executor's spawn helper. Not thread-safe: used from the executor's loop."""

    parents_here = False  # the helper is the leader's parent, and reports its exit

    def __init__(self, python: str | None = None) -> None:
        ours, theirs = socket.socketpair(
            socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC
        )
        for end in (ours, theirs):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _MAX_MESSAGE)
        try:
            self._proc = subprocess.Popen(
                [
                    python or sys.executable,
                    "-I",
                    "-S",
                    HELPER_SCRIPT,
                    str(theirs.fileno()),
                    str(os.getpid()),
                    child_setup_module.__file__ or "",
                    str(compiled_child.built() or ""),
                ],
                stdin=subprocess.DEVNULL,
                # It needs none, so a process that could read its environ finds nothing.
                env={},
                pass_fds=(theirs.fileno(),),
                close_fds=True,
                # Not in the caller's terminal session: a Ctrl-C is the CLI's to handle.
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise SpawnHelperError(f"the spawn helper could not be started: {exc}") from exc
        finally:
            theirs.close()
        self._sock = ours
        self._children: dict[int, _HelperChild] = {}
        # Requests sent: None until answered, then the answer ("started"/"failed").
        self._pending: dict[int, tuple[object, ...] | None] = {}
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._abandoned: set[int] = set()
        self._launched: dict[int, _HelperChild] = {}
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        try:
            ready = self._receive(_START_TIMEOUT_S)
        except OSError as exc:
            self.close()
            raise SpawnHelperError(f"the spawn helper did not start: {exc}") from exc
        if ready[0] != "ready":
            self.close()
            raise SpawnHelperError(f"the spawn helper said {ready[0]!r} at start")
        pid = ready[1]
        assert isinstance(pid, int)
        self.pid = pid
        # Whether its children run the compiled child (`compiled_child.py`) or Python.
        self.compiled_child = bool(ready[2])

    # -- the socket -------------------------------------------------------------------------

    def _receive(self, timeout: float | None, *, block: bool = True) -> tuple[object, ...]:
        self._sock.settimeout(timeout if block else 0)
        data = self._sock.recv(_MAX_MESSAGE)
        if not data:
            raise ConnectionResetError(errnos.ECONNRESET, "the spawn helper is gone")
        message = marshal.loads(data)  # noqa: S302 - from our own helper
        assert isinstance(message, tuple)
        return message

    def _dispatch(self, message: tuple[object, ...]) -> None:
        if message[0] in ("started", "failed"):
            seq = message[1]
            assert isinstance(seq, int)
            if seq in self._pending:
                self._pending[seq] = message
                if message[0] == "started":
                    pid = message[2]
                    assert isinstance(pid, int)
                    # Known from now on: an "exit" may follow before the launcher returns.
                    child = self._children[pid] = _HelperChild(self, pid)
                    self._launched[seq] = child
                if seq in self._abandoned:
                    self._dispatch_abandoned(seq)
                waiter = self._waiters.get(seq)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            return
        if message[0] == "exit":
            pid, code = message[1], message[2]
            assert isinstance(pid, int) and isinstance(code, int)
            ended = self._children.pop(pid, None)
            if ended is not None:
                ended.exited(code)

    def _on_readable(self) -> None:
        while True:
            try:
                message = self._receive(None, block=False)
            except (BlockingIOError, TimeoutError):
                return
            except OSError:
                self._lost()
                return
            self._dispatch(message)

    def _lost(self) -> None:
        """The helper died: so did its commands (their PDEATHSIG); each is reported killed."""
        if self.closed:
            return
        logger.warning("the spawn helper (pid %s) died; its commands were killed", self.pid)
        self.close()

    # -- Launcher ---------------------------------------------------------------------------

    def _send_spawn(self, plan: SpawnPlan, stdin: int, stdout: int, stderr: int) -> int:
        """Send one spawn request; its sequence number. Raises as `launch` does."""
        setup = plan.preexec_fn
        if not isinstance(setup, ChildSetup):
            raise subprocess.SubprocessError("the spawn helper runs ChildSetup steps only")
        if self.closed:
            raise subprocess.SubprocessError("the spawn helper is gone")
        # The running loop reads the answers (a later loop of the executor's takes over).
        self._loop = follow_loop(self._loop, self._sock.fileno(), self._on_readable)
        calls = setup.calls()
        placed = placed_fds(setup, plan)
        self._seq += 1
        seq = self._seq
        request = (
            "spawn",
            seq,
            list(plan.argv),
            dict(plan.env),
            plan.cwd,
            placed,
            tuple(plan.pass_fds),
            [(name, tuple(args), dict(kwargs)) for name, args, kwargs in calls],
            setup.report_fd,
        )
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC) if stdin < 0 else None
        try:
            fds = [devnull if devnull is not None else stdin, stdout, stderr, *placed]
            self._sock.settimeout(_REPLY_TIMEOUT_S)
            socket.send_fds(self._sock, [marshal.dumps(request)], fds)
        except OSError as exc:
            self._lost()
            raise subprocess.SubprocessError(f"the spawn helper failed: {exc}") from exc
        finally:
            if devnull is not None:
                os.close(devnull)
        self._pending[seq] = None
        return seq

    def launch(self, plan: SpawnPlan, *, stdin: int, stdout: int, stderr: int) -> LaunchedChild:
        seq = self._send_spawn(plan, stdin, stdout, stderr)
        try:
            while self._pending.get(seq) is None:
                self._dispatch(self._receive(_REPLY_TIMEOUT_S))
        except OSError as exc:
            self._pending.pop(seq, None)
            self._lost()
            raise subprocess.SubprocessError(f"the spawn helper failed: {exc}") from exc
        return self._answer(plan, seq)

    async def launch_async(
        self, plan: SpawnPlan, *, stdin: int, stdout: int, stderr: int
    ) -> LaunchedChild:
        seq = self._send_spawn(plan, stdin, stdout, stderr)
        assert self._loop is not None
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiters[seq] = waiter

        def too_late() -> None:
            if not waiter.done():
                waiter.set_exception(TimeoutError("the spawn helper did not answer"))

        # Not `asyncio.wait_for`: on 3.11 it swallows a cancellation that arrives together
        # with the answer, and the cancelled run would go on.
        timer = self._loop.call_later(_REPLY_TIMEOUT_S, too_late)
        try:
            await waiter
        except BaseException:
            self._waiters.pop(seq, None)
            # Nobody will watch what this request started: it dies as soon as it is known.
            self._abandoned.add(seq)
            if self._pending.get(seq) is not None:
                self._dispatch_abandoned(seq)
            raise
        finally:
            timer.cancel()
            self._waiters.pop(seq, None)
        if self.closed and self._pending.get(seq) is None:
            self._pending.pop(seq, None)
            raise subprocess.SubprocessError("the spawn helper is gone")
        return self._answer(plan, seq)

    def _answer(self, plan: SpawnPlan, seq: int) -> LaunchedChild:
        reply = self._pending.pop(seq)
        assert reply is not None
        if reply[0] == "failed":
            raise _failure(plan, reply)
        return self._launched.pop(seq)

    def _dispatch_abandoned(self, seq: int) -> None:
        self._abandoned.discard(seq)
        reply = self._pending.pop(seq, None)
        if reply is None or reply[0] != "started":
            return
        child = self._launched.pop(seq)
        if child.returncode is None:
            with contextlib.suppress(OSError):
                os.killpg(child.pid, 9)  # unreaped until we say so: still this command's group

        def reap() -> None:
            child.wait()

        child.on_exit(reap)

    def reap(self, pid: int) -> None:
        if self.closed:
            return
        try:
            self._sock.settimeout(_REPLY_TIMEOUT_S)
            self._sock.send(marshal.dumps(("reap", pid)))
        except OSError:
            self._lost()

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """End of file for the helper: it kills and reaps what is left, and exits."""
        if self.closed:
            return
        self.closed = True
        if self._loop is not None:
            with contextlib.suppress(RuntimeError, ValueError):
                # Only on the loop's own thread (a finalizer may run anywhere): a reader left
                # on a closed socket is dropped with the loop.
                if asyncio.get_running_loop() is self._loop:
                    self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_result(None)  # answered "gone" by launch_async
        children, self._children = self._children, {}
        loop = self._loop
        for child in children.values():
            # Reported killed (the helper's death killed them), on the loop's own thread.
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(child.exited, -9)


def _failure(plan: SpawnPlan, reply: tuple[object, ...]) -> Exception:
    where, code = reply[2], reply[3]
    assert isinstance(code, int)
    return spawn_failure(plan, str(where), code, reply[4:])


def spawn_failure(plan: SpawnPlan, where: str, code: int, detail: object = ()) -> Exception:
    """The exception `subprocess.Popen` would have raised for a child that reported
    failing at ``where`` ("cwd", "exec", "step") with errno ``code``."""
    if where == "cwd":
        return OSError(code, os.strerror(code), plan.cwd)
    if where == "exec":
        return OSError(code, os.strerror(code), plan.argv[0])
    if where == "step":
        return subprocess.SubprocessError("Exception occurred in preexec_fn.")
    return subprocess.SubprocessError(f"the spawn helper refused the plan: {detail}")
