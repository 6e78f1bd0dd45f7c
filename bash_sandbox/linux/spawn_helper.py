"""The spawn helper: a small per-executor process that forks, sets up and execs commands.

Run as ``python -I -S spawn_helper.py <socket fd> <executor pid> <child_setup.py>
[<compiled child>]``; it imports only standard modules (os, socket, select, fcntl, marshal,
array, importlib.util, sys, threading) and `child_setup.py` and `compiled_child.py` (ctypes),
loaded by path: a fork of it is a fork of a few MiB, never of the harness. With the compiled
child (the package's build, checked by the executor) each child runs C only, from start to exec
(`compiled_child.py`), started by one of this process's spawner threads as posix_spawn
starts a child (on this process's memory, the starting thread suspended until the exec:
`_Spawners`); without it the child below is forked and runs the same steps in Python. The
executor's client is `helper_client.py`.

Protocol (one SOCK_SEQPACKET socket, marshal-encoded tuples, trusted both ways: the
executor made the socket pair and started this process):

- ``("ready", pid, compiled)`` once, at start: ``compiled`` says whether the children run
  the compiled child.
- ``("spawn", seq, argv, env, cwd, targets, inheritable, calls, report_fd)`` with the
  descriptors ``stdin, stdout, stderr, *targets`` (SCM_RIGHTS). The child replays ``calls``
  on a fresh `ChildSetup` (built here, before the fork, in this process's memory), places
  each target descriptor at the number it had in the executor (the steps and bwrap's
  ``--seccomp N`` name them so), runs the steps and execs. Answer: ``("started", seq,
  pid)`` once the exec succeeded, or ``("failed", seq, where, errno)`` with ``where`` one
  of ``cwd``, ``step`` (the step's own record is on the report pipe) or ``exec``. Answers
  come in the order the children finish their setup: while one sets up, the next request
  is served.
- ``("exit", pid, returncode)``, unsolicited, when a command's leader exits. The leader is
  NOT reaped then (``WNOWAIT``): it stays a zombie, so its pid, which is its process group
  id, cannot be reused while the executor still signals that group.
- ``("reap", pid)`` from the executor once it has settled the command: reaped now.

On end of file (the executor closed it, or died) every command's group is killed and
reaped, and the helper exits. It also dies with the executor's thread that started it
(PR_SET_PDEATHSIG), and each command dies with it (the command's own PDEATHSIG step).
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import importlib.util
import marshal
import os
import select
import socket
import sys
import threading
from collections import deque

TYPE_CHECKING = False
if TYPE_CHECKING:  # never imported at run time: the helper stays lean
    from typing import Any, NoReturn

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9
_SIGCHLD = 17
_MAX_MESSAGE = 1 << 22
_MAX_FDS = 250
_FD_SIZE = 4  # a descriptor in SCM_RIGHTS: a C int
_CLD_EXITED = 1
# Children being started at once (each a thread while it sets up; more wait their turn).
_MAX_SPAWNERS = 16


def _load(name: str, path: str) -> Any:
    # Through the import system by path: it uses the bytecode the executor's own import of
    # the module cached (compiling the source here took 5 ms of every helper's start).
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses looks the module up
    spec.loader.exec_module(module)
    return module


def _send(sock: socket.socket, *message: Any) -> None:
    sock.sendall(marshal.dumps(message))


def _child(request: Any, fds: list[int], err_w: int, setup: Any) -> NoReturn:
    """In the forked child: never returns."""
    _, _, argv, env, cwd, targets, inheritable, _, _ = request
    where = b"cwd"
    try:
        os.setsid()
        high = max((2, err_w, *targets)) + 1
        err_w = fcntl.fcntl(err_w, fcntl.F_DUPFD_CLOEXEC, high)
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high) for fd in fds]
        for number, fd in enumerate(moved[:3]):
            os.dup2(fd, number)
        for target, fd in zip(targets, moved[3:], strict=True):
            os.dup2(fd, target, inheritable=target in inheritable)
        keep = sorted({0, 1, 2, err_w, *targets})
        low = 0
        for fd in keep:
            if fd > low:
                os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1 << 20)
        os.chdir(cwd)
        # This process ignores SIGPIPE (Python does); a command starts with the default.
        setup._lib.signal(13, 0)
        setup._lib.signal(25, 0)
        where = b"step"
        setup()
        where = b"exec"
        os.execve(argv[0], argv, env)  # noqa: S606 - the plan's argv, as Popen would
    except OSError as exc:
        code = exc.errno or 0
        os.write(err_w, where + b":" + str(code).encode())
    finally:
        os._exit(255)


class _Starting:
    """A child being set up: its request's sequence number, pid and failure report so far."""

    def __init__(self, seq: int, pid: int) -> None:
        self.seq = seq
        self.pid = pid
        self.report = bytearray()


class _Job:
    """One compiled child to start: the request in C form and the setup whose buffers its
    steps point into (both kept until the child has exec'd), the descriptors it copies, and
    its exec-status pipe."""

    def __init__(
        self, seq: int, prepared: Any, setup: Any, fds: list[int], err: tuple[int, int]
    ) -> None:
        self.seq, self.prepared, self.setup, self.fds = seq, prepared, setup, fds
        self.err_r, self.err_w = err


class _Spawners:
    """Threads that start compiled children, one at a time each.

    `compiled_child.spawn` returns only once its child has exec'd (or failed): the calling
    thread is suspended meanwhile, so a child slow in a step holds back only the thread that
    started it; another thread (up to `_MAX_SPAWNERS`, then they queue) starts the next. A
    thread never ends before this process: each command's PDEATHSIG follows the thread that
    started it. What a thread learns (pid, failure report) reaches the main thread through
    `done` and a byte on the wake pipe; only the main thread answers the executor.
    """

    def __init__(self, compiled: Any, native: Any) -> None:
        self.compiled, self.native = compiled, native
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.done: deque[tuple[int, int, bytes, int]] = deque()  # seq, pid, report, errno
        self._jobs: deque[_Job] = deque()
        self._ready = threading.Condition()
        self._idle = 0
        self._threads = 0

    def submit(self, job: _Job) -> None:
        with self._ready:
            self._jobs.append(job)
            if self._idle == 0 and self._threads < _MAX_SPAWNERS:
                self._threads += 1
                threading.Thread(target=self._serve, daemon=True).start()
            self._ready.notify()

    def _serve(self) -> None:
        while True:
            with self._ready:
                self._idle += 1
                while not self._jobs:
                    self._ready.wait()
                self._idle -= 1
                job = self._jobs.popleft()
            self.done.append(self._start(job))
            del job  # the child has exec'd: nothing reads the request's memory now
            with contextlib.suppress(BlockingIOError):
                os.write(self.wake_w, b"x")

    def _start(self, job: _Job) -> tuple[int, int, bytes, int]:
        """(seq, pid, failure report, errno): pid -1 when no child could be started."""
        pid, code = -1, 0
        try:
            pid = self.compiled.spawn(self.native, job.prepared)
        except Exception as exc:  # answered as a failed spawn: a lost answer would hang it
            code = getattr(exc, "errno", 0) or 0
        finally:
            for fd in (job.err_w, *job.fds):
                os.close(fd)
        report = bytearray()
        try:
            # Every other end is closed by now (exec'd, exited, or soon: a forked child).
            while chunk := os.read(job.err_r, 64):
                report += chunk
        finally:
            os.close(job.err_r)
        return job.seq, pid, bytes(report), code


class Helper:
    def __init__(
        self, sock: socket.socket, child_setup: Any, compiled: Any = None, native: Any = None
    ) -> None:
        self.sock = sock
        self.cs = child_setup
        self.compiled = compiled  # `compiled_child.py` and its build, or None: Python children
        self.native = native
        self.poll = select.poll()
        self.poll.register(sock.fileno(), select.POLLIN)
        self.running: dict[int, int] = {}  # pidfd -> pid
        self.starting: dict[int, _Starting] = {}  # exec-status pipe -> child being set up
        self.zombies: set[int] = set()
        self.buffer = bytearray(_MAX_MESSAGE)
        self.ancillary_size = socket.CMSG_SPACE(_MAX_FDS * _FD_SIZE)
        self.replays = child_setup.ReplayCache(compiled.pack_steps if native is not None else None)
        self.spawners = _Spawners(compiled, native) if native is not None else None
        if self.spawners is not None:
            self.poll.register(self.spawners.wake_r, select.POLLIN)

    def receive(self) -> tuple[memoryview, list[int]]:
        """One request and its descriptors, read into the buffer kept for it (a new 4 MiB
        buffer per request, as `socket.recv_fds` makes, was an mmap, an mremap and a
        munmap of every spawn)."""
        size, ancillary, _, _ = self.sock.recvmsg_into([self.buffer], self.ancillary_size)
        fds: list[int] = []
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % _FD_SIZE
                fds += array.array("i", payload[:usable])
        return memoryview(self.buffer)[:size], fds

    def spawn(self, request: Any, fds: list[int]) -> None:
        _, seq, _, _, _, _, _, calls, report_fd = request
        try:
            setup, packed = self.replays.replay(calls, report_fd)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
        except Exception as exc:  # a request this helper cannot replay: nothing forked
            for fd in fds:
                os.close(fd)
            _send(self.sock, "failed", seq, "helper", 0, repr(exc))
            return
        prepared = self._compiled(request, fds, err_w, packed)
        if prepared is not None and self.spawners is not None:
            # The spawner closes err_w and fds once its child has copied them.
            self.spawners.submit(_Job(seq, prepared, setup, fds, (err_r, err_w)))
            return
        pid = os.fork()
        if pid == 0:
            _child(request, fds, err_w, setup)
        os.close(err_w)
        for fd in fds:
            os.close(fd)
        # Answered once the exec succeeds (the pipe closes) or the child reports where it
        # failed; meanwhile this process serves the next request, whose child sets up on
        # another core.
        self.starting[err_r] = _Starting(seq, pid)
        self.poll.register(err_r, select.POLLIN)

    def _compiled(self, request: Any, fds: list[int], err_w: int, steps: bytes | None) -> Any:
        """The request in C form, or None: the Python child runs it (no compiled child, or
        a step or argument C has no form for: no packed ``steps``)."""
        if self.native is None or steps is None:
            return None
        _, _, argv, env, cwd, targets, inheritable, _, report_fd = request
        try:
            return self.compiled.Spawn(
                argv=argv,
                env=env,
                cwd=cwd,
                fds=fds,
                targets=targets,
                inheritable=inheritable,
                err_w=err_w,
                report_fd=report_fd,
                steps=steps,
            )
        except (TypeError, ValueError, KeyError):
            return None

    def spawned(self) -> None:
        """Spawner threads have news: answer each child they started."""
        assert self.spawners is not None
        with contextlib.suppress(BlockingIOError):
            os.read(self.spawners.wake_r, 4096)
        while self.spawners.done:
            seq, pid, report, code = self.spawners.done.popleft()
            if pid < 0:
                _send(self.sock, "failed", seq, "helper", code, "the child could not start")
                continue
            self._started(seq, pid, report)

    def exec_news(self, err_r: int) -> None:
        """The exec-status pipe of a child being set up is readable."""
        starting = self.starting[err_r]
        chunk = os.read(err_r, 64)
        if chunk:
            starting.report += chunk
            return
        del self.starting[err_r]
        self.poll.unregister(err_r)
        os.close(err_r)
        self._started(starting.seq, starting.pid, bytes(starting.report))

    def _started(self, seq: int, pid: int, report: bytes) -> None:
        """The child ``pid`` of request ``seq`` exec'd (``report`` empty) or reported where it
        failed: the executor is answered."""
        if report:
            os.waitpid(pid, 0)  # it exits right after its report
            where, _, code = report.partition(b":")
            _send(self.sock, "failed", seq, where.decode(), int(code or 0), "")
            return
        pidfd = os.pidfd_open(pid)
        self.running[pidfd] = pid
        self.poll.register(pidfd, select.POLLIN)
        _send(self.sock, "started", seq, pid)

    def exited(self, pidfd: int) -> None:
        pid = self.running.pop(pidfd)
        self.poll.unregister(pidfd)
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)
        os.close(pidfd)
        self.zombies.add(pid)
        if info is None:  # pragma: no cover - cannot happen without WNOHANG
            code = 255
        elif info.si_code == _CLD_EXITED:
            code = info.si_status
        else:
            code = -info.si_status
        _send(self.sock, "exit", pid, code)

    def reap(self, pid: int) -> None:
        if pid in self.zombies:
            self.zombies.discard(pid)
            os.waitpid(pid, 0)

    def shutdown(self) -> None:
        """The executor is gone: every group it had dies, then is reaped."""
        # Children a spawner thread is still starting are known only to the kernel.
        starting = {child.pid for child in self.starting.values()} | _own_children()
        pids = [*self.running.values(), *self.zombies, *starting]
        for pid in starting:
            with contextlib.suppress(OSError):
                os.kill(pid, _SIGKILL)  # it may not lead its own group yet
        for pid in pids:
            with contextlib.suppress(OSError):
                os.killpg(pid, _SIGKILL)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)

    def serve(self) -> None:
        sock_fd = self.sock.fileno()
        while True:
            for fd, _ in self.poll.poll():
                if fd in self.starting:
                    self.exec_news(fd)
                    continue
                if self.spawners is not None and fd == self.spawners.wake_r:
                    self.spawned()
                    continue
                if fd != sock_fd:
                    self.exited(fd)
                    continue
                try:
                    data, fds = self.receive()
                except OSError:
                    return  # as end of file: the executor is gone
                if not data:
                    return
                request = marshal.loads(data)  # noqa: S302 - from our own executor
                if request[0] == "spawn":
                    self.spawn(request, fds)
                elif request[0] == "reap":
                    self.reap(request[1])


def _own_children() -> set[int]:
    """This process's children, whichever of its threads started them."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as fh:
                found |= {int(pid) for pid in fh.read().split()}
    return found


def main() -> None:
    sock_fd, parent, setup_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    child_setup = _load("child_setup", setup_path)
    compiled = native = None
    if len(sys.argv) > 4 and sys.argv[4]:
        compiled_path = os.path.join(os.path.dirname(setup_path), "compiled_child.py")
        compiled = _load("compiled_child", compiled_path)
        native = compiled.load(sys.argv[4])
    lib = child_setup.libc()
    # An ignored SIGCHLD (inherited through exec) would reap exited commands at once: the
    # zombie that keeps a group id from reuse must stay until the executor says "reap".
    lib.signal(_SIGCHLD, 0)
    # Die with the executor's thread that started us; it may have died already.
    lib.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
    sock = socket.socket(fileno=sock_fd)
    helper = Helper(sock, child_setup, compiled, native)
    _send(sock, "ready", os.getpid(), native is not None)
    try:
        helper.serve()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the executor closed its end while we answered: the same as end of file
    finally:
        helper.shutdown()
    # Not joined: a spawner thread may still be returning from a child the shutdown killed.
    os._exit(0)


if __name__ == "__main__":
    main()
