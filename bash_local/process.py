"""One spawned command, from fork to settled, and the background handle built on it.

`SpawnedCommand` owns the process group it creates: ``start_new_session=True`` makes the
bash (or wrapper) pid the group id and leaves the group without a controlling terminal.
It holds that group until the run has *settled*:

1. the leader exits (seen through a pidfd, or a waiter thread where there is none), but it
   is not reaped yet, so its pid, which is the group id, cannot be reused meanwhile;
2. stdout and stderr are read until EOF, or for at most ``grace`` after the leader exited
   (a `sleep 30 &` holding the pipes must not hold the run);
3. the whole group gets SIGKILL (leftovers such as `sleep 100 &` never outlive a run), the
   pipes are drained of what is already buffered and closed, and only then the leader is
   reaped and ``on_settled`` runs (the executor settles and closes the spawn's scope there).

Timeouts, aborts and `kill()` send SIGTERM to the group and SIGKILL after ``grace``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Literal

from bash_local.output import OutputCollector, decode
from bash_local.spawn import (
    LaunchedChild,
    Launcher,
    SpawnOutcome,
    SpawnPlan,
    Started,
    children_stay_to_be_reaped,
    folded_signal,
    popen,
)
from bash_seam import (
    AbortSignal,
    BashProcess,
    BashProcessRead,
    ChildrenReapedError,
    ProcessStatus,
    SandboxFacts,
)

logger = logging.getLogger("bash_local")


def _refuse_unreapable(launcher: Launcher | None) -> None:
    """Refuse, before anything runs, a leader this process would parent while the kernel
    reaps its children for it (`children_stay_to_be_reaped`)."""
    if (launcher is None or launcher.parents_here) and not children_stay_to_be_reaped():
        raise ChildrenReapedError()


READ_CHUNK = 1 << 16
# Upper bound of the last non-blocking drain once the group is dead (pipe buffers only).
_FINAL_DRAIN_READS = 64

KillReason = Literal["timeout", "abort", "kill", "close"]
GroupKiller = Callable[[int, int], None]


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


class _StdinFeeder:
    """Writes the request's stdin into the pipe without blocking, then closes it.

    A command may exit (or close fd 0) before reading everything: EPIPE just ends the feed.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, data: bytes) -> None:
        self._loop = loop
        self._fd: int | None = fd
        self._data = memoryview(data)
        self._pos = 0
        self._watching = False

    def start(self) -> None:
        os.set_blocking(self._fd, False)  # type: ignore[arg-type]
        self._on_writable()

    def _on_writable(self) -> None:
        fd = self._fd
        if fd is None:
            return
        try:
            while self._pos < len(self._data):
                self._pos += os.write(fd, self._data[self._pos : self._pos + READ_CHUNK])
        except BlockingIOError:
            if not self._watching:
                self._loop.add_writer(fd, self._on_writable)
                self._watching = True
            return
        except (BrokenPipeError, ConnectionResetError):
            pass  # the reader is gone; the command decides what that means
        except OSError as exc:
            logger.debug("stdin write failed: %s", exc)
        self.close()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._watching:
            self._loop.remove_writer(fd)
        os.close(fd)


class _Stdio:
    """The pipes of one spawn; ``opened`` lists every end, for closing on failure."""

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.out_r = self.out_w = self.err_r = self.err_w = -1
        self.stdin: int = subprocess.DEVNULL
        self.in_w: int | None = None

    def pipe(self) -> tuple[int, int]:
        r, w = os.pipe()
        self.opened += (r, w)
        return r, w

    def close_all(self) -> None:
        for fd in self.opened:
            with contextlib.suppress(OSError):
                os.close(fd)


class SpawnedCommand:
    """Spawns one `SpawnPlan` in a new session and watches its process group until settled."""

    def __init__(
        self,
        plan: SpawnPlan,
        *,
        stdin: bytes | None,
        stdout: OutputCollector,
        stderr: OutputCollector,
        grace_s: float,
        kill_group: GroupKiller,
        on_settled: Callable[[SpawnedCommand], None] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.plan = plan
        self.stdout = stdout
        self.stderr = stderr
        self._stdin = stdin
        self._grace_s = grace_s
        self._kill_group = kill_group
        self._on_settled = on_settled
        self._proc: Started | None = None
        self.pid = 0
        self._pipes: dict[int, OutputCollector] = {}
        self._feeder: _StdinFeeder | None = None
        self._pidfd: int | None = None
        self._leader_exited = False
        self._term_sent = False
        self._finalized = False
        self._timers: list[asyncio.TimerHandle] = []
        self._drain_timer: asyncio.TimerHandle | None = None
        self._abort_dispose: Callable[[], None] | None = None
        self.kill_reason: KillReason | None = None
        self.exit_code: int | None = None
        self.signal: str | None = None
        # Set by the executor's settle callback, before `settled` fires.
        self.facts: SandboxFacts | None = None
        self.facts_error: Exception | None = None
        self.settled = asyncio.Event()  # the group is dead, the leader reaped
        self.finished = asyncio.Event()  # and its scope has settled and closed (the executor's)

    # -- spawning --------------------------------------------------------------------------

    def spawn(self) -> None:
        """Fork and exec on the loop thread.

        Always on the loop thread, never a worker: a confined child arms PR_SET_PDEATHSIG,
        which fires when the *thread* that forked it exits, so a fork from a short-lived
        worker thread would kill the command as soon as that thread ends.

        On failure every descriptor opened here is closed and the exception (OSError,
        SubprocessError) propagates: nothing is running. The plan's own fds stay open (its
        scope owns them), so the caller can still read them to explain the failure.
        """
        plan = self.plan
        _refuse_unreapable(plan.launcher)
        stdio = self._open_stdio()
        try:
            if plan.launcher is not None:
                self._proc = plan.launcher.launch(
                    plan, stdin=stdio.stdin, stdout=stdio.out_w, stderr=stdio.err_w
                )
            else:
                self._proc = popen(plan, stdin=stdio.stdin, stdout=stdio.out_w, stderr=stdio.err_w)
        except BaseException:
            stdio.close_all()
            raise
        self._started(stdio)

    async def spawn_launched(self, launcher: Launcher) -> None:
        """`spawn()` through a launcher that forks elsewhere: the loop awaits its answer
        instead of blocking on a fork. Same failures, same descriptors afterwards."""
        _refuse_unreapable(launcher)
        stdio = self._open_stdio()
        try:
            self._proc = await launcher.launch_async(
                self.plan, stdin=stdio.stdin, stdout=stdio.out_w, stderr=stdio.err_w
            )
        except BaseException:
            stdio.close_all()
            raise
        self._started(stdio)

    def _open_stdio(self) -> _Stdio:
        stdio = _Stdio()
        try:
            stdio.out_r, stdio.out_w = stdio.pipe()
            stdio.err_r, stdio.err_w = stdio.pipe()
            if self._stdin is not None:
                stdio.stdin, stdio.in_w = stdio.pipe()
        except BaseException:
            stdio.close_all()
            raise
        return stdio

    def _started(self, stdio: _Stdio) -> None:
        assert self._proc is not None
        self.pid = self._proc.pid
        # The child holds its ends now; ours must go, or EOF would never come.
        for fd in stdio.opened:
            if fd not in (stdio.out_r, stdio.err_r, stdio.in_w):
                os.close(fd)
        for fd, collector in ((stdio.out_r, self.stdout), (stdio.err_r, self.stderr)):
            os.set_blocking(fd, False)
            self._pipes[fd] = collector
            self._loop.add_reader(fd, self._on_readable, fd)
        if stdio.in_w is not None:
            self._feeder = _StdinFeeder(self._loop, stdio.in_w, self._stdin or b"")
            self._feeder.start()
        self._watch_leader_exit()

    def _watch_leader_exit(self) -> None:
        if isinstance(self._proc, LaunchedChild):
            self._proc.on_exit(self._on_leader_exit)  # its launcher is the parent
            return
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self._pidfd = None
        if self._pidfd is not None:
            self._loop.add_reader(self._pidfd, self._on_pidfd_readable)
            return
        # No pidfd (macOS, old kernels): a thread waits without reaping where it can.
        threading.Thread(
            target=self._wait_leader_in_thread, name=f"bash-local-wait-{self.pid}", daemon=True
        ).start()

    def _wait_leader_in_thread(self) -> None:
        try:
            if hasattr(os, "waitid"):
                # WNOWAIT leaves the zombie in place, so the group id stays ours.
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            else:  # pragma: no cover - platforms without waitid
                assert self._proc is not None
                self._proc.wait()
        except ChildProcessError:
            pass
        except OSError as exc:  # pragma: no cover - unexpected
            logger.warning("waiting for pid %d failed: %s", self.pid, exc)
        with contextlib.suppress(RuntimeError):  # the loop may be closed already
            self._loop.call_soon_threadsafe(self._on_leader_exit)

    def _on_pidfd_readable(self) -> None:
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self._on_leader_exit()

    # -- limits and signals ----------------------------------------------------------------

    def arm_timeout(self, seconds: float) -> None:
        self._timers.append(self._loop.call_later(seconds, self.terminate, "timeout"))

    def watch_abort(self, abort: AbortSignal) -> None:
        """Terminate on abort; the signal may fire from any thread."""

        def on_abort() -> None:
            with contextlib.suppress(RuntimeError):  # the loop may be closed already
                self._loop.call_soon_threadsafe(self.terminate, "abort")

        self._abort_dispose = abort.subscribe(on_abort)

    def terminate(self, reason: KillReason) -> bool:
        """SIGTERM the group, SIGKILL after grace. False once settled.

        The first reason wins (a timeout and an abort are never both reported), and none is
        recorded once the leader exited on its own.
        """
        if self._finalized:
            return False
        if not self._leader_exited and self.kill_reason is None:
            self.kill_reason = reason
        if not self._term_sent:
            self._term_sent = True
            self._kill_group(self.pid, signal.SIGTERM)
            self._timers.append(self._loop.call_later(self._grace_s, self.kill_now))
        return True

    def kill_now(self) -> None:
        """SIGKILL the group at once (escalation, or the awaiting task was cancelled)."""
        if not self._finalized:
            # Not settled means the leader is unreaped, so the group id is still ours.
            self._kill_group(self.pid, signal.SIGKILL)

    # -- the path to settled ---------------------------------------------------------------

    def _on_readable(self, fd: int) -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError as exc:
            logger.debug("reading pipe %d failed: %s", fd, exc)
            data = b""
        if data:
            collector = self._pipes[fd]
            collector.feed(data)
            paced = collector.paced
            if paced is not None and paced.held():
                # The listener's reader is behind: this pipe waits, the loop does not.
                self._loop.remove_reader(fd)
                paced.on_drained(functools.partial(self._resume_soon, fd))
            return
        self._close_pipe(fd)
        if self._leader_exited and not self._pipes:
            self._finalize()

    def _resume_soon(self, fd: int) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may be closed already
            self._loop.call_soon_threadsafe(self._resume, fd)

    def _resume(self, fd: int) -> None:
        if not self._finalized and fd in self._pipes:
            self._loop.add_reader(fd, self._on_readable, fd)

    def _close_pipe(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        os.close(fd)
        del self._pipes[fd]

    def _on_leader_exit(self) -> None:
        if self._leader_exited or self._finalized:
            return
        self._leader_exited = True
        if not self._pipes:
            self._finalize()
        else:
            # Descendants may still hold the pipes: they get at most `grace` to finish.
            self._drain_timer = self._loop.call_later(self._grace_s, self._finalize)

    def _finalize(self) -> None:
        if self._finalized:
            return
        for timer in self._timers:
            timer.cancel()
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        if self._abort_dispose is not None:
            self._abort_dispose()
        try:
            # The leader is an unreaped zombie, so pid == pgid cannot have been recycled:
            # this SIGKILL reaches exactly what is left of the command's group.
            self._kill_group(self.pid, signal.SIGKILL)
        except Exception:
            logger.exception("killing process group %d failed", self.pid)
        self._finalized = True
        for fd in list(self._pipes):
            self._drain_buffered(fd)
            self._close_pipe(fd)
        if self._feeder is not None:
            self._feeder.close()
        assert self._proc is not None
        returncode = self._proc.wait()  # reaps the zombie: returns at once
        folded = folded_signal(returncode) if self.plan.folds_signals else None
        if returncode < 0:
            self.signal = signal_name(-returncode)
        elif self.kill_reason is not None and folded is not None:
            # We signalled the group and a runner reported the death as 128+n: it was n.
            self.signal = signal_name(folded)
        else:
            self.exit_code = returncode
        self.stdout.close()
        self.stderr.close()
        try:
            if self._on_settled is not None:
                self._on_settled(self)
        except Exception:
            logger.exception("settling pid %d failed", self.pid)
        finally:
            self.settled.set()

    def _drain_buffered(self, fd: int) -> None:
        """Read what is already in the pipe buffer; the writers are dead or past their grace."""
        for _ in range(_FINAL_DRAIN_READS):
            try:
                data = os.read(fd, READ_CHUNK)
            except OSError:
                return
            if not data:
                return
            self._pipes[fd].feed(data)

    def outcome(self, *, background: bool) -> SpawnOutcome:
        """This settled command's outcome, with the bounded output tails."""
        return SpawnOutcome(
            exit_code=self.exit_code,
            signal=self.signal,
            timed_out=self.kill_reason == "timeout",
            aborted=self.kill_reason == "abort",
            stdout=self.stdout.collected().text,
            stderr=self.stderr.collected().text,
            background=background,
        )


class LocalBashProcess(BashProcess):
    """A background command: status, consuming incremental reads, kill, wait."""

    def __init__(
        self,
        process_id: str,
        command: str,
        owner: str | None,
        stdout: OutputCollector,
        stderr: OutputCollector,
    ) -> None:
        self.id = process_id
        self.command = command
        self.owner = owner
        self._stdout = stdout
        self._stderr = stderr
        self._spawned: SpawnedCommand | None = None
        self._status: ProcessStatus = "running"
        self._exit_code: int | None = None
        self._signal: str | None = None
        self._sandbox: SandboxFacts | None = None
        self._done = asyncio.Event()
        self._offsets = [0, 0]

    def attach(self, spawned: SpawnedCommand) -> None:
        self._spawned = spawned

    def settle(
        self,
        status: ProcessStatus,
        *,
        exit_code: int | None,
        signal: str | None,
        sandbox: SandboxFacts | None,
    ) -> None:
        """Record the outcome; `wait()` returns from here on."""
        self._status = status
        self._exit_code = exit_code
        self._signal = signal
        self._sandbox = sandbox
        self._spawned = None  # settled: nothing left to signal, and the plan can be freed
        self._done.set()

    @property
    def status(self) -> ProcessStatus:
        return self._status

    @property
    def exit_code(self) -> int | None:
        return self._exit_code

    @property
    def signal(self) -> str | None:
        return self._signal

    @property
    def sandbox(self) -> SandboxFacts | None:
        return self._sandbox

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> None:
        # An Event, not the settle future: a cancelled waiter cannot cancel the process.
        await self._done.wait()

    def kill(self) -> bool:
        return self._terminate("kill")

    def _terminate(self, reason: KillReason) -> bool:
        if self._done.is_set() or self._spawned is None:
            return False
        return self._spawned.terminate(reason)

    def read_output(self) -> BashProcessRead:
        final = self._done.is_set()
        out, self._offsets[0], out_lossy = self._stdout.read_from(self._offsets[0], final=final)
        err, self._offsets[1], err_lossy = self._stderr.read_from(self._offsets[1], final=final)
        stdout, stderr = decode(out), decode(err)
        delta = stdout
        if stderr:
            if delta and not delta.endswith("\n"):
                delta += "\n"
            delta += "[stderr]\n" + stderr
        return BashProcessRead(
            delta=delta,
            lossy=out_lossy or err_lossy,
            stdout_delta=stdout,
            stderr_delta=stderr,
            stdout_spill_path=self._stdout.spill_path,
            stderr_spill_path=self._stderr.spill_path,
        )
