"""The warm CLI (`BASH_SANDBOX_DAEMON=1`): `bash-sandbox run` through a per-user daemon.

Each test's daemon lives in the test's private temp dir (its socket in `<TMPDIR>/bash-
sandbox-<uid>/`) and is killed by the pid in its lock file at teardown. That a call was
served by the daemon, not run fresh, is told by the client itself (`client.run` returns
None when it was not), written on a descriptor of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_probes import (
    HAS_BWRAP,
    HAS_LANDLOCK,
    children,
    host_pids_with_argv,
    is_alive,
    kill_if_alive,
    stop_warm_daemons,
    wait_until,
    warm_daemon_pids,
    warm_setup,
    write_user_config,
)

from bash_sandbox.cli.arguments import build_parser
from bash_sandbox.config import SandboxBashConfig
from bash_sandbox.linux import inotify
from bash_sandbox.warm import daemon as warm_daemon
from bash_sandbox.warm import spare, wire
from bash_sandbox.warm.code_watch import CodeWatch

pytestmark = pytest.mark.skipif(
    not (HAS_BWRAP or HAS_LANDLOCK) or sys.platform != "linux", reason="no Linux backend"
)

# The client as the console script runs it, reporting whether the daemon served on a
# descriptor of its own.
_DRIVER = """
import os, sys
from bash_sandbox.warm import client
served = int(os.environ.pop("WARM_SERVED_FD"))  # not part of the call: it differs per call
if "WARM_UMASK" in os.environ:
    os.umask(int(os.environ["WARM_UMASK"], 8))
status = client.run(sys.argv[1:])
os.write(served, repr(status).encode())
sys.exit(status if isinstance(status, int) else 99)
"""


class Warm:
    def __init__(self, env: dict[str, str], private: Path) -> None:
        self.env = env
        self.private = private
        self.started: list[subprocess.Popen[bytes]] = []
        self.readers: list[int] = []  # every "served" pipe, open until teardown

    def daemon_pids(self) -> list[int]:
        return warm_daemon_pids(self.private)

    def start(
        self, *args: str, cwd: Path, stdin: int | None = None
    ) -> tuple[subprocess.Popen[bytes], int]:
        served_r, served_w = os.pipe()
        proc = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, *args],
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(self.env, WARM_SERVED_FD=str(served_w)),
            cwd=cwd,
            pass_fds=(served_w,),
        )
        os.close(served_w)
        self.started.append(proc)
        self.readers.append(served_r)
        return proc, served_r

    def run(self, *args: str, cwd: Path, stdin: int | None = None) -> tuple[int, bytes, bytes, str]:
        proc, served_r = self.start(*args, cwd=cwd, stdin=stdin)
        out, err = proc.communicate(timeout=60)
        served = os.read(served_r, 256).decode()
        return proc.returncode, out, err, served


@pytest.fixture
def warm(private_tempdir: Path, config_home: Path) -> Iterator[Warm]:
    private, env = warm_setup(private_tempdir, config_home)
    helper = Warm(env, private)
    try:
        yield helper
    finally:
        for proc in helper.started:
            kill_if_alive(proc.pid)
        stop_warm_daemons(private)
        for fd in helper.readers:
            os.close(fd)


def _fresh(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "bash_sandbox.cli", *args],
        check=False,
        env=dict(env, **{wire.ENABLE_ENV: "0"}),
        cwd=cwd,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


def test_a_warm_run_answers_as_a_fresh_run_does(warm: Warm, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    args = ("run", "--json", "--mode", "read-only", "--", "cd sub && echo hi && echo x > f")
    fresh = _fresh(warm.env, *args, cwd=workspace)
    first = warm.run(*args, cwd=workspace)  # starts the daemon, then is served by it
    code, out, _, served = warm.run(*args, cwd=workspace)

    assert served == "1" and first[3] == "1"
    assert warm.daemon_pids() and all(is_alive(p) for p in warm.daemon_pids())
    assert code == fresh.returncode == 1
    got, want = json.loads(out), json.loads(fresh.stdout)
    assert got["stdout"]["text"] == want["stdout"]["text"] == "hi\n"
    assert got["sandbox"]["denied"] is want["sandbox"]["denied"] is True
    targets = [d["target"] for d in got["sandbox"]["denials"]]
    assert targets == [d["target"] for d in want["sandbox"]["denials"]]
    assert targets == [str(workspace / "sub" / "f")]
    assert not (workspace / "sub" / "f").exists()


def test_the_client_gives_its_own_cwd_environment_and_umask(warm: Warm, workspace: Path) -> None:
    (workspace / "here").mkdir()
    command = 'pwd; echo "$LANG"; umask'
    # The first call starts the daemon with its environment; the second's must win.
    for lang, umask in (("C", "0022"), ("C.UTF-8", "0027")):
        warm.env["LANG"] = lang  # the sandbox passes the locale on (and scrubs others)
        warm.env["WARM_UMASK"] = umask
        _, out, err, served = warm.run(
            "run", "--mode", "workspace-write", "--", command, cwd=workspace / "here"
        )
    assert served == "0", err
    lines = out.decode().splitlines()
    fresh = _fresh(
        warm.env, "run", "--mode", "workspace-write", "--", "pwd", cwd=workspace / "here"
    )
    assert lines[0] == fresh.stdout.decode().strip() == str(workspace / "here")
    assert lines[1] == "C.UTF-8"
    assert lines[2] == "0027"


_ENVIRONMENT_READS = """
import json, os, sys, tempfile
from bash_sandbox import git_hook_chain
from bash_sandbox.git_discovery import executor_dirs
from bash_sandbox.warm import spare
from bash_local.userdir import user_base_dir
from policies.autorun import needs_placeholder

def reads():
    return [tempfile.gettempdir(), user_base_dir(), sorted(executor_dirs()),
            needs_placeholder(".profile", os.environ["HOME"]),
            git_hook_chain._candidates("/nonexistent/.git", dict(os.environ))[:2]]

if sys.argv[1] == "fork":
    reads()  # the daemon's own, read before the call's environment arrives
    spare.adopt_environment(json.loads(sys.argv[2]))
print(json.dumps(reads()))
"""


def test_a_call_reads_its_callers_tmpdir_home_and_path_not_the_daemons(tmp_path: Path) -> None:
    # What a fork of the daemon reads after taking a call's environment is what a fresh
    # process started with that environment reads (the state directory under TMPDIR: the
    # probe cache, the executors' state; the homes; the git found on PATH).
    bins = []
    for name in ("daemon", "caller"):
        for sub in ("tmp", "home", "prefix/bin", "prefix/etc"):
            (tmp_path / name / sub).mkdir(parents=True)
        git = tmp_path / name / "prefix" / "bin" / "git"
        git.write_text("#!/bin/sh\n")
        git.chmod(0o755)
        bins.append(str(git.parent))

    def env(name: str, path: str) -> dict[str, str]:
        return dict(
            os.environ,
            TMPDIR=str(tmp_path / name / "tmp"),
            HOME=str(tmp_path / name / "home"),
            PATH=f"{path}:{os.environ['PATH']}",
        )

    caller = env("caller", bins[1])
    fresh = _python_words(_ENVIRONMENT_READS, "fresh", env=caller)
    forked = _python_words(
        _ENVIRONMENT_READS, "fork", json.dumps(caller), env=env("daemon", bins[0])
    )
    assert forked == fresh
    reads = json.loads(" ".join(fresh))
    assert reads[0] == str(tmp_path / "caller" / "tmp")
    assert reads[3] is True  # the caller's HOME is a home: its .profile is held
    assert reads[4][1] == str(tmp_path / "caller" / "prefix" / "etc" / "gitconfig")


def _ancestors(pid: int) -> list[int]:
    """``pid``'s parent, its parent, and so on (from /proc)."""
    found: list[int] = []
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        found.append(pid)
    return found


def _spares(warm: Warm) -> list[int]:
    """The daemons' spares that are ready: among their children (a call's process lingers
    a moment after its answer, closing its executor), those `_prepared` says are."""
    return [pid for daemon in warm.daemon_pids() for pid in children(daemon) if _prepared(pid)]


def _prepared(pid: int) -> bool:
    """Whether ``pid`` is a spare that has made its executor: its supervisor thread runs,
    and it has left the call's directory (it starts, in the daemon's, with one thread; a
    call's process works in the caller's)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1 and os.readlink(f"/proc/{pid}/cwd") == "/"
    except OSError:
        return False


def _sleeping_run(
    warm: Warm, workspace: Path, tag: str
) -> tuple[subprocess.Popen[bytes], list[int], int]:
    """A warm run (the daemon up first, and a spare made for the run's shape by an earlier
    call of it) whose command waits on a `sleep` nobody else runs; returns the client, the
    sleep's host pids once it is up, and the daemon's child that runs the call."""
    options = ("run", "--mode", "workspace-write", "--workspace", str(workspace), "--")
    warm.run(*options, "true", cwd=workspace)
    wait_until(lambda: bool(_spares(warm)), timeout=20, what="a spare made")
    seconds = f"30.{os.getpid()}{tag}"
    proc, _ = warm.start(*options, f"sleep {seconds} & wait", cwd=workspace)
    wait_until(lambda: bool(host_pids_with_argv(["sleep", seconds])), timeout=20, what="sleep up")
    sleepers = host_pids_with_argv(["sleep", seconds])
    daemons = warm.daemon_pids()
    call = next(p for p in _ancestors(sleepers[0]) if any(p in children(d) for d in daemons))
    return proc, sleepers, call


def test_sigterm_to_the_client_stops_the_command(warm: Warm, workspace: Path) -> None:
    proc, sleepers, call = _sleeping_run(warm, workspace, "7")
    try:
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 143, err
        assert b"SIGTERM: the command's process group was killed" in err
        for pid in (*sleepers, call):
            wait_until(lambda pid=pid: not is_alive(pid), timeout=10, what=f"pid {pid} gone")
    finally:
        for pid in sleepers:
            kill_if_alive(pid)


def test_a_call_of_a_known_shape_runs_in_the_spare_made_for_it(warm: Warm, workspace: Path) -> None:
    options = ("run", "--mode", "read-only", "--")
    warm.run(*options, "true", cwd=workspace)
    wait_until(lambda: bool(_spares(warm)), timeout=20, what="a spare made")
    (spare,) = _spares(warm)
    seconds = f"30.{os.getpid()}5"
    proc, served_r = warm.start(*options, f"echo up; sleep {seconds} & wait", cwd=workspace)
    try:
        wait_until(lambda: bool(host_pids_with_argv(["sleep", seconds])), timeout=20, what="up")
        (sleeper,) = host_pids_with_argv(["sleep", seconds])
        # The command runs below the spare, which was there before the call came.
        assert spare in _ancestors(sleeper)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert (proc.returncode, out) == (130, b"up\n"), err
        assert os.read(served_r, 64) == b"130"
        for pid in (sleeper, spare):
            wait_until(lambda pid=pid: not is_alive(pid), timeout=10, what=f"pid {pid} gone")
        # Served once: the next call of the shape finds a new spare.
        wait_until(lambda: bool(_spares(warm)), timeout=20, what="the next spare")
        assert spare not in _spares(warm)
    finally:
        kill_if_alive(sleeper)


def test_a_spare_never_serves_a_call_whose_config_changed(
    warm: Warm, workspace: Path, config_home: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "outside" / "token"
    secret.parent.mkdir()
    secret.write_text("tok-3141592653\n")
    options = ("run", "--mode", "read-only", "--")
    code, out, err, _ = warm.run(*options, f"cat {secret}", cwd=workspace)
    assert (code, out) == (0, b"tok-3141592653\n"), err  # readable without the config
    wait_until(lambda: bool(_spares(warm)), timeout=20, what="a spare made")
    (spare,) = _spares(warm)
    # The user denies the file after the spare built its executor without that rule.
    write_user_config(config_home, f"deny_read = [{str(secret)!r}]\n")
    code, out, err, served = warm.run(*options, f"cat {secret}; echo exit=$?", cwd=workspace)
    assert b"tok-3141592653" not in out + err
    assert out.endswith(b"exit=1\n") and served == "0", err
    # It was this spare's call (served, then gone), run with the call's own config.
    wait_until(lambda: not is_alive(spare), timeout=10, what="the spare gone")


def test_spares_close_with_their_daemon(warm: Warm, workspace: Path) -> None:
    warm.env[wire.IDLE_ENV] = "2"
    for mode in ("read-only", "workspace-write"):
        code, _, err, _ = warm.run("run", "--mode", mode, "--", "true", cwd=workspace)
        assert code == 0, err
    wait_until(lambda: len(_spares(warm)) == 2, timeout=20, what="two spares made")
    spares = _spares(warm)
    daemons = warm.daemon_pids()
    for pid in (*daemons, *spares):
        wait_until(lambda pid=pid: not is_alive(pid), timeout=30, what=f"pid {pid} gone")
    # Each closed its executor: no state directory of theirs is left.
    state = warm.private / "state"
    assert not state.exists() or [p.name for p in state.iterdir() if p.is_dir()] == []


def test_a_request_too_large_to_hand_over_is_served_by_a_fork(warm: Warm, workspace: Path) -> None:
    warm.env["WARM_BULK"] = "x" * (spare.MAX_MESSAGE + 1)
    for _ in range(3):
        code, out, err, served = warm.run(
            "run", "--mode", "read-only", "--", 'echo "${#WARM_BULK}"', cwd=workspace
        )
        assert (code, served) == (0, "0"), err
    # The sandbox scrubs unknown variables; what matters is the answer, each time.
    assert out in (b"0\n", f"{spare.MAX_MESSAGE + 1}\n".encode())


def test_a_call_whose_config_is_broken_is_answered_as_a_fresh_run(
    warm: Warm, workspace: Path, config_home: Path
) -> None:
    write_user_config(config_home, "mode = 'nonsense'\n")
    fresh = _fresh(warm.env, "run", "--", "true", cwd=workspace)
    answered = 0
    for _ in range(4):  # the first starts the daemon; the later ones meet a spare
        code, out, err, served = warm.run("run", "--", "true", cwd=workspace)
        if served == "None":
            # Not the daemon's (not up within the client's wait on a loaded CI machine, or
            # retired): the console script runs that call fresh, by design.
            continue
        assert served == "2", served  # the daemon's answer, not a fresh run's
        assert (code, out, err) == (fresh.returncode, fresh.stdout, fresh.stderr)
        assert code == 2 and b"config" in err
        answered += 1
    assert answered >= 1  # the daemon itself answered a broken config as a fresh run does


def test_a_killed_client_takes_its_run_with_it(warm: Warm, workspace: Path) -> None:
    proc, sleepers, call = _sleeping_run(warm, workspace, "8")
    runs = [call]
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        for pid in [*sleepers, *runs]:
            wait_until(lambda pid=pid: not is_alive(pid), timeout=20, what=f"pid {pid} gone")
        assert all(is_alive(p) for p in warm.daemon_pids())  # the daemon serves on
        # Hung up, not killed: the run removed its executor's cgroups itself.
        left = [
            os.path.join(top, name)
            for top, names, _ in os.walk("/sys/fs/cgroup")
            for name in names
            if any(name.startswith(f"bash-sandbox-{pid}-") for pid in runs)
        ]
        assert left == []
    finally:
        for pid in sleepers:
            kill_if_alive(pid)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a second uid")
def test_another_uid_is_never_served(warm: Warm, workspace: Path, tmp_path: Path) -> None:
    warm.run("run", "--mode", "read-only", "--", "true", cwd=workspace)
    sock_path = next(warm.private.glob("warm-*.sock"))
    # Open the socket itself to others for the test (its directory stays 0700).
    os.chmod(sock_path, 0o777)
    marker = tmp_path / "marker"
    request = {
        "argv": ["run", "--mode", "danger-full-access", "--", f"touch {marker}"],
        "env": {"PATH": "/usr/bin:/bin"},
        "umask": 0o022,
    }
    # The socket reached through a descriptor: the test's parent directories are 0700.
    way = os.open(sock_path, os.O_PATH)
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports on the pipe, then exits
        answer = "error"
        try:
            os.setgid(65534)
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            sock.connect(f"/proc/self/fd/{way}")
            cwd = os.open("/", os.O_PATH)
            wire.send_frame(sock, request, [0, 1, 2, cwd])
            answer = repr(wire.recv_frame(sock))
        except BaseException as exc:
            answer = repr(exc)
        finally:
            os.write(report_w, answer.encode())
            os._exit(0)
    os.close(way)
    os.close(report_w)
    os.waitpid(pid, 0)
    with os.fdopen(report_r, "rb") as fh:
        answer = fh.read().decode()
    # Closed without an answer (before or after the request was written).
    refused = (
        BrokenPipeError(32, "Broken pipe"),
        ConnectionResetError(104, "Connection reset by peer"),
    )
    assert answer in ("None", *map(repr, refused))
    assert not marker.exists()
    assert all(is_alive(p) for p in warm.daemon_pids())


def test_an_idle_daemon_exits_and_removes_its_socket(warm: Warm, workspace: Path) -> None:
    warm.env[wire.IDLE_ENV] = "1"
    code, _, _, served = warm.run("run", "--mode", "read-only", "--", "true", cwd=workspace)
    assert (code, served) == (0, "0")
    pids = warm.daemon_pids()
    assert pids
    for pid in pids:
        wait_until(lambda pid=pid: not is_alive(pid), timeout=20, what="idle daemon gone")
    assert not list(warm.private.glob("warm-*.sock"))


def test_a_daemon_whose_code_changed_is_stale(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text("x = 1\n")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        daemon = warm_daemon._Daemon(
            listener,
            str(tmp_path / "s"),
            1.0,
            -1,
            build_parser("bash-sandbox"),
            CodeWatch([str(module)]),
        )
        assert not daemon.code.changed()
        module.write_text("x = 2\n")
        assert daemon.code.changed()
        daemon.code.close()
    finally:
        listener.close()


_ANSWERING_CALL = """
import os, socket, sys
from bash_sandbox.warm import daemon
stdin, stdout, stderr, go = map(int, sys.argv[1:])
ours, theirs = socket.socketpair()
cwd = os.open(".", os.O_PATH | os.O_DIRECTORY)
daemon._become_client({"umask": 0o022, "env": dict(os.environ)}, [stdin, stdout, stderr, cwd])
print("the command's output", flush=True)
daemon._reply(ours, 0)
sys.stderr.write("the teardown's note\\n")
sys.stderr.flush()
os.read(go, 1)  # the executor's teardown, as long as the test wants
"""


def test_a_call_lets_go_of_the_clients_stdio_with_its_answer(tmp_path: Path) -> None:
    # A caller reading the client's output to its end (pipes) is done when the client has its
    # answer and exits, not when the call's process has also closed its executor.
    log = tmp_path / "daemon.log"
    (in_r, in_w), (out_r, out_w), (err_r, err_w), (go_r, go_w) = (os.pipe() for _ in range(4))
    with open(log, "wb") as log_file:
        call = subprocess.Popen(
            [sys.executable, "-c", _ANSWERING_CALL, *map(str, (in_r, out_w, err_w, go_r))],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,  # the daemon's stderr: its log
            pass_fds=(in_r, out_w, err_w, go_r),
        )
    for fd in (in_r, out_w, err_w, go_r):
        os.close(fd)
    try:
        assert _read_to_end(out_r) == b"the command's output\n"
        assert _read_to_end(err_r) == b""
        assert call.poll() is None  # the call's process is still there
        with contextlib.suppress(OSError):
            os.write(in_w, b"x")  # its stdin was let go as well: nobody reads it
    finally:
        os.write(go_w, b"x")
        os.close(go_w)
        os.close(in_w)
        call.wait(timeout=30)
    assert call.returncode == 0
    assert log.read_bytes().endswith(b"the teardown's note\n")


def _read_to_end(fd: int, timeout: float = 20.0) -> bytes:
    """What the pipe ``fd`` holds up to its end (then closed); fails if the end never comes."""
    got = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no end of file within {timeout} s (read {got!r})"
            chunk = os.read(fd, 4096)
            if not chunk:
                return got
            got += chunk
    finally:
        os.close(fd)


def _replace(path: Path) -> None:
    new = path.with_name(path.name + ".new")
    new.write_text("replaced\n")
    new.replace(path)  # as an install puts a new file in place


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p.write_text("edited\n"),
        _replace,
        lambda p: p.unlink(),
        lambda p: os.utime(p, ns=(0, 0)),
        lambda p: p.parent.rename(p.parent.with_name("moved")),
    ],
    ids=["write", "rename-over", "unlink", "touch", "directory-moved"],
)
@pytest.mark.parametrize("watched", [True, False], ids=["inotify", "stat"])
def test_the_code_watch_sees_every_change_to_a_loaded_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[Path], None], watched: bool
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    loaded, other = package / "loaded.py", package / "other.py"
    loaded.write_text("x = 1\n")
    if not watched:  # no inotify to be had (the user's limits): every file is stated
        monkeypatch.setattr(inotify.Inotify, "__init__", _no_inotify)
    watch = CodeWatch([str(loaded)])
    try:
        # What is not a loaded file changes nothing: an editor's swap file, a cache.
        other.write_text("y\n")
        (package / "__pycache__").mkdir()
        assert not watch.changed()
        change(loaded)
        assert watch.changed() and watch.changed()  # and stays so
    finally:
        watch.close()


def _no_inotify(self: inotify.Inotify) -> None:
    raise inotify.InotifyError(24, "too many inotify instances")


def test_the_client_imports_nothing_heavy() -> None:
    # What the client's own imports add to the interpreter's start (`site` may bring some
    # of these already, depending on the install): nothing of the sandbox's runtime, and
    # none of the standard modules that cost milliseconds each (enum through `signal` and
    # `socket`, re through `json`, functools and collections through `contextlib`).
    probe = (
        "import sys; before = set(sys.modules); "
        "import bash_sandbox.entry, bash_sandbox.warm.client; "
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
        "('pydantic', 'asyncio', 'bash_local', 'policies', 'bash_seam', 'typing', 'enum', "
        "'re', 'json', 'socket', 'signal', 'contextlib', 'functools', 'collections') "
        "or m.startswith('bash_sandbox.cli')))"
    )
    assert _python_words(probe) == ["[]"]


def test_frames_are_written_as_json_writes_them() -> None:
    env = {
        "PLAIN": "x",
        "QUOTES": 'a"b\\c',
        "CONTROL": "\x00\x01\t\n\x7f",
        "UNICODE": "h\u00e9llo \u2603 \U0001f600",
        "SURROGATE": "\udcff\udc80",  # an undecodable byte, as os.environ keeps it
        "": "",
    }
    request = {"argv": ["run", "--", "echo 'x' \"y\""], "env": env, "umask": 0o22}
    for message in (request, {"exit": 0}, {"signal": 15}, {"stale": False}, {"n": None}):
        encoded = wire._encode(message)
        assert encoded == json.dumps(message, separators=(",", ":"))
        assert json.loads(encoded) == message
    with pytest.raises(TypeError):
        wire._encode({"f": 1.5})
    with pytest.raises(TypeError):
        wire._encode({1: "non-string key"})


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        (b'{"exit":0}', {"exit": 0}),
        (b'{"exit":137}', {"exit": 137}),
        (b'{"signal":-1}', {"signal": -1}),
        (b'{"stale":true}', {"stale": True}),
        (b'{"stale":false,"exit":3}', {"stale": False, "exit": 3}),
        (b"{}", {}),
    ],
)
def test_the_client_reads_the_daemons_answers(body: bytes, answer: dict[str, object]) -> None:
    assert wire._flat_object(body) == answer


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'{"exit":"0"}',  # a string
        b'{"exit":01}',  # a leading zero
        b'{"exit":1.0}',
        b'{"exit":1e3}',
        b'{"exit": 1}',  # a space
        b'{"exit":1,}',
        b'{"exit":1,"exit":2}',  # a repeated name
        b'{"Exit":1}',
        b'{"ex,it":1}',
        b'{"exit":{"a":1}}',
        b'{"exit":null}',
        b'{"exit":\xd9\xa1}',  # a non-ASCII digit
        b"{exit:1}",
        b'{"":1}',
    ],
)
def test_the_client_refuses_anything_else(body: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire._flat_object(body)


# A confined command whose writable root holds another TMPDIR's private directory (a shell's
# TMPDIR=~/tmp while the harness's executor, started elsewhere, runs with workspace ~) sees
# the warm daemon's socket: sockets inside a writable root are the command's to reach, and
# the connect its executor makes for it carries the executor's credentials.
_FAKE_CLIENT = """
import glob, json, os, socket, struct, sys
sock_path, cwd_dir, marker = sys.argv[1:]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
os.chdir(os.path.dirname(sock_path))  # a relative name: a deep temp dir overflows sun_path
s.connect(os.path.basename(sock_path))
cwd = os.open(cwd_dir, os.O_PATH | os.O_DIRECTORY)
request = {
    "argv": ["run", "--mode", "danger-full-access", "--", f"echo escaped > {marker}"],
    "env": {"PATH": "/usr/bin:/bin"},
    "umask": 0o022,
}
body = json.dumps(request).encode()
socket.send_fds(s, [struct.pack(">I", len(body)) + body], [0, 1, 2, cwd])
head = s.recv(4)
print("reply:", s.recv(struct.unpack(">I", head)[0]).decode() if len(head) == 4 else None)
"""


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded-base", "unrecorded-base"])
def test_a_confined_command_cannot_have_the_daemon_run_it_unconfined(
    warm: Warm,
    workspace: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    recorded: bool,
) -> None:
    for _ in range(2):  # the first call starts the daemon, the second is served by it
        _, _, err, served = warm.run("run", "--mode", "read-only", "--", "true", cwd=workspace)
    assert served == "0", err
    sock_path = next(warm.private.glob("warm-*.sock"))
    other_tmp = tmp_path_factory.mktemp("harness-tmp")  # the harness's TMPDIR: elsewhere
    marker = other_tmp / "escaped"  # outside every writable root of the attack
    (tmp_path / "attack.py").write_text(_FAKE_CLIENT)
    if recorded:
        # Recorded when the daemon took it: hidden from every command, whatever its roots
        # (a command reached it while it lay in a workspace, before bases were recorded).
        seen = _fresh(
            dict(warm.env, TMPDIR=str(other_tmp)),
            "run", "--mode", "workspace-write", "--workspace", str(tmp_path), "--",
            f"ls {warm.private} || echo HIDDEN; touch {warm.private}/x || echo REFUSED",
            cwd=tmp_path,
        )  # fmt: skip
        assert b"HIDDEN" in seen.stdout and b"REFUSED" in seen.stdout, seen.stderr
        assert not (warm.private / "x").exists()
        return
    # The layer behind the hiding: the socket reached all the same (a hard link the host
    # left in the workspace), the daemon must still refuse whoever sends the request.
    link = tmp_path / "reach.sock"
    os.link(sock_path, link)
    sock_path = link
    attack = _fresh(
        dict(warm.env, TMPDIR=str(other_tmp)),
        "run",
        "--mode",
        "workspace-write",
        "--workspace",
        str(tmp_path),  # holds the warm private directory
        "--",
        f"{sys.executable} attack.py {sock_path} {workspace} {marker}",
        cwd=tmp_path,
    )
    # The premise: the command reached the socket and the daemon answered it.
    assert b"reply:" in attack.stdout, attack.stderr
    assert not marker.exists(), attack.stdout
    assert b"escaped" not in attack.stdout


_FAKE_DAEMON = """
import os, socket, sys
sock_path, record = sys.argv[1:]
if os.path.exists(sock_path):
    os.unlink(sock_path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
os.chdir(os.path.dirname(sock_path))  # a relative name: a deep temp dir overflows sun_path
s.bind(os.path.basename(sock_path))
s.listen(8)
open(record + ".ready", "w").close()
s.settimeout(40)
conn, _ = s.accept()
conn.settimeout(10)
got = b""
try:
    while chunk := conn.recv(1 << 16):
        got += chunk
except OSError:
    pass
with open(record, "wb") as fh:
    fh.write(got)
"""


def test_a_client_never_talks_to_a_confined_listener(
    warm: Warm, workspace: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    warm.run("run", "--mode", "read-only", "--", "true", cwd=workspace)
    sock_path = next(warm.private.glob("warm-*.sock"))  # the path the client will use
    for pid in warm.daemon_pids():
        kill_if_alive(pid)
    other_tmp = tmp_path_factory.mktemp("harness-tmp")
    record = tmp_path / "received"
    (tmp_path / "listen.py").write_text(_FAKE_DAEMON)
    squatter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bash_sandbox.cli",
            "run",
            "--mode",
            "workspace-write",
            "--workspace",
            str(tmp_path),
            "--timeout-ms",
            "60000",
            "--",
            f"{sys.executable} listen.py {tmp_path / 'squat.sock'} {record}",
        ],
        env=dict(warm.env, TMPDIR=str(other_tmp), **{wire.ENABLE_ENV: "0"}),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: Path(f"{record}.ready").exists(), timeout=30, what="listener up")
        # The private dir is hidden from every command (its base is recorded), so the
        # confined listener reaches the client's path only as the host links it there: the
        # client's own check of who listens is what is tested.
        with contextlib.suppress(FileNotFoundError):
            sock_path.unlink()
        os.link(tmp_path / "squat.sock", sock_path)
        warm.env["WARM_SECRET"] = "s3cret-for-the-daemon-only"
        code, out, err, served = warm.run(
            "run", "--mode", "read-only", "--", "echo real", cwd=workspace
        )
        _, squat_err = squatter.communicate(timeout=60)
        assert record.exists(), squat_err  # the premise: the listener saw the connection
        assert record.read_bytes() == b""  # sent nothing: no environment, no descriptors
        # Refused, then run by a daemon of its own (it took the path over) or fresh.
        assert served in ("0", "None") and code == 0 and out == b"real\n", err
    finally:
        kill_if_alive(squatter.pid)


def test_a_later_call_does_not_inherit_the_first_callers_environment(
    warm: Warm, workspace: Path
) -> None:
    git_env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    subprocess.run(["git", "init", "-q", "-b", "main", str(workspace)], check=True, env=git_env)
    subprocess.run(
        ["git", "-C", str(workspace), "commit", "-q", "--allow-empty", "-m", "host"],
        check=True,
        env=git_env,
    )
    # The call that starts the daemon names the git import's crash-injection point.
    warm.env["BASH_SANDBOX_GIT_IMPORT_CRASH"] = "objects"
    warm.run("run", "--mode", "read-only", "--", "true", cwd=workspace)
    del warm.env["BASH_SANDBOX_GIT_IMPORT_CRASH"]
    code, _, err, served = warm.run(
        "run",
        "--mode",
        "workspace-write",
        "--",
        "git -c user.name=c -c user.email=c@c commit -q --allow-empty -m from-the-command",
        cwd=workspace,
    )
    assert served == "0" and code == 0, err
    log = subprocess.run(
        ["git", "-C", str(workspace), "log", "--format=%s"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert log == ["from-the-command", "host"]


def _python_words(script: str, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """What ``script`` prints, split into words, run by this interpreter in a process of its
    own (module state such as the daemon's seed or switches never reaches the test's)."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    ).stdout.split()


_LEFT_TO_EXIT = """
import fcntl, os, sys
from bash_sandbox.linux import inotify

def watched():
    ino = inotify.Inotify()
    ino.add_watch(sys.argv[1], inotify.NAME_CHANGES)
    return ino, ino.fd

def is_open(fd):
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        return False
    return True

first, fd = watched()
first.close()
closed_normally = not is_open(fd)
inotify.leave_closing_to_exit()
second, fd = watched()
second.close()
print(closed_normally, second.fd, is_open(fd), fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
"""


def test_a_process_that_ends_with_its_run_leaves_inotify_to_its_exit(tmp_path: Path) -> None:
    # In a process of its own: the switch is for a process about to exit (the daemon's fork
    # of one run), never for this test process.
    out = _python_words(_LEFT_TO_EXIT, str(tmp_path))
    # Closed at once by default; afterwards forgotten but open (close-on-exec, so no
    # command inherits it) until the process exits.
    assert out == ["True", "-1", "True", "1"]


_SEEDED_RUN = """
import asyncio, os, sys
from bash_sandbox.warm import daemon
from bash_sandbox.backends import shadow_cache

daemon._warm_up()
print(shadow_cache._seeded is not None)
from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest

async def main():
    ex = SandboxBashExecutor(mode="read-only", workspace_root=sys.argv[1])
    try:
        r = await ex.run(ex.resolve(BashExecRequest(command="cat ~/.netrc", workdir=sys.argv[1])))
        print(ex._services.survey._shadows.hits, r.exit_code != 0, "hunter2" in r.stdout.text)
    finally:
        await ex.aclose()

asyncio.run(main())
"""


def test_the_daemons_seeded_survey_serves_a_forks_first_run_and_still_hides(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text("machine x password hunter2\n")
    (home / ".cache").mkdir()  # as any used home has it (an executor would make it)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    for path in (home, tmp_path):  # long settled: the seed may trust them
        os.utime(path, (1_600_000_000, 1_600_000_000))
    # ctime cannot be set back: wait out the settle window the seed applies to it.
    time.sleep(2.1)
    out = _python_words(_SEEDED_RUN, str(workspace), env={**os.environ, "HOME": str(home)})
    # Seeded; the first command of a fresh executor used it; the secret stayed hidden.
    assert out == ["True", "1", "True", "False"]


def test_a_prepared_executor_fits_only_the_context_it_was_made_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made_in, elsewhere = tmp_path / "a", tmp_path / "b"
    made_in.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(made_in)
    st = made_in.stat()
    env = dict(os.environ)
    config = SandboxBashConfig(workspace_root=str(made_in))
    executor = object()  # never touched by these checks
    prepared = spare.Prepared(executor, config, env, 0o022, (st.st_dev, st.st_ino))  # type: ignore[arg-type]
    call = {"umask": 0o022}
    assert prepared.fits(call)
    assert not prepared.fits({"umask": 0o027})
    monkeypatch.setenv("WARM_EXTRA", "1")
    assert not prepared.fits(call)
    monkeypatch.delenv("WARM_EXTRA")
    monkeypatch.chdir(elsewhere)
    assert not prepared.fits(call)
    # Taken once, and only for an equal config.
    assert prepared.take(config.model_copy(update={"deny_read": ("/x",)})) is None
    assert prepared.take(SandboxBashConfig(workspace_root=str(made_in))) is executor
    assert prepared.take(config) is None


def test_a_hand_over_arrives_whole_or_not_at_all() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(spare.CALL_FDS)]
    try:
        assert spare.hand_over(ours, b'{"argv":["run"]}', fds)
        request, got = spare.wait_for_call(theirs)
        assert request == {"argv": ["run"]} and len(got) == spare.CALL_FDS
        for fd in got:
            os.close(fd)
        assert spare.hand_over(ours, b"{}", fds[:2])  # too few descriptors: refused there
        with pytest.raises(OSError, match="malformed"):
            spare.wait_for_call(theirs)
        ours.close()
        assert spare.wait_for_call(theirs) is None  # the daemon closed its end
        theirs.close()
        gone, left = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        left.close()
        assert not spare.hand_over(gone, b"{}", fds)  # the spare died: the daemon forks
        gone.close()
    finally:
        for fd in fds:
            os.close(fd)
    assert spare.encode_call({"env": {"X": "x" * spare.MAX_MESSAGE}}) is None


@pytest.mark.parametrize(
    "request_",
    [{"argv": 5}, {"argv": ["run", "--", "true"], "env": "x", "umask": 18}, {"umask": [1]}],
)
def test_a_malformed_request_never_takes_the_daemon_down(
    warm: Warm, workspace: Path, request_: dict[str, object]
) -> None:
    warm.run("run", "--mode", "read-only", "--", "true", cwd=workspace)
    daemons = warm.daemon_pids()
    sock_path = next(warm.private.glob("warm-*.sock"))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    null = os.open(os.devnull, os.O_RDWR)
    cwd = os.open(workspace, os.O_PATH)
    try:
        sock.settimeout(20)
        wire.at_path(sock, str(sock_path), bind=False)
        try:
            wire.send_frame(sock, request_, [null, null, null, cwd])
            answer = wire.recv_answer(sock)
        except (BrokenPipeError, ConnectionResetError):
            answer = None  # closed on us mid-frame (a loaded machine): refused all the same
    finally:
        sock.close()
        os.close(null)
        os.close(cwd)
    assert answer is None or answer.get("exit") == 70  # refused by the call's process
    code, out, err, served = warm.run("run", "--mode", "read-only", "--", "echo on", cwd=workspace)
    assert (code, out, served) == (0, b"on\n", "0"), err
    assert warm.daemon_pids() == daemons and all(map(is_alive, daemons))  # the same daemon


def test_the_client_is_answered_once_nothing_of_the_command_runs(
    warm: Warm, workspace: Path
) -> None:
    seconds = f"30.{os.getpid()}6"
    options = ("run", "--mode", "workspace-write", "--")
    warm.run(*options, "true", cwd=workspace)  # the daemon up, a spare for the shape
    wait_until(lambda: bool(_spares(warm)), timeout=20, what="a spare made")
    # The command leaves a process behind and writes a file: when the client has its
    # answer, its output is all there, the file imported, the process gone.
    code, out, err, served = warm.run(
        *options, f"sleep {seconds} & echo left > left.txt; echo done", cwd=workspace
    )
    assert host_pids_with_argv(["sleep", seconds]) == []
    assert (code, out, served) == (0, b"done\n", "0"), err
    assert (workspace / "left.txt").read_text() == "left\n"


def test_the_console_script_exits_with_the_warm_runs_status(warm: Warm, workspace: Path) -> None:
    for _ in range(2):  # the first starts the daemon; both are served by it
        done = subprocess.run(
            [sys.executable, "-m", "bash_sandbox.entry", "run", "--", "echo hi; exit 5"],
            check=False,
            env=warm.env,
            cwd=workspace,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
        assert (done.returncode, done.stdout) == (5, b"hi\n"), done.stderr
    assert warm.daemon_pids() and all(map(is_alive, warm.daemon_pids()))


def test_a_sender_or_listener_is_pinned_by_its_pidfd_and_a_request_by_its_deadline() -> None:
    # The daemon judged a request's sender by its pid when the last byte came, and a sender
    # could trickle bytes for as long as it liked: a confined sender that exited left its
    # pid to be reused by an unconfined process, which then passed for it (red team: served
    # `danger-full-access`). A pidfd (SCM_PIDFD, SO_PEERPIDFD) names that one process only.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pidfd = os.pidfd_open(child.pid)
        assert wire.unconfined_peer(child.pid, pidfd)  # alive: judged as its pid says
        child.kill()
        child.wait()
        assert not wire.pidfd_names(pidfd, child.pid)  # gone: whatever has its pid now
        assert not wire.unconfined_peer(os.getpid(), pidfd)  # a live pid, not that process
        os.close(pidfd)
    finally:
        kill_if_alive(child.pid)
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"\0\0\0\x10{")  # 16 bytes announced, one sent, then nothing
        with pytest.raises(OSError):
            wire.recv_request(a, max_fds=4, deadline=time.monotonic() + 0.3)


# The client, its daemon made to die as it starts (an install the daemon's interpreter
# cannot import from: `-I` drops the caller's `PYTHONPATH`).
_DYING_DAEMON_DRIVER = """
import os, sys
from bash_sandbox.warm import client
client._BOOT = "import sys; sys.stderr.write('cannot import\\\\n'); raise SystemExit(1)"
client._START_WAIT_S = 600.0  # waited out in full before: 5 s on every call
status = client.run(sys.argv[1:])
sys.stdout.write(repr(status))
"""


def test_a_daemon_that_dies_starting_is_not_waited_for_nor_started_again(
    warm: Warm, workspace: Path
) -> None:
    def call() -> str:
        done = subprocess.run(
            [sys.executable, "-c", _DYING_DAEMON_DRIVER, "run", "--", "true"],
            env=warm.env,
            cwd=workspace,
            capture_output=True,
            timeout=60,  # far below the wait the client was given
            check=False,
        )
        return done.stdout.decode()

    assert call() == "None"  # not served: the caller runs it fresh
    [log] = warm.private.glob("warm-*.sock.log")
    assert "cannot import" in log.read_text()  # the daemon's own word on why
    assert list(warm.private.glob("warm-*.sock.failed"))
    started = log.stat().st_ino, log.stat().st_mtime_ns
    assert call() == "None"
    assert (log.stat().st_ino, log.stat().st_mtime_ns) == started  # no second start
    assert warm.daemon_pids() == []


def test_the_daemon_imports_the_package_from_where_the_client_came_from(tmp_path: Path) -> None:
    # A source checkout or a `pip --target` install, on `PYTHONPATH` only: `-I -m` found no
    # package and every call waited 5 s for a daemon that had died. The daemon's boot puts
    # the client's own root first: a package there is the one it runs.
    from bash_sandbox.warm import client

    assert (Path(client._ROOT) / "bash_sandbox" / "warm" / "client.py").samefile(client.__file__)
    root = tmp_path / "root"
    (root / "bash_sandbox" / "warm").mkdir(parents=True)
    (root / "bash_sandbox" / "__init__.py").write_text("")
    (root / "bash_sandbox" / "warm" / "__init__.py").write_text("")
    (root / "bash_sandbox" / "warm" / "daemon.py").write_text(
        "def main(argv):\n    print('this root', argv)\n    return 7\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", client._BOOT, "the-socket", str(root)],
        env={"PYTHONPATH": "/nonexistent"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (7, "this root ['the-socket']\n"), done.stderr
