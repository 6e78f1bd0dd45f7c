"""The native warm client (`bash_sandbox/warm/native/client.c`), installed as `bash-sandbox`.

Most tests run a copy of the installed client from a directory with nothing beside it: a call
it does not serve itself would exec `bash-sandbox-py` there and fail with 127, so a call that
succeeds was served by the client and the daemon alone. The daemon such a copy talks to is
named after the copy's directory; the Python entry starts it, given that name in
BASH_SANDBOX_WARM_KEY, as the client's own hand-over does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_probes import (
    HAS_BWRAP,
    HAS_LANDLOCK,
    host_pids_with_argv,
    is_alive,
    kill_if_alive,
    stop_warm_daemons,
    wait_until,
    warm_daemon_pids,
    warm_setup,
)

from bash_sandbox.warm import wire

pytestmark = pytest.mark.skipif(
    not (HAS_BWRAP or HAS_LANDLOCK) or sys.platform != "linux", reason="no Linux backend"
)

INSTALLED = Path(sys.executable).parent / "bash-sandbox"


def _is_native(path: Path) -> bool:
    try:
        return path.read_bytes()[:4] == b"\x7fELF"
    except OSError:
        return False


@pytest.fixture
def native(tmp_path: Path) -> Path:
    """A copy of the installed native client, alone in a directory of its own."""
    if not _is_native(INSTALLED):
        if os.environ.get("CI"):
            pytest.fail(f"{INSTALLED} is not the native client: setup.py did not build it")
        pytest.skip("the native client was not built here (no C compiler)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    copy = bin_dir / "bash-sandbox"
    shutil.copy2(INSTALLED, copy)
    return copy


class Calls:
    """Calls of one client against one test-owned private directory; kills what it started."""

    def __init__(self, env: dict[str, str], private: Path) -> None:
        self.env = env
        self.private = private
        self.started: list[int] = []

    def daemon_pids(self) -> list[int]:
        return warm_daemon_pids(self.private)

    def start(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str] | None = None,
        stdin: int | None = None,
    ) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv,
            env=env if env is not None else self.env,
            cwd=cwd,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.started.append(proc.pid)
        return proc

    def run(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str] | None = None,
        stdin: int | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        proc = self.start(argv, cwd, env, stdin)
        out, err = proc.communicate(timeout=60)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def start_daemon_for(self, client: Path, cwd: Path) -> None:
        """The Python entry, handed the call as the client hands it: starts the daemon."""
        env = dict(self.env, **{wire.KEY_ENV: str(client.parent.resolve())})
        done = self.run([sys.executable, "-m", "bash_sandbox.entry", "run", "--", "true"], cwd, env)
        assert done.returncode == 0, done.stderr
        assert self.daemon_pids(), "no daemon started"


@pytest.fixture
def calls(private_tempdir: Path, config_home: Path) -> Iterator[Calls]:
    private, env = warm_setup(private_tempdir, config_home)
    helper = Calls(env, private)
    try:
        yield helper
    finally:
        for pid in helper.started:
            kill_if_alive(pid)
        stop_warm_daemons(private)


def _fresh(env: dict[str, str], command: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "bash_sandbox.cli", "run", "--", command],
        env=dict(env, **{wire.ENABLE_ENV: "0"}),
        cwd=cwd,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )


def test_the_installed_command_is_the_native_client_beside_the_python_entry() -> None:
    if not _is_native(INSTALLED) and not os.environ.get("CI"):
        pytest.skip("the native client was not built here")
    assert _is_native(INSTALLED)
    entry = INSTALLED.parent / "bash-sandbox-py"
    assert entry.read_text().startswith("#!")  # the Python entry every other call goes to
    # Not a warm call: handed to the Python entry, whose answer this is.
    done = subprocess.run([INSTALLED, "--version"], capture_output=True, check=False, timeout=60)
    assert (done.returncode, done.stdout.split()[0]) == (0, b"bash-sandbox")


def test_a_warm_call_is_served_without_python_as_a_fresh_run_answers(
    native: Path, calls: Calls, workspace: Path, tmp_path: Path
) -> None:
    calls.start_daemon_for(native, workspace)
    outside = tmp_path / "outside-every-root"
    command = f'pwd; echo out; echo err >&2; touch {outside}; echo "touch=$?"; exit 7'
    done = calls.run([str(native), "run", "--mode", "read-only", "--", command], workspace)
    # No `bash-sandbox-py` beside the copy: only the daemon can have run this.
    assert done.returncode == 7, done.stderr
    assert done.stdout == f"{workspace}\nout\ntouch=1\n".encode()
    assert done.stderr.startswith(b"err\n")
    assert b"[sandbox:" in done.stderr  # the denial, as a fresh run reports it
    assert not outside.exists()
    fresh = _fresh(calls.env, command, workspace)
    assert fresh.returncode == 7
    assert fresh.stderr == done.stderr


def test_the_environment_reaches_the_command_as_a_fresh_python_run_gives_it(
    native: Path, calls: Calls, workspace: Path
) -> None:
    calls.start_daemon_for(native, workspace)
    env = {k: v for k, v in calls.env.items() if not k.startswith("LC_") and k != "LANG"}
    # (EDITOR and VISUAL: names a confined command inherits.) Quotes, escapes, control
    # characters, accents and a character beyond the BMP; and no
    # locale at all, which CPython coerces at start-up (a fresh run's command sees LC_CTYPE).
    env["EDITOR"] = 'a"b\\c\td\x01e\x7ff\u00e9g\U0001f600h\nend'
    command = 'printf "%s|" "$EDITOR" "${LC_CTYPE-unset}" "${LANG-unset}"'
    done = calls.run([str(native), "run", "--", command], workspace, env=env)
    assert done.returncode == 0, done.stderr
    fresh = _fresh(env, command, workspace)
    assert done.stdout == fresh.stdout
    assert done.stdout.decode().split("|")[0] == env["EDITOR"]


def test_a_value_that_is_not_utf8_is_handed_to_the_python_client(
    calls: Calls, workspace: Path
) -> None:
    # The installed client, with its Python entry beside it: what it cannot encode as Python
    # would hold it, the Python client sends.
    if not _is_native(INSTALLED):
        pytest.skip("the native client was not built here")
    calls.start_daemon_for(INSTALLED, workspace)
    env = {k.encode(): v.encode() for k, v in calls.env.items()}
    env[b"VISUAL"] = b"caf\xe9\xff"
    command = 'printf "%s" "$VISUAL"'
    done = subprocess.run(
        [INSTALLED, "run", "--", command],
        env=env,
        cwd=workspace,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, b"caf\xe9\xff"), done.stderr


def test_sigterm_to_the_native_client_stops_the_command(
    native: Path, calls: Calls, workspace: Path
) -> None:
    calls.start_daemon_for(native, workspace)
    seconds = f"30.{os.getpid()}7"
    proc = calls.start([str(native), "run", "--", f"sleep {seconds}"], workspace)
    wait_until(lambda: bool(host_pids_with_argv(["sleep", seconds])), timeout=30, what="sleep up")
    sleepers = host_pids_with_argv(["sleep", seconds])
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert b"SIGTERM" in err
    wait_until(lambda: not any(map(is_alive, sleepers)), timeout=10, what="the sleep gone")


# A listener that records the client's request and answers it with the frame it is given.
_FAKE_DAEMON = """
import array, json, os, socket, struct, sys
sock_path, record, answer = sys.argv[1:]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
os.chdir(os.path.dirname(sock_path))
s.bind(os.path.basename(sock_path))
s.listen(8)
open(record + ".ready", "w").close()
s.settimeout(40)
conn, _ = s.accept()
open(record + ".accepted", "w").close()
conn.settimeout(20)
head, anc, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(16 * 4))
fds = array.array("i")
for level, kind, data in anc:
    fds.frombytes(data[: len(data) - len(data) % 4])
(size,) = struct.unpack(">I", head)
body = b""
while len(body) < size:
    body += conn.recv(size - len(body))
cwd = os.readlink(f"/proc/self/fd/{fds[3]}") if len(fds) == 4 else None
with open(record, "w") as fh:
    json.dump({"request": json.loads(body), "fds": len(fds), "cwd": cwd}, fh)
if answer != "-":
    raw = answer.encode()
    conn.sendall(struct.pack(">I", len(raw)) + raw)
conn.close()
"""


def _answered_by_fake(
    native: Path, calls: Calls, workspace: Path, tmp_path: Path, answer: str
) -> tuple[subprocess.CompletedProcess[bytes], dict[str, object]]:
    name = wire.socket_name(str(native.parent.resolve()))
    record = tmp_path / "request.json"
    script = tmp_path / "fake.py"
    script.write_text(_FAKE_DAEMON)
    fake = subprocess.Popen(
        [sys.executable, str(script), str(calls.private / name), str(record), answer]
    )
    calls.started.append(fake.pid)
    wait_until(lambda: Path(f"{record}.ready").exists(), timeout=30, what="fake daemon up")
    env = dict(calls.env, WARM_MARK="m")
    done = calls.run([str(native), "run", "--", "echo", "two words"], workspace, env=env)
    fake.wait(timeout=30)
    return done, json.loads(record.read_text())


@pytest.mark.parametrize(
    ("answer", "status", "stderr"),
    [
        ('{"exit":5}', 5, b""),
        ('{"exit":300}', 300 % 256, b""),
        ('{"signal":15}', -signal.SIGTERM, b""),
        ('{"exit":5,"exit":6}', 70, b"went away"),
        ('{"exit":05}', 70, b"went away"),
        ('{"exit": 5}', 70, b"went away"),
        ('{"Exit":5}', 70, b"went away"),
        ('["exit",5]', 70, b"went away"),
        ("-", 70, b"went away"),  # the connection closed without an answer
        ('{"stale":false}', 127, b"bash-sandbox-py"),  # refused: handed to the Python entry
    ],
)
def test_the_native_client_sends_the_call_and_ends_as_the_answer_says(
    native: Path,
    calls: Calls,
    workspace: Path,
    tmp_path: Path,
    answer: str,
    status: int,
    stderr: bytes,
) -> None:
    done, got = _answered_by_fake(native, calls, workspace, tmp_path, answer)
    assert done.returncode == status, done.stderr
    assert stderr in done.stderr
    request = got["request"]
    assert isinstance(request, dict)
    assert request["argv"] == ["run", "--", "echo", "two words"]
    umask = os.umask(0)
    os.umask(umask)
    assert request["umask"] == umask
    assert isinstance(request["env"], dict) and request["env"]["WARM_MARK"] == "m"
    assert wire.KEY_ENV not in request["env"]
    assert (got["fds"], got["cwd"]) == (4, str(workspace))


def test_the_native_client_never_talks_to_a_confined_listener(
    native: Path,
    calls: Calls,
    workspace: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # A command of a workspace that holds the private directory listens on the socket's path.
    name = wire.socket_name(str(native.parent.resolve()))
    record = tmp_path / "received"
    (tmp_path / "listen.py").write_text(_FAKE_DAEMON)
    squatter = calls.start(
        [
            sys.executable,
            "-m",
            "bash_sandbox.cli",
            "run",
            "--mode",
            "workspace-write",
            "--workspace",
            str(tmp_path),  # holds the private directory
            "--timeout-ms",
            "60000",
            "--",
            f"{sys.executable} {tmp_path / 'listen.py'} {calls.private / name} {record} -",
        ],
        tmp_path,
        env=dict(
            calls.env, TMPDIR=str(tmp_path_factory.mktemp("harness-tmp")), **{wire.ENABLE_ENV: "0"}
        ),
    )
    wait_until(lambda: Path(f"{record}.ready").exists(), timeout=30, what="listener up")
    # Refused before a byte is sent: handed to the (absent) Python entry.
    done = calls.run([str(native), "run", "--", "echo", "s3cret"], workspace, env=dict(calls.env))
    assert done.returncode == 127 and b"bash-sandbox-py" in done.stderr, done.stderr
    wait_until(lambda: Path(f"{record}.accepted").exists(), timeout=30, what="accepted")
    squatter.communicate(timeout=60)
    # The premise: the client connected (and the listener's wait for a request ended when
    # it closed); then nothing was sent, no environment, no descriptors.
    assert not record.exists()


def test_without_a_daemon_the_client_hands_over_and_the_next_call_is_served(
    calls: Calls, workspace: Path, tmp_path: Path
) -> None:
    if not _is_native(INSTALLED):
        pytest.skip("the native client was not built here")
    # The installed client and its Python entry, no daemon yet: the entry starts the one the
    # client's next call reaches (both name it after the client's directory).
    first = calls.run([str(INSTALLED), "run", "--", "echo one"], workspace)
    assert (first.returncode, first.stdout) == (0, b"one\n"), first.stderr
    sockets = [p.name for p in calls.private.glob("warm-*.sock")]
    assert sockets == [wire.socket_name(str(INSTALLED.parent.resolve()))]
    daemons = calls.daemon_pids()
    second = calls.run([str(INSTALLED), "run", "--", "echo two"], workspace)
    assert (second.returncode, second.stdout) == (0, b"two\n"), second.stderr
    assert calls.daemon_pids() == daemons and all(map(is_alive, daemons))
