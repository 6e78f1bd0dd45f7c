"""`CompiledLauncher`: the compiled child (`compiled_child.py`) started from the executor's
own process, for confined spawns made without a spawn helper.

Without a helper (`spawn_helper: false`, and the one-shot CLI, whose single command does not
pay for a helper's start) a confined command was a `subprocess.Popen` with the Python child
(`ChildSetup` as `preexec_fn`): a fork of the whole harness, whose every page the child then
touched copy-on-write while it ran its steps in Python (10-14 ms for the CLI's `true`).
Here the same steps run as the helper runs them: `clone(CLONE_VM|CLONE_VFORK)` on a stack
of its own, the steps in C, the exec; the calling thread (the loop's, as with `Popen`: the
child's PDEATHSIG follows it) waits until the exec or the failure. The child is this
process's own (`OwnChild`): the executor watches and reaps it exactly as a `Popen`'s, after
its last `killpg`. Nothing about what is confined, or how, differs:
the steps, descriptors, session and failure reports are the helper's (`spawn_child.c`).
A plan whose steps have no compiled form is started by `Popen` as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import subprocess

from bash_local.spawn import Launcher, OwnChild, SpawnPlan, Started, popen
from bash_sandbox.linux import compiled_child
from bash_sandbox.linux.child_setup import ChildSetup
from bash_sandbox.linux.helper_client import placed_fds, spawn_failure


class CompiledLauncher(Launcher):
    """Starts `ChildSetup` plans with the compiled child, in this process."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib

    def launch(self, plan: SpawnPlan, *, stdin: int, stdout: int, stderr: int) -> Started:
        setup = plan.preexec_fn
        if not isinstance(setup, ChildSetup):
            raise subprocess.SubprocessError("the compiled child runs ChildSetup steps only")
        placed = placed_fds(setup, plan)
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC) if stdin < 0 else None
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            prepared = compiled_child.Spawn(
                argv=plan.argv,
                env=dict(plan.env),
                cwd=plan.cwd,
                fds=[devnull if devnull is not None else stdin, stdout, stderr, *placed],
                targets=placed,
                inheritable=plan.pass_fds,
                err_w=err_w,
                report_fd=setup.report_fd,
                steps=compiled_child.pack_steps(setup.native_steps()),
            )
            pid = compiled_child.spawn(self._lib, prepared)
        except TypeError:  # a step or argument C has no form for: the Python child
            pid = -1
        except BaseException:
            os.close(err_r)
            raise
        finally:
            os.close(err_w)
            if devnull is not None:
                os.close(devnull)
        if pid < 0:
            os.close(err_r)
            return popen(plan, stdin=stdin, stdout=stdout, stderr=stderr)
        report = b""
        try:
            # Every other end is closed by now: exec'd, or exited after its report.
            while chunk := os.read(err_r, 64):
                report += chunk
        finally:
            os.close(err_r)
        if report:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # it exits right after its report
            where, _, code = report.partition(b":")
            raise spawn_failure(plan, where.decode(errors="replace"), int(code or 0))
        return OwnChild(pid)

    async def launch_async(
        self, plan: SpawnPlan, *, stdin: int, stdout: int, stderr: int
    ) -> Started:
        # On the loop's thread, which waits for the exec as `Popen` does: a worker thread
        # would end, and the child's PDEATHSIG with it.
        return self.launch(plan, stdin=stdin, stdout=stdout, stderr=stderr)


def compiled_launcher() -> CompiledLauncher | None:
    """This process's launcher, where the compiled child is built (`compiled_child.built`)."""
    path = compiled_child.built()
    return _loaded(str(path)) if path is not None else None


@functools.cache
def _loaded(path: str) -> CompiledLauncher:
    return CompiledLauncher(compiled_child.load(path))
