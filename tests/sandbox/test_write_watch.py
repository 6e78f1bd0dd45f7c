"""Issue 23 item 1, the supervisor part: a refused write is a denial only with evidence the
command cannot forge, its path resolved against the command's working directory at the time.

Every write here really runs on both Linux backends; the host is checked from the test
process afterwards (nothing outside the roots changed), then the supervisor's facts.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.linux.write_watch import REASON_OUTSIDE_ROOTS, REASON_READ_ONLY
from bash_seam import BashExecRequest, BashRunResult, DenialEvidence, DenialKind
from tests.sandbox.conftest import ExecutorFactory

PY = os.path.realpath("/usr/bin/python3")


async def _run(ex: SandboxBashExecutor, command: str, workdir: Path) -> BashRunResult:
    return await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workdir))))


def _seen(result: BashRunResult) -> list[tuple[str, str, str]]:
    """(target, operation, reason) of every write the supervisor saw refused."""
    assert result.sandbox is not None
    return [
        (d.target, d.operation or "", d.reason)
        for d in result.sandbox.denials
        if d.evidence is DenialEvidence.SUPERVISOR and d.kind is DenialKind.FILE_WRITE
    ]


async def test_a_relative_write_is_reported_where_the_command_was(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    (workspace / "sub").mkdir()
    ex = make_executor(mode="read-only")
    result = await _run(ex, "cd sub && echo x > rel.txt", workspace)
    assert result.exit_code != 0
    assert not (workspace / "sub" / "rel.txt").exists()
    assert _seen(result) == [(str(workspace / "sub" / "rel.txt"), "open", REASON_READ_ONLY)]


async def test_a_descriptor_relative_write_is_reported_under_that_directory(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    (workspace / "a" / "b").mkdir(parents=True)
    script = (
        "import os\n"
        "d = os.open('a/b', os.O_RDONLY | os.O_DIRECTORY)\n"
        "try:\n"
        "    os.open('made', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d)\n"
        "except OSError as e:\n"
        "    print(e.errno)\n"
    )
    (workspace / "w.py").write_text(script)
    ex = make_executor(mode="read-only")
    result = await _run(ex, f"{PY} w.py", workspace)
    assert result.stdout.text.strip() == "30"  # EROFS
    assert _seen(result) == [(str(workspace / "a" / "b" / "made"), "open", REASON_READ_ONLY)]


async def test_a_rename_over_or_off_a_covered_name_is_a_denial(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # Git writes its config by renaming `config.lock` over it: the covered `.git/config` is a
    # mount point (EBUSY), and `git remote add` failed with no denial in the facts, the
    # command exit 0 with only a hint read from its output (a usability pass).
    subprocess.run(["git", "init", "-q", str(workspace)], check=True, timeout=30)
    config = workspace / ".git" / "config"
    before = config.read_bytes()
    ex = make_executor(mode="workspace-write")
    for command in ("git remote add up /x", "mv .git/config .git/moved"):
        result = await _run(ex, command, workspace)
        assert result.exit_code != 0
        assert _seen(result) == [(str(config), "rename", "protected name .git/config")]
        assert config.read_bytes() == before
    # An ordinary rename in the workspace is none.
    plain = await _run(ex, "echo x > a && mv a b", workspace)
    assert plain.exit_code == 0 and _seen(plain) == []


async def test_every_kind_of_change_outside_the_roots_is_seen(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("old", "gone", "linked", "short", "log", "cut"):
        (outside / name).write_text("keep")
    (outside / "dir").mkdir()
    before = {p.name: p.stat().st_mtime_ns for p in outside.iterdir()}
    o = str(outside)
    command = (
        f"echo x > {o}/new; mkdir {o}/made; rm -f {o}/gone; mv {o}/old {o}/moved; "
        f"ln -s old {o}/link; ln {o}/linked {o}/hard; truncate -s0 {o}/short; rmdir {o}/dir; "
        f"{PY} -c \"import os; os.truncate('{o}/cut', 0)\"; cd {o} && echo y >> log"
    )
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, command, workspace)

    assert {p.name: p.stat().st_mtime_ns for p in outside.iterdir()} == before
    assert all((outside / n).read_text() == "keep" for n in ("gone", "short", "log", "cut"))
    seen = {(t, op) for t, op, reason in _seen(result) if reason == REASON_OUTSIDE_ROOTS}
    assert seen >= {
        (f"{o}/new", "open"),
        (f"{o}/made", "mkdir"),
        (f"{o}/gone", "unlink"),
        (f"{o}/moved", "rename"),
        (f"{o}/link", "symlink"),
        (f"{o}/hard", "link"),
        (f"{o}/dir", "rmdir"),
        (f"{o}/short", "open"),  # truncate(1) opens the file for writing first
        (f"{o}/log", "open"),  # relative, after `cd`
        (f"{o}/cut", "truncate"),
    }, seen


async def test_a_mode_or_owner_refused_outside_the_roots_is_seen(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # Round 15: a refused chmod or chown was at best a hint read from the output.
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("m", "o", "at", "target"):
        (outside / name).write_text("keep")
        (outside / name).chmod(0o644)
    (outside / "lnk").symlink_to(outside / "target")
    o = str(outside)
    before = {p.name: os.lstat(p).st_ctime_ns for p in outside.iterdir()}
    command = (
        f"chmod 600 {o}/m; chown 0:0 {o}/o; {PY} -c \"import os; os.chmod('at', 0o600, "
        f"dir_fd=os.open('{o}', os.O_RDONLY))\"; chmod 600 {o}/lnk; chmod 600 in-ws; exit 1"
    )
    (workspace / "in-ws").write_text("x")
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, command, workspace)
    # From the host: no inode outside changed, the one inside did.
    assert {p.name: os.lstat(p).st_ctime_ns for p in outside.iterdir()} == before
    assert (outside / "m").stat().st_mode & 0o777 == 0o644
    assert (workspace / "in-ws").stat().st_mode & 0o777 == 0o600
    seen = {(t, op) for t, op, reason in _seen(result) if reason == REASON_OUTSIDE_ROOTS}
    assert seen >= {
        (f"{o}/m", "chmod"),
        (f"{o}/o", "chown"),
        (f"{o}/at", "chmod"),
        (f"{o}/lnk", "chmod"),  # followed to its target, named as the command named it
    }, seen
    assert not any(t.endswith("in-ws") for t, _, _ in _seen(result))
    assert result.sandbox is not None and result.sandbox.denied


async def test_a_unix_socket_bound_outside_the_roots_is_seen_and_others_bind(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # Round 15: a bind refused with EROFS was no fact at all (nor a hint: the error is the
    # program's to print). Binds in the workspace, abstract ones and TCP ones go on.
    outside = tmp_path / "outside"
    outside.mkdir()
    script = (
        "import socket\n"
        f"for p in ({str(outside / 's.sock')!r}, 'in-ws.sock', '\\0rt-abstract'):\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try:\n"
        "        s.bind(p); print('bound', p[1:] if p[0] == '\\0' else p)\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
        "t = socket.socket(); t.bind(('127.0.0.1', 0)); print('tcp bound')\n"
    )
    (workspace / "b.py").write_text(script)
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, f"{PY} b.py; exit 1", workspace)
    assert result.stdout.text.split("\n")[:4] == [
        "refused 30",
        "bound in-ws.sock",
        "bound rt-abstract",
        "tcp bound",
    ], result.stdout.text
    assert not (outside / "s.sock").exists() and (workspace / "in-ws.sock").exists()
    seen = {(t, op) for t, op, reason in _seen(result) if reason == REASON_OUTSIDE_ROOTS}
    assert seen == {(str(outside / "s.sock"), "bind")}, _seen(result)
    assert not any(t.endswith("in-ws.sock") for t, _, _ in _seen(result))


_BIND_RAW = """
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def bind(data, length):
    s = socket.socket(socket.AF_UNIX)
    buf = ctypes.create_string_buffer(b"\\x01\\x00" + data, len(data) + 3)
    return 0 if libc.bind(s.fileno(), buf, length) == 0 else ctypes.get_errno()
os.makedirs("d1/d2/d3", exist_ok=True)
os.symlink("d1/d2/d3", "l")
os.symlink(sys.argv[1], "m")
print(bind(b"sockA/../../../../etc/named-by-memory", 2 + 5))
print(bind(b"l/../../../etc-sock\\0", 2 + 19))
print(libc.mkdir(b"l/../../../etc-dir", 0o755) == 0)
print(bind(b"m/../out.sock\\0", 2 + 14))
print(libc.mkdir(b"m/../out-dir", 0o755) == 0)
"""


async def test_a_path_is_judged_as_the_kernel_reads_it(
    make_executor: ExecutorFactory, workspace: Path, tmp_path: Path
) -> None:
    # Round 18: a bind's path read past the length the kernel takes, and `..` after a link
    # taken lexically: supervisor denials named `/etc/...` for calls that landed in the
    # workspace, and a refused call outside through `m/..` was no denial at all.
    outside = tmp_path / "outside" / "sub"
    outside.mkdir(parents=True)
    (workspace / "b.py").write_text(_BIND_RAW)
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, f"{PY} b.py {outside}; exit 1", workspace)
    assert result.stdout.text.split() == ["0", "0", "True", "30", "False"], result.stdout.text
    # `l/../../..` is the workspace (l is d1/d2/d3); lexically, two levels above it.
    assert (workspace / "sockA").exists() and (workspace / "etc-sock").exists()
    assert (workspace / "etc-dir").is_dir()
    assert not (outside.parent / "out.sock").exists() and not (outside.parent / "out-dir").exists()
    seen = {(t, op) for t, op, _ in _seen(result)}
    o = str(outside.parent)
    assert seen == {(f"{o}/out.sock", "bind"), (f"{o}/out-dir", "mkdir")}, seen


@pytest.mark.skipif(os.geteuid() == 0, reason="root's executor searches any directory")
async def test_an_unsearchable_workspace_leaks_nothing_into_the_executor(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    # Round 18: the command made the workspace unsearchable to the user's executor; each
    # removal of a placeholder then raised in the supervisor past the capture, whose two
    # descriptors (the command's root and mount namespace) leaked: to EMFILE, and every
    # later command failed.
    ex = make_executor(mode="workspace-write")
    await _run(ex, "true", workspace)
    before = len(os.listdir("/proc/self/fd"))
    command = (
        f"chmod 000 {workspace}; for i in $(seq 100); do rmdir {workspace}/.vscode;"
        f" rm -f {workspace}/.envrc; done 2>/dev/null; chmod 755 {workspace}; echo done"
    )
    result = await _run(ex, command, workspace)
    assert result.stdout.text == "done\n", result.stderr.text
    assert len(os.listdir("/proc/self/fd")) <= before + 2
    assert (await _run(ex, "echo next", workspace)).stdout.text == "next\n"


async def test_printed_refusals_and_allowed_writes_make_no_supervisor_denial(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor(mode="workspace-write")
    command = (
        "echo 'bash: /etc/x: Read-only file system' >&2; "
        "echo ok > in-ws.txt; mkdir -p d/e; mv in-ws.txt d/e/; rm -r d; "
        "echo t > /tmp/t; echo n > /dev/null; : > /dev/shm/s; exit 1"
    )
    result = await _run(ex, command, workspace)
    assert result.exit_code == 1
    assert _seen(result) == []


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
async def test_reads_execs_and_the_helpers_own_setup_are_not_denials(
    make_executor: ExecutorFactory, workspace: Path, mode: str
) -> None:
    (workspace / "f").write_text("x")
    ex = make_executor(mode=mode)
    result = await _run(ex, "cat f > /dev/null && /bin/true && ls / > /dev/null", workspace)
    assert result.exit_code == 0, result.stderr.text
    assert _seen(result) == []


def test_the_filter_traps_opens_only_with_a_write_flag() -> None:
    from bash_sandbox.linux.seccomp import render_notify_rules

    rules = render_notify_rules()
    opens = {r.args for r in rules if r.syscall == "openat"}
    # Every openat rule needs a write flag or a creating flag: O_RDONLY never traps.
    assert all(
        any(a.index == 2 and a.value in (0o1, 0o2, 0o100, 0o1000, 0o20000000) for a in args)
        for args in opens
    )
    trapped = {r.syscall for r in rules}
    assert not trapped & {"execve", "execveat", "read", "stat", "newfstatat", "statx"}
    assert {"mkdirat", "unlinkat", "renameat2", "symlinkat", "linkat", "truncate"} <= trapped


def test_only_paths_the_view_surely_allows_skip_the_judge() -> None:
    from bash_sandbox.linux.write_watch import WritePolicy

    policy = WritePolicy(
        read_only=False,
        roots=("/tmp/t/ws", "/srv/extra"),
        protected=(".git/hooks", ".git/config"),
        hidden=("/srv/extra/secret",),
    )
    sure = ("/tmp/t/ws/build/a.o", "/srv/extra/x", "/tmp/other/f", "/dev/null", "/dev/shm/s")
    judged = (
        "/tmp/t/ws/.git/config",
        "/tmp/t/ws/.git/index.lock",
        "/tmp/t/ws/sub/.git/HEAD",
        "/tmp/t/x",  # the host /tmp entry bound back for the root: read-only
        "/srv/extra/secret/k",
        "/etc/passwd",
        "/tmp",
    )
    assert all(policy.surely_writable(p) for p in sure)
    assert not any(policy.surely_writable(p) for p in judged)
    read_only = WritePolicy(read_only=True, roots=("/tmp/t/ws",))
    assert not read_only.surely_writable("/tmp/t/ws/a")
    assert read_only.surely_writable("/tmp/scratch")


def test_operations_are_named_as_users_know_them() -> None:
    from bash_sandbox.linux.file_calls import MODE_CALLS, WRITE_CALLS
    from bash_sandbox.linux.write_watch import operation_name

    names = {c.name: operation_name(c) for c in MODE_CALLS + WRITE_CALLS if c.write}
    assert names["openat"] == names["creat"] == names["open"] == "open"
    assert names["mkdirat"] == "mkdir" and names["unlinkat"] == "unlink"
    assert names["renameat2"] == names["renameat"] == "rename"
    assert names["symlinkat"] == "symlink" and names["linkat"] == "link"
    assert names["mknodat"] == "mknod" and names["truncate"] == "truncate"
    assert names["fchmodat"] == names["chmod"] == "chmod"
    assert names["fchownat"] == names["lchown"] == "chown"


async def test_landlock_alone_refusals_are_seen_by_its_rules(tmp_path: Path) -> None:
    """Without a mount namespace Landlock refuses (EACCES), no mount is read-only: the
    judge compares the path with the roots and the private TMPDIR instead."""
    from bash_sandbox.backends.landlock_only import LandlockOnlyBackend
    from bash_sandbox.selection import Candidates
    from tests.sandbox.conftest import require_backend

    require_backend("landlock")
    backend = LandlockOnlyBackend()
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    async with SandboxBashExecutor(
        backend="landlock", mode="workspace-write", workspace_root=str(ws)
    ) as ex:
        ex._selector._candidates = Candidates((backend,))  # as on a host without namespaces
        command = (
            f'echo in > sub/in.txt; echo t > "$TMPDIR/t"; mkdir {outside}/made; '
            f"cd sub && echo out > {outside}/o"
        )
        result = await _run(ex, command, ws)
    assert (ws / "sub" / "in.txt").read_text() == "in\n"
    assert list(outside.iterdir()) == []
    assert result.sandbox is not None and result.sandbox.backend == "landlock"
    assert sorted(_seen(result)) == [
        (str(outside / "made"), "mkdir", REASON_OUTSIDE_ROOTS),
        (str(outside / "o"), "open", REASON_OUTSIDE_ROOTS),
    ]


async def test_a_write_judged_after_the_command_is_gone_is_judged_in_its_view(
    make_executor: ExecutorFactory, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The judge runs after the call continues, so on a loaded machine the command may have
    exited, and its mount namespace gone, first. Judged in what was left of that view (the
    root alone, every mount below it detached), an allowed write inside the `.git` overlay
    was a refused one on the read-only host tree (found in CI: `git branch --track`). Here
    the judging of one such write waits until the run is over."""
    import bash_sandbox.linux.supervisor as supervisor

    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    real_judge = supervisor.judge
    deferred: list[tuple[Any, Any]] = []

    def later(captured: Any, watch: Any) -> Any:
        if captured.paths[0].endswith("/.git/made") and not deferred:
            deferred.append((captured, watch))
            return None
        return real_judge(captured, watch)

    monkeypatch.setattr(supervisor, "judge", later)
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, ": > .git/made", workspace)
    assert result.exit_code == 0, result.stderr.text
    assert len(deferred) == 1
    pid = deferred[0][0].pid
    for _ in range(500):  # the command and its namespace's last process are gone (<= 5 s)
        if not os.path.exists(f"/proc/{pid}"):
            break
        await asyncio.sleep(0.01)
    assert not os.path.exists(f"/proc/{pid}")
    assert real_judge(*deferred[0]) is None
