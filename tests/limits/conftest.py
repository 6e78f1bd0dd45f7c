"""Fixtures of the limit tests: the helper programs, the backends, and a driver (the executor
under test, `limits_driver.py`) run as root or as nobody.

Every driver runs inside an outer bound the test makes itself, so a broken limit cannot take
the host down: as root an outer pids and memory cgroup, as nobody a user namespace of its own
with RLIMIT_NPROC set inside it (which counts that tree alone: the limit is set after the
namespace exists).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bash_sandbox.backends.landlock import landlock_abi
from bash_sandbox.linux.cgroups import CgroupVersion, detect_this_host
from bash_sandbox.linux.child_setup import ChildSetup

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
OUTER_PIDS = 3000
OUTER_MEMORY = 4 << 30
NOBODY = "nobody"
# Scratch lives outside /tmp: under bwrap a command's /tmp is the executor's private one.
SCRATCH = "/var/tmp"

FORKCOUNT_C = r"""
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
/* Fork up to N children that pause; print how many forks succeeded; kill and reap them. */
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 10;
  if (n < 0 || n > 5000) return 2;
  pid_t pids[5000];
  long ok = 0;
  int err = 0;
  for (long i = 0; i < n; i++) {
    pid_t p = fork();
    if (p < 0) { err = errno; break; }
    if (p == 0) { pause(); _exit(0); }
    pids[ok++] = p;
  }
  printf("%ld\n", ok);
  if (err) dprintf(2, "forkcount: fork: %s\n", strerror(err));
  for (long i = 0; i < ok; i++) kill(pids[i], SIGKILL);
  for (long i = 0; i < ok; i++) waitpid(pids[i], NULL, 0);
  return err ? 1 : 0;
}
"""

_PARENT = re.compile(r"bash-sandbox-(\d+)-[0-9a-f]{8}")


def _scratch_dir(prefix: str, mode: int) -> str:
    path = tempfile.mkdtemp(prefix=prefix, dir=SCRATCH)
    os.chmod(path, mode)
    return path


@pytest.fixture(scope="session", autouse=True)
def no_cgroup_left_behind() -> Iterator[None]:
    """After the whole session: no cgroup of a dead executor and no outer test cgroup is
    left anywhere under /sys/fs/cgroup (live executors of other sessions are theirs)."""
    yield
    left = []
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        for name in dirnames:
            match = _PARENT.fullmatch(name)
            dead = match is not None and not os.path.exists(f"/proc/{match.group(1)}")
            # Outer cgroups of this session only: another xdist worker's test may hold its own.
            if dead or name in _OUTER_MADE:
                left.append(os.path.join(dirpath, name))
    assert left == [], f"cgroups left behind: {left}"


@pytest.fixture(scope="session")
def programs() -> Iterator[dict[str, str]]:
    """The fork helpers, built once, in a directory every identity and backend can read."""
    if not sys.platform.startswith("linux"):
        pytest.skip("resource limits are Linux mechanics")
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the fork helpers")
    root = _scratch_dir("bash-sandbox-limit-programs-", 0o755)
    (Path(root) / "forkcount.c").write_text(FORKCOUNT_C)
    for name, source in (("forkbomb", HERE / "forkbomb.c"), ("forkcount", f"{root}/forkcount.c")):
        subprocess.run([gcc, "-O2", "-o", f"{root}/{name}", str(source)], check=True)
    yield {"forkbomb": f"{root}/forkbomb", "forkcount": f"{root}/forkcount"}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def workspace() -> Iterator[Path]:
    """The executor's workspace, writable by every identity (nobody's builds run in it)."""
    path = Path(_scratch_dir("bash-sandbox-limit-work-", 0o777))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["bwrap", "landlock"])
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed")
    if name == "landlock" and landlock_abi() == 0:
        pytest.skip("this kernel has no Landlock")
    return name


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
IN_OWN_USERNS = ["unshare", "--user", "--map-user=65534", "--map-group=65534", "--"]
DRIVER_IMPORTS = "import pydantic, pyroute2, landlockpy, pyseccomp, pytest, xdist"


@functools.cache
def nobody_python() -> tuple[str, str] | None:
    """(interpreter, extra PYTHONPATH) nobody can run with this venv's packages: this one
    (a venv made from a system Python), or, when it lives where nobody cannot enter (/root),
    the system one of the same version reading the venv's site-packages."""
    site = sysconfig.get_paths()["purelib"]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python, extra in ((sys.executable, ""), (f"/usr/bin/{version}", site)):
        probe = [*AS_NOBODY, *IN_OWN_USERNS, python, "-c", DRIVER_IMPORTS]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": extra}
        if (
            os.path.exists(python)
            and subprocess.run(probe, check=False, env=env, capture_output=True).returncode == 0
        ):
            return python, extra
    return None


@pytest.fixture(params=["root", "nobody"])
def identity(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "root" and os.geteuid() != 0:
        pytest.skip("needs root")
    if name == "nobody" and os.geteuid() != 0:
        return name  # already unprivileged (a copy run as nobody): run as ourselves
    if name == "nobody":
        try:
            pwd.getpwnam(NOBODY)
        except KeyError:
            pytest.skip("no nobody user here")
        if nobody_python() is None:
            pytest.skip("no Python that nobody can run")
    return name


def root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (cgroups)")


_OUTER_MADE: set[str] = set()  # names of the outer cgroups this process made


class OuterCgroup:
    """The root driver's outer bound: pids and memory cgroups made by the test itself."""

    def __init__(self) -> None:
        host = detect_this_host()
        bases = {c: b.directory for b in host.bases for c in b.controllers}
        if "pids" not in bases or "memory" not in bases:
            pytest.skip(f"no writable pids and memory cgroups here: {host.missing}")
        name = f"limits-test-outer-{secrets.token_hex(4)}"
        _OUTER_MADE.add(name)
        self.dirs = [os.path.join(bases[c], name) for c in ("pids", "memory")]
        for d in self.dirs:
            os.mkdir(d)
        memory = "memory.limit_in_bytes" if host.version is CgroupVersion.V1 else "memory.max"
        Path(self.dirs[0], "pids.max").write_text(str(OUTER_PIDS))
        Path(self.dirs[1], memory).write_text(str(OUTER_MEMORY))

    def entry(self) -> ChildSetup:
        """Pre-exec of the driver: it moves itself into both before it runs any Python."""
        setup = ChildSetup()
        for d in self.dirs:
            setup.write_file(os.path.join(d, "cgroup.procs"), b"0")
        return setup

    def leftovers(self) -> list[str]:
        return [
            os.path.join(d, e)
            for d in self.dirs
            for e in os.listdir(d)
            if os.path.isdir(os.path.join(d, e))
        ]

    def remove(self) -> None:
        """Remove both, and whatever a failed test left inside them (its tasks killed
        first), deepest first; bounded, since SIGKILLed tasks take a moment to be reaped."""
        deadline = time.monotonic() + 10
        while True:
            left = sorted((*self.leftovers_deep(), *self.dirs), key=len, reverse=True)
            for d in left:
                for pid in Path(d, "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            if not any(os.path.exists(d) for d in self.dirs):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"cannot remove the outer cgroups: {left}")
            time.sleep(0.01)  # the kernel reaps the killed tasks meanwhile

    def leftovers_deep(self) -> list[str]:
        return [
            os.path.join(dirpath, name)
            for d in self.dirs
            for dirpath, dirnames, _ in os.walk(d)
            for name in dirnames
        ]


def cgroups_named_after(pid: int) -> list[str]:
    """Every cgroup directory named after executor ``pid``, anywhere under /sys/fs/cgroup."""
    return [
        os.path.join(dirpath, name)
        for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup")
        for name in dirnames
        if name.startswith(f"bash-sandbox-{pid}-")
    ]


@dataclass
class DriverRun:
    result: dict[str, Any]
    pid: int
    returncode: int


def run_driver(
    identity: str,
    params: dict[str, Any],
    *,
    timeout_s: float = 120,
    outer: OuterCgroup | None = None,
    expect_killed: bool = False,
) -> DriverRun:
    """Run one scenario in a bounded driver process and check it left no cgroup behind.
    A given ``outer`` is reused and kept (the caller removes it)."""
    keep_outer = outer is not None
    home = _scratch_dir("bash-sandbox-limit-home-", 0o777)
    inherited = os.environ.get("PYTHONPATH")
    pythonpath = f"{REPO}:{inherited}" if inherited else str(REPO)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath, "HOME": home}
    argv = [sys.executable, "-m", "tests.limits.limits_driver"]
    preexec = None
    params = {"token": f"limits-{secrets.token_hex(4)}", **params}
    if identity == "root":
        outer = outer or OuterCgroup()
        preexec = outer.entry()
    else:
        switch: list[str] = []
        if os.geteuid() == 0:
            found = nobody_python()
            assert found is not None
            argv[0], extra = found
            env["PYTHONPATH"] += f":{extra}" if extra else ""
            switch = AS_NOBODY
        uid, gid = (65534, 65534) if switch else (os.geteuid(), os.getegid())
        argv = [
            *switch,
            "unshare", "--user", f"--map-user={uid}", f"--map-group={gid}", "--",
            "prlimit", f"--nproc={OUTER_PIDS}", "--", *argv,
        ]  # fmt: skip
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(REPO),
            env=env,
            preexec_fn=preexec,  # noqa: PLW1509 - pre-bound writes only
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(json.dumps(params).encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            raise
        lines = out.decode().strip().splitlines()
        result = json.loads(lines[-1]) if lines else {}
        if not expect_killed:
            if proc.returncode != 0:
                raise AssertionError(f"driver failed ({proc.returncode}): {err.decode()[-3000:]}")
            assert result.get("left_after_close", []) == [], "aclose() left cgroups"
            assert cgroups_named_after(proc.pid) == [], "the executor left cgroups behind"
            if outer is not None:
                assert outer.leftovers() == [], "the executor left cgroups behind"
        return DriverRun(result, proc.pid, proc.returncode)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        if outer is not None and not keep_outer:
            outer.remove()
