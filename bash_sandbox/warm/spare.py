"""A spare: a fork of the warm daemon that builds, before a call comes, the executor the
last call of the same shape needed, then serves exactly one call.

A call through the daemon otherwise pays a whole executor's start in its fork (its state
directory, the backend's probe verdict, the namespaces, the supervisor) and then a first
spawn's one-time costs. When a call ends, the daemon forks a spare from that call's request
(its arguments, environment, umask and working directory, `daemon.py`); the spare parses
them as the call did, builds its config and executor, prepares the call's mode, rehearses
one spawn (`_rehearse`), leaves the directory (holding nothing of it), and waits for the
next call the daemon routes to it.

What the spare made is used only for the call it was made for, checked at the call, in the
call's own context: the same environment, umask and working directory (device and inode),
and then an equal config, read afresh from the call's arguments and config files
(`Prepared.take`, the CLI's `ReadyExecutor`). Anything else is served as a fresh fork
would serve it, and the unused executor is closed after the answer. The executor holds no
result of another call: the one command it ran is its rehearsal, a `true` under its own
read-only policy, which writes nothing the host sees. It checks the host before each spawn
as any executor does between its commands (`host_view.py`); what it decided early is the
backend (a probe verdict, as the probe cache gives a fresh call) and its namespaces. A
spare serves one call, lives at most `MAX_AGE_S`, and exits, closing its executor, when the
daemon closes its end (the daemon exiting included).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import locale
import os
import socket
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bash_sandbox.warm import wire
from bash_seam import BashExecRequest
from policies import SandboxMode

if TYPE_CHECKING:
    from bash_sandbox.cli.arguments import CliArgumentParser
    from bash_sandbox.config import SandboxBashConfig
    from bash_sandbox.executor import SandboxBashExecutor

MAX_AGE_S = 60.0  # a spare's executor is at most this much older than its call
MAX_SPARES = 4  # kept per daemon, one per call shape (the oldest makes room)
MAX_MESSAGE = 64 << 10  # a larger request (a huge environment) is served by a plain fork
# stdin, stdout, stderr, the working directory, the call's connection
CALL_FDS = 5


@dataclass
class Prepared:
    """An executor made for one call shape, and the shape."""

    executor: SandboxBashExecutor
    config: SandboxBashConfig
    env: dict[str, str]
    umask: int
    cwd: tuple[int, int]  # device, inode of the directory it was made in
    taken: bool = field(default=False)

    def fits(self, request: dict[str, Any]) -> bool:
        """In the call's process, after it took the call's context (`daemon._become_client`):
        whether that context is the one this executor was made in."""
        st = os.stat(".")
        return (
            (st.st_dev, st.st_ino) == self.cwd
            and int(request["umask"]) == self.umask
            and dict(os.environ) == self.env
        )

    def take(self, config: SandboxBashConfig) -> SandboxBashExecutor | None:
        """The executor, once, for a call whose own config equals the one it was made from."""
        if self.taken or config != self.config:
            return None
        self.taken = True
        return self.executor

    def close_unused(self) -> None:
        if not self.taken:
            self.taken = True
            with contextlib.suppress(Exception):
                asyncio.run(self.executor.aclose())


def adopt_environment(env: dict[str, str]) -> None:
    """In a fork of the daemon (a call's process, a spare): ``env`` becomes the whole
    environment, and what the process had read of the daemon's is read again: `tempfile`
    keeps the temporary directory it found first (TMPDIR) for the process's life, and the
    per-user directory, the probe cache and the executors' state are under it. (The caches of
    our own that depend on the environment are keyed by the variables they read.)"""
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None
    # The client's locale: whether its terminal reads UTF-8 (`cli.render.utf8_terminal`).
    with contextlib.suppress(locale.Error):
        locale.setlocale(locale.LC_CTYPE, "")


def prepare(request: dict[str, Any], cwd: int, parser: CliArgumentParser) -> Prepared | None:
    """In the spare: the executor ``request`` (a `run` call that just ended) would make, made
    and prepared in its context (``cwd``, a descriptor of its working directory); None when
    the call cannot be prepared for (a usage error, a config error, no backend: the next
    call of the shape then finds these itself, as a fresh process would)."""
    from bash_sandbox.cli.main import run_config
    from bash_sandbox.cli.settings import workspace_dir
    from bash_sandbox.executor import SandboxBashExecutor

    executor: SandboxBashExecutor | None = None
    try:
        os.fchdir(cwd)
        umask = int(request["umask"])
        os.umask(umask)
        env = {str(k): str(v) for k, v in dict(request["env"]).items()}
        adopt_environment(env)
        args, extra = parser.parse_known_args([str(word) for word in request["argv"]])
        if extra or args.subcommand != "run" or not args.command:
            return None
        workspace = workspace_dir(args.workspace)
        config, _ = run_config(args, workspace)
        executor = SandboxBashExecutor(config)
        mode = executor.policy_service.resolve_mode(None, args.mode)
        executor.prepare(mode)
        if mode is not SandboxMode.DANGER_FULL_ACCESS:
            workdir = config.workspace_root or workspace
            executor.prepare(SandboxMode.READ_ONLY)
            asyncio.run(_rehearse(executor, workdir))
            if mode is not SandboxMode.READ_ONLY:
                # What a first spawn in this mode adds to the rehearsal's, as far as it
                # makes nothing the host sees (its placeholders are made at the call).
                ahead = BashExecRequest(command="true", workdir=workdir, sandbox_mode=mode)
                executor.warm(executor.resolve(ahead))
        st = os.stat(".")
        prepared = Prepared(executor, config, env, umask, (st.st_dev, st.st_ino))
        executor = None
        return prepared
    except BaseException:  # SystemExit from --help included: nothing to prepare
        return None
    finally:
        if executor is not None:
            with contextlib.suppress(Exception):
                asyncio.run(executor.aclose())
        with contextlib.suppress(OSError):
            os.chdir("/")  # no directory of the caller's is held while it waits


async def _rehearse(executor: SandboxBashExecutor, workdir: str) -> None:
    """One `true` under the executor's read-only policy: what a first spawn computes once
    (the host survey's caches, the mount table, the environment's settings, the pages of
    the programs it runs) is then paid here, not by the call. Read-only writes nothing the
    host sees (no root, so no placeholder and no overlay); its result is not kept."""
    request = BashExecRequest(command="true", workdir=workdir, sandbox_mode=SandboxMode.READ_ONLY)
    result = await executor.run(executor.resolve(request))
    if result.exit_code != 0:
        raise RuntimeError(f"the rehearsal's `true` exited {result.exit_code}")


def encode_call(request: dict[str, Any]) -> bytes | None:
    """The call's request as the daemon hands it to a spare, or None when too large."""
    body = json.dumps(request, separators=(",", ":")).encode()
    return body if len(body) <= MAX_MESSAGE else None


def hand_over(ctrl: socket.socket, body: bytes, fds: list[int]) -> bool:
    """The daemon's side: give the call to the spare at ``ctrl`` (a SOCK_SEQPACKET pair, so
    the message arrives whole or not at all, never blocking the daemon). False when the
    spare is gone: the daemon forks for the call instead."""
    try:
        ctrl.sendmsg([body], wire.rights(fds), socket.MSG_DONTWAIT)
    except OSError:
        return False
    return True


def wait_for_call(ctrl: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The spare's side: the call it is handed, with its descriptors; None when the daemon
    closed its end (this spare is not needed)."""
    body, ancillary, flags, _ = ctrl.recvmsg(MAX_MESSAGE, wire.rights_space(CALL_FDS))
    fds = wire.received_fds(ancillary)
    if not body and not fds:
        return None
    try:
        if len(fds) != CALL_FDS or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise OSError(f"a malformed hand-over ({len(fds)} descriptors, flags {flags:#x})")
        request = json.loads(body)
        if not isinstance(request, dict):
            raise OSError("a malformed hand-over (not an object)")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return request, fds
