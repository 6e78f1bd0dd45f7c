"""Fixtures of the limit tests: the helper programs, and a driver run as root or as nobody.

Every driver (the executor under test) runs inside an outer bound the test makes itself,
so a broken limit cannot take the host down: as root an outer pids and memory cgroup, as
nobody a user namespace of its own with RLIMIT_NPROC set inside it (which, measured here,
counts that tree alone).
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bash_sandbox.linux.cgroups import detect_this_host
from bash_sandbox.linux.child_setup import ChildSetup

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
OUTER_PIDS = 3000
OUTER_MEMORY = 4 << 30
NOBODY = "nobody"

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


@dataclass(frozen=True)
class Programs:
    forkbomb: str
    forkcount: str
    root: str  # a directory every identity can read


@pytest.fixture(scope="session", autouse=True)
def no_cgroup_left_behind() -> Iterator[None]:
    """After the whole module: no cgroup of a dead executor and no outer test cgroup is
    left anywhere under /sys/fs/cgroup (live executors of other sessions are theirs)."""
    yield
    left = []
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        for name in dirnames:
            match = re.fullmatch(r"bash-sandbox-(\d+)-[0-9a-f]{8}", name)
            dead = match is not None and not os.path.exists(f"/proc/{match.group(1)}")
            if dead or name.startswith("limits-test-outer-"):
                left.append(os.path.join(dirpath, name))
    assert left == [], f"cgroups left behind: {left}"


@pytest.fixture(scope="session")
def programs() -> Iterator[Programs]:
    if not sys.platform.startswith("linux"):
        pytest.skip("resource limits are Linux mechanics")
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the fork helpers")
    root = tempfile.mkdtemp(prefix="bash-sandbox-limit-programs-")
    os.chmod(root, 0o755)
    (Path(root) / "forkcount.c").write_text(FORKCOUNT_C)
    for name, source in (
        ("forkbomb", str(HERE / "forkbomb.c")),
        ("forkcount", f"{root}/forkcount.c"),
    ):
        subprocess.run([gcc, "-O2", "-o", f"{root}/{name}", source], check=True)
    yield Programs(f"{root}/forkbomb", f"{root}/forkcount", root)
    shutil.rmtree(root, ignore_errors=True)


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
IN_OWN_USERNS = ["unshare", "--user", "--map-user=65534", "--map-group=65534", "--"]


def nobody_available() -> bool:
    try:
        pwd.getpwnam(NOBODY)
    except KeyError:
        return False
    return os.geteuid() == 0


@functools.cache
def nobody_python() -> tuple[str, str] | None:
    """(interpreter, extra PYTHONPATH) nobody can run with this venv's packages: this one,
    or, when it lives somewhere nobody cannot enter (/root), the system one of the same
    version reading the venv's site-packages."""
    site = sysconfig.get_paths()["purelib"]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python, extra in ((sys.executable, ""), (f"/usr/bin/{version}", site)):
        probe = [*AS_NOBODY, *IN_OWN_USERNS, python, "-c", "import pydantic"]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": extra}
        if (
            os.path.exists(python)
            and subprocess.run(probe, check=False, env=env, capture_output=True).returncode == 0
        ):
            return python, extra
    return None


IDENTITIES = ("root", "nobody")


@pytest.fixture(params=IDENTITIES)
def identity(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "root" and os.geteuid() != 0:
        pytest.skip("needs root")
    if name == "nobody" and os.geteuid() != 0:
        return name  # already unprivileged (scripts/test-unprivileged): run as ourselves
    if name == "nobody" and not nobody_available():
        pytest.skip("no nobody user here")
    if name == "nobody" and nobody_python() is None:
        pytest.skip("no Python that nobody can run")
    return name


class OuterCgroup:
    """The root driver's outer bound: pids and memory cgroups made by the test itself."""

    def __init__(self) -> None:
        host = detect_this_host()
        bases = {c: b.directory for b in host.bases for c in b.controllers}
        if "pids" not in bases or "memory" not in bases:
            pytest.skip(f"no writable pids and memory cgroups here: {host.missing}")
        name = f"limits-test-outer-{secrets.token_hex(4)}"
        self.dirs = [os.path.join(bases[c], name) for c in ("pids", "memory")]
        for d in self.dirs:
            os.mkdir(d)
        Path(self.dirs[0], "pids.max").write_text(str(OUTER_PIDS))
        Path(self.dirs[1], "memory.limit_in_bytes").write_text(str(OUTER_MEMORY))

    def setup(self) -> ChildSetup:
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
        for d in self.dirs:
            os.rmdir(d)


def our_cgroups(pid: int) -> list[str]:
    """Every cgroup directory named after executor ``pid``, anywhere under /sys/fs/cgroup."""
    found = []
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        for name in dirnames:
            if name.startswith(f"bash-sandbox-{pid}-"):
                found.append(os.path.join(dirpath, name))
    return found


@dataclass
class DriverRun:
    result: dict[str, Any]
    pid: int
    returncode: int


def run_driver(
    identity: str,
    params: dict[str, Any],
    *,
    timeout_s: float = 240,
    outer: OuterCgroup | None = None,
) -> DriverRun:
    """Run one scenario in a bounded driver process and check it left no cgroup behind.
    A given ``outer`` is reused and kept (the caller removes it)."""
    keep_outer = outer is not None
    inherited = os.environ.get("PYTHONPATH")
    pythonpath = f"{REPO}:{inherited}" if inherited else str(REPO)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath, "HOME": "/"}
    argv = [sys.executable, "-m", "tests.limits.limits_driver"]
    preexec = None
    if identity == "root":
        outer = outer or OuterCgroup()
        preexec = outer.setup()
    else:
        switch: list[str] = []
        if os.geteuid() == 0:
            found = nobody_python()
            assert found is not None
            argv[0], extra = found
            env["PYTHONPATH"] += f":{extra}" if extra else ""
            switch = AS_NOBODY
        uid, gid = os.geteuid() if not switch else 65534, os.getegid() if not switch else 65534
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
            preexec_fn=preexec,  # noqa: PLW1509 - pre-bound syscalls only
            start_new_session=True,
        )
        out, err = proc.communicate(json.dumps(params).encode(), timeout=timeout_s)
        lines = out.decode().strip().splitlines()
        result = json.loads(lines[-1]) if lines else {}
        if proc.returncode != 0 and params.get("scenario") != "abandon":
            raise AssertionError(f"driver failed ({proc.returncode}): {err.decode()[-3000:]}")
        if params.get("scenario") != "abandon":
            assert our_cgroups(proc.pid) == [], "the executor left cgroups behind"
            if outer is not None:
                assert outer.leftovers() == [], "the executor left cgroups behind"
        return DriverRun(result, proc.pid, proc.returncode)
    finally:
        if outer is not None and not keep_outer:
            outer.remove()


@pytest.fixture
def readable_dir() -> Iterator[Path]:
    """A scratch directory every identity can write (nobody's builds run in it)."""
    path = Path(tempfile.mkdtemp(prefix="bash-sandbox-limit-work-"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)
