"""The warm daemon runs a call with its own credentials, so it serves only a caller that
holds exactly those (red team: a daemon started by a caller in a group served a later
caller without it, whose command then read a file only that group may read).

Each test starts its daemon from a caller with more rights (`setpriv --groups`, or all
capabilities), then calls from one with fewer, and judges from outside: the file the
command copied its read into, whether the daemon answered the call itself (the client
tells, on a descriptor of its own) and what the real entry then did (ran it fresh, with
the caller's own rights). An equal caller is still served by the daemon (the speed path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_probes import (
    HAS_BWRAP,
    HAS_LANDLOCK,
    is_alive,
    kill_if_alive,
    stop_warm_daemons,
    warm_daemon_pids,
    warm_setup,
)

from bash_sandbox.warm import wire

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="Linux credentials"),
    pytest.mark.skipif(os.geteuid() != 0, reason="setpriv needs root to set groups"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv (util-linux)"),
]

_GROUP = 54321  # in no group list of this host's: only `setpriv --groups` grants it
_OWNER = 65534  # not the caller: its owner bits do not apply

# The client as the console script runs it, reporting on a descriptor of its own whether
# the daemon answered the call ("None": refused, nothing ran).
_DRIVER = """
import os, sys
from bash_sandbox.warm import client, wire
served = int(os.environ.pop("WARM_SERVED_FD"))
if os.environ.pop("WARM_SKIP_LISTENER_CHECK", None):
    # A hostile caller's own client: it need not check who listens (the real one cannot
    # read the /proc of a daemon with more capabilities, and so never sends to it).
    wire.unconfined_peer = lambda pid, pidfd=None: True
status = client.run(sys.argv[1:])
os.write(served, repr(status).encode())
sys.exit(status if isinstance(status, int) else 99)
"""

_BACKENDS = [
    pytest.param("bwrap", marks=pytest.mark.skipif(not HAS_BWRAP, reason="no bwrap")),
    pytest.param("landlock", marks=pytest.mark.skipif(not HAS_LANDLOCK, reason="no Landlock")),
]


class Caller:
    """Calls through the warm client, each under a `setpriv` of its own."""

    def __init__(self, env: dict[str, str], private: Path, cwd: Path) -> None:
        self.env = env
        self.private = private
        self.cwd = cwd

    def warm(self, setpriv: list[str], *args: str, hostile: bool = False) -> tuple[int, str, bytes]:
        """The client's call: its status, whether the daemon served it, its stderr."""
        served_r, served_w = os.pipe()
        env = dict(self.env, WARM_SERVED_FD=str(served_w))
        if hostile:
            env["WARM_SKIP_LISTENER_CHECK"] = "1"
        try:
            done = subprocess.run(
                ["setpriv", *setpriv, "--", sys.executable, "-c", _DRIVER, *args],
                env=env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                pass_fds=(served_w,),
                timeout=120,
                check=False,
            )
            os.close(served_w)
            served_w = -1
            return done.returncode, os.read(served_r, 256).decode(), done.stderr
        finally:
            os.close(served_r)
            if served_w >= 0:
                os.close(served_w)

    def entry(self, setpriv: list[str], *args: str) -> subprocess.CompletedProcess[bytes]:
        """The real entry (`bash-sandbox-py`): through the daemon, else fresh."""
        return subprocess.run(
            ["setpriv", *setpriv, "--", sys.executable, "-m", "bash_sandbox.entry", *args],
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
            check=False,
        )

    def daemon(self) -> int:
        pids = warm_daemon_pids(self.private)
        assert len(pids) == 1 and is_alive(pids[0]), pids
        return pids[0]


@pytest.fixture
def caller(private_tempdir: Path, config_home: Path, workspace: Path) -> Iterator[Caller]:
    private, env = warm_setup(private_tempdir, config_home)
    try:
        yield Caller(env, private, workspace)
    finally:
        stop_warm_daemons(private)


def _status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise AssertionError(f"no {name} in /proc/{pid}/status")


def _secret(tmp_path: Path, mode: int, gid: int) -> Path:
    secret = tmp_path / "secret"
    secret.write_text("SECRET\n")
    os.chown(secret, _OWNER, gid)
    secret.chmod(mode)
    return secret


@pytest.mark.parametrize("backend", _BACKENDS)
def test_a_caller_without_the_daemons_group_is_never_served_with_it(
    caller: Caller, workspace: Path, tmp_path: Path, backend: str
) -> None:
    secret = _secret(tmp_path, 0o040, _GROUP)
    leak = workspace / "leak"
    run = ("run", "--backend", backend, "--mode", "workspace-write", "--")
    copy = f"cat {secret} > {leak}"
    in_group, no_groups = ["--groups", str(_GROUP)], ["--clear-groups"]

    # The daemon, started by a caller holding the group, holds it.
    code, served, err = caller.warm(in_group, *run, "true")
    assert (code, served) == (0, "0"), err
    assert str(_GROUP) in _status_field(caller.daemon(), "Groups").split()

    # A caller without the group: refused before anything ran, the file never copied.
    code, served, err = caller.warm(no_groups, *run, copy)
    assert served == "None", err
    assert not leak.exists()
    # Through the real entry it then runs fresh, with its own groups: denied.
    done = caller.entry(no_groups, *run, copy)
    assert done.returncode != 0 and b"Permission denied" in done.stderr, done.stderr
    assert leak.read_bytes() == b""
    leak.unlink()

    # The reverse, a caller with a group the daemon lacks, is not served either (its run
    # would lose the group); and a caller equal to the daemon still is: the speed path.
    code, served, err = caller.warm(in_group, *run, "true")
    assert (code, served) == (0, "0"), err
    assert caller.warm(["--groups", f"{_GROUP},{_GROUP + 1}"], *run, "true")[1] == "None"
    code, served, err = caller.warm(in_group, *run, copy)
    assert (code, served) == (0, "0"), err
    assert leak.read_text() == "SECRET\n"
    assert is_alive(caller.daemon())


def test_a_caller_without_the_daemons_capabilities_is_never_served_with_them(
    caller: Caller, workspace: Path, tmp_path: Path
) -> None:
    # Root with no capability (an empty bounding set) cannot read another owner's 0600
    # file; an unconfined run made by the daemon, with all of root's, could.
    secret = _secret(tmp_path, 0o600, _OWNER)
    leak = workspace / "leak"
    run = ("run", "--mode", "danger-full-access", "--")
    copy = f"cat {secret} > {leak}"
    code, served, err = caller.warm([], *run, "true")
    assert (code, served) == (0, "0"), err
    assert int(_status_field(caller.daemon(), "CapEff"), 16) != 0

    no_caps = ["--bounding-set", "-all"]
    code, served, err = caller.warm(no_caps, *run, copy, hostile=True)
    assert served == "None", err
    assert not leak.exists()
    done = caller.entry(no_caps, *run, copy)
    assert done.returncode != 0 and b"Permission denied" in done.stderr, done.stderr
    assert leak.read_bytes() == b""
    leak.unlink()

    code, served, err = caller.warm([], *run, copy)  # all of root's: served, reads it
    assert (code, served) == (0, "0"), err
    assert leak.read_text() == "SECRET\n"


@pytest.mark.parametrize(
    ("prefix", "held"),
    [
        (["setpriv"], True),
        (["setpriv", "--groups", str(_GROUP)], False),
        (["setpriv", "--regid", str(_OWNER), "--keep-groups"], False),
        (["setpriv", "--bounding-set", "-all"], False),
        (["setpriv", "--inh-caps", "+chown"], False),
        (["setpriv", "--no-new-privs"], False),
        (["unshare", "--net"], False),
    ],
    ids=["same", "groups", "gid", "bounding-set", "inheritable", "no-new-privs", "netns"],
)
def test_a_peer_holds_the_daemons_rights_only_when_every_credential_is_equal(
    prefix: list[str], held: bool
) -> None:
    sleeper = "import time; print('up', flush=True); time.sleep(30)"
    child = subprocess.Popen([*prefix, "--", sys.executable, "-c", sleeper], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"  # set up
        pidfd = os.pidfd_open(child.pid)
        try:
            assert wire.holds_own_rights(child.pid, pidfd) is held
            child.kill()
            child.wait()
            assert not wire.holds_own_rights(child.pid, pidfd)  # gone: never its pid's heir
        finally:
            os.close(pidfd)
    finally:
        kill_if_alive(child.pid)
        if child.stdout is not None:
            child.stdout.close()
