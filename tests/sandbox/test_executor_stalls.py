"""No command parks the executor's seccomp supervisor or its event loop, or blames its limits
on the next command.

The supervisor emulates a command's `connect()` with the command's own socket (a descriptor
copied by `pidfd_getfd`), whose file flags it shares. It used to connect inline when the
socket looked non-blocking; another thread of the command flipping `O_NONBLOCK` off in
between made that connect block on a full listen backlog, on the supervisor's one thread:
every other command's trapped calls waited, and the event loop with them once it settled
the racing command (red team). Compiled with the real gcc; judged from the harness: the
loop keeps turning and a set-id probe on the supervisor is answered at once.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

from bash_seam import BashExecRequest
from tests.sandbox.conftest import ExecutorFactory
from tests.workflows.conftest import require_tools

_LISTEN_FULL = r"""
#include <sys/socket.h>
#include <sys/un.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int c, char **v) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strcpy(a.sun_path, v[1]); unlink(v[1]);
  int l = socket(AF_UNIX, SOCK_STREAM, 0);
  if (bind(l, (void *)&a, sizeof a)) return 1;
  listen(l, 0);
  int f = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
  connect(f, (void *)&a, sizeof a);  /* the backlog is full from here on */
  printf("full\n"); fflush(stdout);
  sleep(60);
  return 0;
}
"""

# A connect on a fresh non-blocking socket while a thread flips O_NONBLOCK; a connect still
# pending after 30 ms is followed by a set-id chmod, which only the supervisor answers: no
# answer within a second means its thread is parked. Bounded: 80 tries (the race was won
# within 2 to 23 here; the toggler yields while no socket is up, to spare a loaded machine).
_RACER = r"""
#define _GNU_SOURCE
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static volatile int s = -1, done, probed, stop;
static struct sockaddr_un a = {.sun_family = AF_UNIX};
static long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec; }
static void *toggle(void *x) { while (!stop) { int fd = s; if (fd < 0) { sched_yield(); continue; }
  int f = fcntl(fd, F_GETFL); fcntl(fd, F_SETFL, f | O_NONBLOCK);
  fcntl(fd, F_SETFL, f & ~O_NONBLOCK); } return 0; }
static void *conn(void *x) { connect(s, (void *)&a, sizeof a); done = 1; return 0; }
static void *probe(void *x) { chmod("probe.f", 04755); probed = 1; return 0; }
int main(int c, char **v) {
  strcpy(a.sun_path, v[1]);
  close(open("probe.f", O_CREAT | O_WRONLY, 0644));
  pthread_t t; pthread_create(&t, 0, toggle, 0);
  int pending = 0;
  for (int i = 0; i < 80; i++) {
    int ns = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0); s = ns; done = 0;
    pthread_t k; pthread_create(&k, 0, conn, 0); pthread_detach(k);
    long t0 = now(); while (!done && now() - t0 < 30000000L) usleep(1000);
    s = -1;
    if (done) { close(ns); continue; }
    pending++;
    probed = 0; pthread_t p; pthread_create(&p, 0, probe, 0); pthread_detach(p);
    t0 = now(); while (!probed && now() - t0 < 1000000000L) usleep(1000);
    if (!probed) { printf("PARKED after %d tries\n", i); fflush(stdout); stop = 1; return 3; }
  }
  stop = 1;
  printf("answered (%d connects left pending)\n", pending);
  return 0;
}
"""


def _build(workspace: Path, name: str, source: str) -> None:
    (workspace / f"{name}.c").write_text(source)
    subprocess.run(
        ["gcc", "-O1", "-pthread", "-o", str(workspace / name), str(workspace / f"{name}.c")],
        check=True,
        capture_output=True,
        timeout=120,
    )


async def test_a_socket_turned_blocking_never_parks_the_supervisor_or_the_loop(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    require_tools("gcc")
    _build(workspace, "listenfull", _LISTEN_FULL)
    _build(workspace, "racer", _RACER)
    ex = make_executor(mode="workspace-write")
    await ex.run(ex.resolve(BashExecRequest(command="true", workdir=str(workspace))))
    descriptors = len(os.listdir("/proc/self/fd"))
    listener = await ex.start(
        ex.resolve(BashExecRequest(command="./listenfull ./l.sock", workdir=str(workspace)))
    )
    try:
        deadline = time.monotonic() + 20
        while "full" not in listener.read_output().delta and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        # The loop's own heartbeat while the racer runs: a parked supervisor would stop it
        # (and the run would never come back: bounded here by wait_for, which needs the loop).
        beats = 0

        async def heartbeat() -> None:
            nonlocal beats
            while True:
                await asyncio.sleep(0.1)
                beats += 1

        ticker = asyncio.ensure_future(heartbeat())
        started = time.monotonic()
        spec = ex.resolve(
            BashExecRequest(command="./racer ./l.sock", workdir=str(workspace), timeout_ms=60000)
        )
        result = await asyncio.wait_for(ex.run(spec), 90)
        elapsed = time.monotonic() - started
        ticker.cancel()
        assert "PARKED" not in result.stdout.text, result.stdout.text
        assert "answered" in result.stdout.text, (result.stdout.text, result.stderr.text)
        assert beats >= elapsed / 0.1 / 3, (beats, elapsed)  # the loop kept turning
    finally:
        ex.kill(listener.id)
        await asyncio.wait_for(listener.wait(), 30)
    # The connects left queued when the racer ended were cancelled: their descriptors (the
    # socket each took from the command) are closed, not piled up in the executor (they ran
    # an unprivileged harness out of its 1024 in CI).
    await asyncio.sleep(0.5)
    assert len(os.listdir("/proc/self/fd")) <= descriptors + 2


async def test_no_command_takes_a_lease_on_a_host_file(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # A lease needs only the file's owner: a read-only command running as the executor's
    # user leased a host file it could only read, and each host open of it then waited
    # 45 s (`lease-break-time`) while the command was told when (red team).
    host_file = tmp_path / "host-tool"
    host_file.write_text("#!/bin/sh\n")
    ex = make_executor(mode="read-only")
    lease = (
        "python3 -c 'import os, fcntl, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        'try:\n fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK); print("leased")\n'
        'except OSError as e: print("errno", e.errno)\n'
        "sys.stdout.flush(); time.sleep(5)' "
        f"{host_file}"
    )
    proc = await ex.start(ex.resolve(BashExecRequest(command=lease, workdir=str(workspace))))
    seen = ""
    try:
        deadline = time.monotonic() + 20
        # The whole line: unbuffered (an inherited PYTHONUNBUFFERED), print writes its
        # words one by one, and a read between them saw "errno" alone.
        while "\n" not in seen and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            seen += proc.read_output().delta
        opened = time.monotonic()
        with open(host_file, "a"):  # a write open breaks a read lease: it would wait 45 s
            pass
        assert time.monotonic() - opened < 5
    finally:
        ex.kill(proc.id)
        await asyncio.wait_for(proc.wait(), 30)
    assert seen.split() == ["errno", "1"], seen  # EPERM


async def test_a_tmp_full_before_the_command_started_is_not_its_limit(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # The executor's commands share one tmpfs: an earlier command filled it and exited 0,
    # and every later failing command (`false`) was reported as stopped by tmp-space.
    ex = make_executor(mode="workspace-write", limits={"tmp_bytes": 8 << 20})
    fill = "head -c 20M /dev/zero > /tmp/fill 2>/dev/null; df -k /tmp | tail -1; exit 0"
    filled = await ex.run(ex.resolve(BashExecRequest(command=fill, workdir=str(workspace))))
    assert filled.exit_code == 0 and "100%" in filled.stdout.text, filled.stdout.text
    failing = "df -k /tmp | tail -1; false"
    failed = await ex.run(ex.resolve(BashExecRequest(command=failing, workdir=str(workspace))))
    assert "100%" in failed.stdout.text  # still full as it started
    assert failed.exit_code == 1 and failed.sandbox is not None
    assert failed.sandbox.limit_exceeded is None
    # A command that fills it itself is still told so.
    await ex.run(ex.resolve(BashExecRequest(command="rm /tmp/fill", workdir=str(workspace))))
    refill = "head -c 20M /dev/zero > /tmp/fill"
    full = await ex.run(ex.resolve(BashExecRequest(command=refill, workdir=str(workspace))))
    assert full.sandbox is not None and full.sandbox.limit_exceeded == "tmp-space"
