"""The write watch's C fast path (`bash_sandbox/linux/fast_writes.py`, issue 23's cost).

It may answer only what the Python supervisor would let through unjudged: its rules are
compared with `WritePolicy.surely_writable` over a corpus, and real commands on both
backends are checked from the host with the fast path on and off: the same refusals, the
same facts, nothing written outside the roots, set-id modes still refused, and every trap
inside the roots answered without waking Python.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bash_sandbox.linux import fast_writes, supervisor
from bash_sandbox.linux.binaries import system_binary
from bash_sandbox.linux.write_watch import (
    REASON_OUTSIDE_ROOTS,
    WritePolicy,
    _is_helper,
    leads_elsewhere,
)
from bash_seam import BashExecRequest, BashRunResult, DenialEvidence, DenialKind
from tests.sandbox.conftest import ExecutorFactory

PY = os.path.realpath("/usr/bin/python3")


@pytest.fixture
def lib() -> fast_writes.ctypes.CDLL:
    built = fast_writes.library()
    if built is None:
        if os.environ.get("CI"):
            pytest.fail("CI has a C compiler: the package's build must have built the fast path")
        pytest.skip("no fast path built here: the Python path serves every call")
    return built


@pytest.fixture(params=[True, False], ids=["fast-path", "python-only"])
def fast(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, lib: fast_writes.ctypes.CDLL
) -> bool:
    """The test runs with the fast path on, then off (the Python supervisor serves all)."""
    enabled: bool = request.param
    monkeypatch.setattr(fast_writes, "ENABLED", enabled)
    return enabled


POLICIES = (
    WritePolicy(read_only=False, roots=("/work/ws",)),
    WritePolicy(read_only=True, roots=("/work/ws",)),
    WritePolicy(
        read_only=False,
        roots=("/work/ws", "/srv/cache/", "/tmp/bound"),
        protected=(".env", "deploy/secrets.env", ".vscode"),
        hidden=("/work/ws/private",),
        guarded=(("/work/ws/.husky/pre-commit", "hook chain"),),
    ),
    WritePolicy(read_only=False, roots=("/",), protected=(".bashrc",)),
    WritePolicy(
        read_only=False,
        roots=("/work/ws",),
        view_mounts=False,
        scratch=("/tmp/bash-sandbox-x",),
    ),
    WritePolicy(read_only=True, roots=("/work/ws",), view_mounts=False, scratch=("/tmp/s",)),
)
PARTS = (
    "work", "ws", "wsx", ".git", ".gitx", "git", "hooks", "private", "privatex", ".env",
    ".envrc", "deploy", "secrets.env", ".vscode", "tmp", "bound", "boundx", "dev", "shm",
    "null", "srv", "cache", "cachex", ".husky", "pre-commit", "bash-sandbox-x", "s", "etc",
    ".bashrc",
)  # fmt: skip
FIXED = (
    "/", "/tmp", "/tmp/x", "/tmp/bound", "/tmp/bound/x", "/tmp/boundx/y", "/dev/null",
    "/dev/nullx", "/dev/shm", "/dev/shm/x", "/dev/tty", "/work/ws", "/work/wsx",
    "/work/ws/.git", "/work/ws/.git/hooks/x", "/work/ws/a/.git", "/work/ws/a/.gitx/b",
    "/work/ws/.env", "/work/ws/.envrc", "/work/ws/a/.env", "/work/ws/deploy/secrets.env",
    "/work/ws/.vscode/tasks.json", "/work/ws/private", "/work/ws/privatex",
    "/work/ws/.husky/pre-commit", "/work/ws/.husky/other", "/srv/cache", "/srv/cache/x",
    "/srv/cachex", "/etc/passwd", "/.bashrc", "/home/.bashrc", "/tmp/bash-sandbox-x/f",
    "/tmp/s/f", "/tmp/sx",
)  # fmt: skip


def _paths() -> Iterator[str]:
    yield from FIXED
    rng = random.Random(23)
    for _ in range(3000):
        yield "/" + "/".join(rng.choice(PARTS) for _ in range(rng.randint(1, 5)))


def test_the_c_rules_answer_as_the_python_rules(lib: fast_writes.ctypes.CDLL) -> None:
    compared = 0
    for policy, path in itertools.product(POLICIES, _paths()):
        got = fast_writes.answer(lib, policy, path)
        assert got is not None
        assert got == policy.surely_writable(path), (policy, path)
        compared += 1
    assert compared == len(POLICIES) * (len(FIXED) + 3000)


def test_rules_the_c_side_cannot_hold_are_left_to_python(lib: fast_writes.ctypes.CDLL) -> None:
    # An empty name would end its list early; a NUL cannot be written: both stay in Python.
    assert (
        fast_writes.rules_blob(WritePolicy(read_only=False, roots=("/w",), protected=("",))) is None
    )
    assert (
        fast_writes.rules_blob(WritePolicy(read_only=False, roots=("/w",), hidden=("/w/a\0b",)))
        is None
    )
    too_many = tuple(f"/w/{i}" for i in range(fast_writes.MAX_RULES + 1))
    assert fast_writes.rules_blob(WritePolicy(read_only=False, roots=too_many)) is None
    # And the C side refuses such a list itself (no fast rules: every call forwarded).
    blob = b"".join(os.fsencode(root) + b"\0" for root in too_many) + b"\0" * 6
    assert lib.bsf_rules_answer(blob, len(blob), 0, 0, b"/w/1/x") == -1
    fitting = b"".join(os.fsencode(root) + b"\0" for root in too_many[:-1]) + b"\0" * 6
    assert lib.bsf_rules_answer(fitting, len(fitting), 0, 0, b"/w/1/x") == 1


def test_the_c_side_knows_the_backends_binary_as_the_python_side(
    lib: fast_writes.ctypes.CDLL,
) -> None:
    own = os.stat(f"/proc/{os.getpid()}/exe")
    other = os.stat("/bin/sh")
    dead = subprocess.Popen(["true"])
    dead.wait()
    for helpers in ({(own.st_dev, own.st_ino)}, {(other.st_dev, other.st_ino)}, set()):
        policy = WritePolicy(read_only=True, roots=("/w",), helpers=frozenset(helpers))
        for pid in (os.getpid(), dead.pid):
            assert fast_writes.is_helper(lib, policy, pid) == _is_helper(pid, policy)
    mine = WritePolicy(read_only=True, roots=("/w",), helpers=frozenset({(own.st_dev, own.st_ino)}))
    assert fast_writes.is_helper(lib, mine, os.getpid()) is True  # the premise


async def test_bwraps_own_setup_never_wakes_python_and_the_commands_writes_are_still_judged(
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    fast: bool,
) -> None:
    # bwrap writes its user namespaces' uid_map, gid_map and setgroups (and, with
    # --disable-userns, a second namespace's) before the command starts: the judge drops
    # them (`_is_helper`), so the fast path answers them without the Python supervisor.
    # Without SHELL bash looks its user up at start (glibc then probes nscd's socket twice):
    # those connects are answered in C too, so the count holds whatever the runner's env.
    monkeypatch.delenv("SHELL", raising=False)
    tag = os.urandom(4).hex()
    target = Path("/etc") / f"bsf-helper-{tag}"
    counting = _Counting(monkeypatch)
    ex = make_executor(mode="read-only")
    result = await ex.run(
        ex.resolve(BashExecRequest(command=f"true; echo x > {target}", workdir=str(workspace)))
    )
    assert result.exit_code != 0
    assert not target.exists()
    assert str(target) in _write_denials(result)  # the command's own write: still a fact
    if fast:
        assert counting.count == 1, counting.count  # that write, and nothing of bwrap's
    elif backend == "bwrap":
        assert counting.count >= 7, counting.count  # the premise: bwrap's six, and that write


def test_the_c_side_sees_links_as_the_python_side(
    lib: fast_writes.ctypes.CDLL, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    ws = tmp_path / "ws"
    (ws / "real" / "deep").mkdir(parents=True)
    (ws / "file").write_text("")
    (ws / "link").symlink_to(outside / "x")
    (ws / "dirlink").symlink_to(outside)
    (ws / "inner").symlink_to(ws / "real")
    cases = {
        ws / "file": False,
        ws / "new": False,
        ws / "real" / "deep" / "new": False,
        ws / "link": True,  # the last component is a link
        ws / "dirlink" / "y": True,  # a link on the way
        ws / "inner" / "deep" / "z": True,  # judged even when it stays inside (only slower)
        ws / "missing" / "x": True,  # cannot tell: judged
        Path("/"): False,
    }
    for path, expected in cases.items():
        assert leads_elsewhere(str(path)) is expected, path
        assert fast_writes.leads_elsewhere(lib, str(path)) is expected, path


async def test_a_write_through_a_link_out_of_the_root_is_a_denial(
    make_executor: ExecutorFactory, workspace: Path, fast: bool
) -> None:
    # Outside /tmp (the view's /tmp is private): the host's own directory, read-only there.
    outside = Path(tempfile.mkdtemp(prefix="bsf-link-", dir="/var/tmp"))
    try:
        (workspace / "link").symlink_to(outside / "x")
        (workspace / "dirlink").symlink_to(outside)
        (workspace / "real").mkdir()
        (workspace / "inner").symlink_to(workspace / "real")
        ex = make_executor(mode="workspace-write")
        command = (
            "echo x > link; echo y > dirlink/y; echo z > inner/z; "
            f"ln -s {outside}/w made; echo w > made; "
            # A hard link is EROFS too (the new name is made before the mounts are compared).
            "ln inner/z dirlink/hard; ln inner/z real/linked; true"
        )
        result = await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workspace))))
        assert result.exit_code == 0, result.stderr.text
        assert list(outside.iterdir()) == []  # nothing written there, from the host's side
        assert (workspace / "real" / "z").read_text() == "z\n"  # a link inside still works
        assert (workspace / "real" / "linked").stat().st_ino == (workspace / "real/z").stat().st_ino
        denials = _write_denials(result)
        written = {str(outside / name) for name in ("x", "y", "w", "hard")}
        assert written <= denials, denials
        assert str(workspace / "real" / "z") not in denials
        assert all(
            d.reason == REASON_OUTSIDE_ROOTS
            for d in (result.sandbox.denials if result.sandbox else ())
            if d.target in written
        )
    finally:
        shutil.rmtree(outside, ignore_errors=True)


CONNECTS = (
    # Each connect the command tries, and its result as an errno name (or "ok").
    "import errno, os, socket, sys\n"
    "def attempt(address):\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    try:\n"
    "        s.connect(address)\n"
    "        return 'ok'\n"
    "    except OSError as e:\n"
    "        return errno.errorcode.get(e.errno, str(e.errno))\n"
    "    finally:\n"
    "        s.close()\n"
    "own = socket.socket(socket.AF_UNIX)\n"
    "own.bind('own.sock')\n"
    "own.listen(1)\n"
    "for name, address in (\n"
    "    ('missing-dir', '/bsf-missing-dir/x.sock'),\n"
    "    ('missing', os.path.abspath('gone.sock')),\n"
    "    ('dangling', os.path.abspath('dangling.sock')),\n"
    "    ('relative', 'gone.sock'),\n"
    "    ('own', os.path.abspath('own.sock')),\n"
    "    ('host', sys.argv[1]),\n"
    "    ('host-link', os.path.abspath('host-link.sock')),\n"
    "    ('nscd', '/var/run/nscd/socket'),\n"
    "):\n"
    "    print(name, attempt(address))\n"
)


async def test_a_connect_to_a_missing_unix_socket_is_refused_in_c_as_python_refuses_it(
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    lib: fast_writes.ctypes.CDLL,
) -> None:
    # glibc probes nscd's socket twice on a first user lookup (bash without SHELL, id, ls -l):
    # the C side answers such a connect ENOENT when nothing is at the path in the command's
    # view; everything else (a socket that is there, a relative name) is Python's, as before.
    # The same command runs with the fast path and without: same answers, same facts.
    monkeypatch.setenv("SHELL", "/bin/bash")  # bash's own lookup would add its probes
    outside = Path(tempfile.mkdtemp(prefix="bsf-sock-", dir="/var/tmp"))
    host = socket.socket(socket.AF_UNIX)
    try:
        host.bind(str(outside / "h.sock"))
        host.listen(8)
        (workspace / "dangling.sock").symlink_to("/bsf-missing-dir/y.sock")
        (workspace / "host-link.sock").symlink_to(outside / "h.sock")
        (workspace / "probe.py").write_text(CONNECTS)
        connects: dict[bool, int] = {}
        seen: dict[bool, tuple[str, set[str]]] = {}
        for enabled in (True, False):
            monkeypatch.setattr(fast_writes, "ENABLED", enabled)
            counting = _Counting(monkeypatch, only=supervisor._SYSCALLS["connect"])
            ex = make_executor(mode="workspace-write")
            command = f"rm -f own.sock; {PY} probe.py {outside / 'h.sock'}"
            result = await ex.run(
                ex.resolve(BashExecRequest(command=command, workdir=str(workspace)))
            )
            assert result.exit_code == 0, result.stderr.text
            assert result.sandbox is not None
            refused = {d.target for d in result.sandbox.denials if d.kind is DenialKind.SOCKET}
            seen[enabled] = (result.stdout.text, refused)
            connects[enabled] = counting.count
        assert seen[True] == seen[False]
        answers = dict(line.split() for line in seen[True][0].splitlines())
        assert answers["missing-dir"] == answers["missing"] == answers["dangling"] == "ENOENT"
        assert answers["relative"] == "ENOENT"
        assert answers["own"] == "ok"
        # The host's socket outside the roots (its /var/tmp is in both backends' views):
        # refused by Python with a fact, never connected.
        assert answers["host"] == answers["host-link"] == "EACCES", answers
        assert str(outside / "h.sock") in seen[True][1]
        host.setblocking(False)
        with pytest.raises(BlockingIOError):
            host.accept()  # the host's server saw nothing
        nscd = 1 if answers["nscd"] == "ENOENT" else 0
        # Answered in C: the three absolute missing paths (and nscd's where it is absent).
        assert connects[False] - connects[True] == 3 + nscd, connects
        assert connects[True] >= 4  # relative, own, host, host-link: still Python's
    finally:
        host.close()
        shutil.rmtree(outside, ignore_errors=True)


class _Counting:
    """How many notifications reached the Python supervisor (patched in per test)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, only: int | None = None) -> None:
        self.count = 0
        self._lock = threading.Lock()
        real = supervisor.SeccompSupervisor._dispatch

        def dispatch(sup: supervisor.SeccompSupervisor, command: object, notif: Any) -> None:
            if only is None or notif.data.nr == only:
                with self._lock:
                    self.count += 1
            real(sup, command, notif)

        monkeypatch.setattr(supervisor.SeccompSupervisor, "_dispatch", dispatch)


WORK = (
    # 400 write-intent opens, 100 mkdirs, 100 renames and 100 unlinks inside the workspace,
    # relative, absolute and through ./ and //, then refused writes outside it.
    "import os\n"
    "for i in range(100):\n"
    "    os.makedirs(f'out/d{i}', exist_ok=True)\n"
    "    for name in (f'out/d{i}/a', f'./out//d{i}/b', os.path.abspath(f'out/d{i}/c')):\n"
    "        with open(name, 'w') as fh: fh.write('x')\n"
    "    os.rename(f'out/d{i}/a', f'out/d{i}/a2')\n"
    "    os.unlink(f'out/d{i}/b')\n"
    "    os.close(os.open(f'out/d{i}/c', os.O_WRONLY | os.O_TRUNC))\n"
    "for target in ('/etc/bsf-fast-{tag}', '../bsf-outside-{tag}', 'out/../../bsf-dotdot-{tag}'):\n"
    "    try:\n"
    "        open(target, 'w')\n"
    "    except OSError as e:\n"
    "        print('refused', target, e.errno)\n"
)


def _write_denials(result: BashRunResult) -> set[str]:
    assert result.sandbox is not None
    return {
        d.target
        for d in result.sandbox.denials
        if d.evidence is DenialEvidence.SUPERVISOR and d.kind is DenialKind.FILE_WRITE
    }


async def test_writes_inside_skip_python_and_refusals_are_the_same(
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    fast: bool,
) -> None:
    tag = os.urandom(4).hex()
    (workspace / "w.py").write_text(WORK.replace("{tag}", tag))
    counting = _Counting(monkeypatch)
    ex = make_executor(mode="workspace-write")
    result = await ex.run(ex.resolve(BashExecRequest(command=f"{PY} w.py", workdir=str(workspace))))
    assert result.exit_code == 0, result.stderr.text
    out = workspace / "out"
    assert sorted(p.name for p in (out / "d7").iterdir()) == ["a2", "c"]
    outside = (Path("/etc") / f"bsf-fast-{tag}", workspace.parent / f"bsf-outside-{tag}")
    assert not any(p.exists() for p in outside)
    assert str(outside[0]) in _write_denials(result)
    assert str(outside[1]) in _write_denials(result)
    assert all(
        d.reason == REASON_OUTSIDE_ROOTS
        for d in (result.sandbox.denials if result.sandbox else ())
        if d.target in {str(p) for p in outside}
    )
    if fast:
        # Only what the fast rules cannot answer reached Python: the refused writes, the
        # `..` path, the interpreter's own start-up and the shell's; never the 700 inside.
        assert counting.count < 100, counting.count
    else:
        assert counting.count >= 700, counting.count


async def test_set_id_modes_are_still_refused_on_the_fast_path(
    make_executor: ExecutorFactory, workspace: Path, lib: fast_writes.ctypes.CDLL
) -> None:
    ex = make_executor(mode="workspace-write")
    command = (
        f"{PY} -c \"import os; os.close(os.open('suid', os.O_WRONLY | os.O_CREAT, 0o4755))\"; "
        "echo rc=$?; install -m 2755 /bin/true sgid; echo rc=$?"
    )
    result = await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workspace))))
    assert "rc=0" not in result.stdout.text, result.stdout.text
    for name in ("suid", "sgid"):
        path = workspace / name
        assert not path.exists() or not path.stat().st_mode & 0o6000
    assert result.sandbox is not None and any(
        d.operation and d.operation.startswith("open") and "4755" in d.operation
        for d in result.sandbox.denials
    )


def _fast_threads() -> int:
    """This process's fast-path threads, as the kernel names them (the C side starts them)."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            count += Path(f"/proc/self/task/{tid}/comm").read_text().strip() == "bsb-fast-writes"
    return count


async def test_the_fast_path_threads_end_with_their_commands(
    make_executor: ExecutorFactory, workspace: Path, lib: fast_writes.ctypes.CDLL
) -> None:
    ex = make_executor(mode="workspace-write")
    procs = [
        await ex.start(
            ex.resolve(BashExecRequest(command="while :; do echo x > f$RANDOM; sleep 0.01; done"))
        )
        for _ in range(3)
    ]
    assert _fast_threads() >= 3
    for proc in procs:
        proc.kill()
        await proc.wait()
    result = await ex.run(ex.resolve(BashExecRequest(command="echo y > g")))
    assert result.exit_code == 0 and (workspace / "g").read_text() == "y\n"
    await ex.aclose()
    assert _fast_threads() == 0


def test_the_c_source_builds_without_a_warning(
    tmp_path: Path, lib: fast_writes.ctypes.CDLL
) -> None:
    compiler = system_binary("cc") or system_binary("gcc")
    assert compiler is not None  # the fixture built the library with it
    done = subprocess.run(
        [compiler, "-Wall", "-Wextra", "-Werror", "-O2", "-shared", "-fPIC", "-o",
         str(tmp_path / "fw.so"), str(fast_writes.SOURCE)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_a_build_of_another_source_is_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lib: fast_writes.ctypes.CDLL
) -> None:
    # An editable install whose C file changed since it was built: its struct layouts may
    # differ, so the Python path serves until the package is reinstalled.
    changed = tmp_path / "fast_writes.c"
    changed.write_bytes(fast_writes.SOURCE.read_bytes() + b"/* changed */\n")
    monkeypatch.setattr(fast_writes, "SOURCE", changed)
    assert fast_writes._load.__wrapped__() is None
    monkeypatch.undo()
    assert fast_writes._load.__wrapped__() is not None


async def test_commands_past_the_cap_are_served_in_python(
    make_executor: ExecutorFactory,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    lib: fast_writes.ctypes.CDLL,
) -> None:
    # Each fast-path command holds a thread and two descriptors: a hundred background
    # commands must not exhaust a 1024-descriptor limit, so only the first few get one.
    monkeypatch.setattr(supervisor, "MAX_FAST_COMMANDS", 2)
    ex = make_executor(mode="workspace-write")
    procs = [
        await ex.start(ex.resolve(BashExecRequest(command=f"echo {i} > bg{i}; exec sleep 60")))
        for i in range(4)
    ]
    try:
        for i in range(4):
            # The shell creates the file before it writes: wait for the line, not the name.
            for _ in range(500):
                if (workspace / f"bg{i}").exists() and (workspace / f"bg{i}").read_text():
                    break
                await asyncio.sleep(0.01)
        assert [(workspace / f"bg{i}").read_text() for i in range(4)] == [
            f"{i}\n" for i in range(4)
        ]
        assert _fast_threads() == 2
        # Outside the roots, inside the test's own directory: harmless even if unconfined.
        outside = workspace.parent / "bsf-cap-test"
        refused = await ex.run(ex.resolve(BashExecRequest(command=f"echo x > {outside}")))
        assert refused.exit_code != 0 and not outside.exists()
        assert str(outside) in _write_denials(refused)
    finally:
        for proc in procs:
            proc.kill()
            await proc.wait()
    await ex.aclose()
    assert _fast_threads() == 0
