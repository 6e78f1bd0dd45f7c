"""Issue 22 item 1, threat-model row 19: no set-id bit and no file capability a confined
command sets ever reaches the host.

Each attack runs for real on both Linux backends; the verdict is the host's own view of the
file afterwards (`os.stat`, `os.getxattr` from the test process, outside the sandbox), then
the fact the supervisor recorded. The workflows that must keep working run the same way.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tarfile
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_sandbox.linux.setid import REASON_FILE_CAPS, REASON_SETID, REASON_XATTR
from bash_seam import BashExecRequest, BashRunResult, DenialEvidence, DenialKind
from tests.sandbox.conftest import ExecutorFactory

PY = os.path.realpath(sys.executable)
SETID = stat.S_ISUID | stat.S_ISGID


async def _run(ex: SandboxBashExecutor, command: str, workdir: Path) -> BashRunResult:
    return await ex.run(ex.resolve(BashExecRequest(command=command, workdir=str(workdir))))


def _host_setid(path: Path) -> int:
    """The set-id bits the host sees on ``path`` (0 when it does not exist)."""
    try:
        return os.lstat(path).st_mode & SETID
    except FileNotFoundError:
        return 0


def _refusals(result: BashRunResult, reason: str) -> list[tuple[str, str]]:
    assert result.sandbox is not None
    return [
        (d.target, d.operation or "")
        for d in result.sandbox.denials
        if d.reason == reason
        and d.kind is DenialKind.FILE_WRITE
        and d.evidence is DenialEvidence.SUPERVISOR
    ]


def _system_setuid_file() -> str:
    for path in ("/usr/bin/su", "/usr/bin/passwd", "/usr/bin/mount", "/bin/su"):
        with_bits = os.path.exists(path) and os.stat(path).st_mode & stat.S_ISUID
        if with_bits and os.access(path, os.R_OK):
            return path
    pytest.fail("no readable setuid binary on this host to copy")


ATTACKS = {
    "chmod-4755": ("cp /usr/bin/id f; chmod 4755 f", "f", "chmod"),
    "chmod-2755": ("cp /usr/bin/id f; chmod 2755 f", "f", "chmod"),
    "chmod-u+s": ("cp /usr/bin/id f; chmod u+s f", "f", "chmod"),
    "chmod-g+s": ("cp /usr/bin/id f; chmod g+s f", "f", "chmod"),
    "install-m": ("install -m 4755 /usr/bin/id f", "f", "chmod"),
    "cp-p": ("cp -p {setuid} f", "f", "chmod"),
    "python-open": (
        f"{PY} -c 'import os; os.open(\"f\", os.O_CREAT | os.O_WRONLY, 0o4755)'", "f", "open"
    ),
    "python-tmpfile": (
        f"{PY} -c 'import os; os.open(\".\", os.O_TMPFILE | os.O_WRONLY, 0o2755)'", ".", "open"
    ),
    "mknod": (f"{PY} -c 'import os, stat; os.mknod(\"f\", stat.S_IFREG | 0o4755)'", "f", "mknod"),
    "mkdir-m": ("mkdir -m 2775 f", "f", "chmod"),
    "tar-xp": ("tar -xpf setid.tar", "f", "chmod"),
}  # fmt: skip


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_a_setid_bit_never_reaches_the_host(
    make_executor: ExecutorFactory, workspace: Path, attack: str
) -> None:
    command, name, operation = ATTACKS[attack]
    if attack == "tar-xp":
        source = workspace / "payload"
        source.write_bytes(Path("/usr/bin/id").read_bytes())
        with tarfile.open(workspace / "setid.tar", "w") as tar:
            info = tar.gettarinfo(str(source), arcname="f")
            info.mode = 0o4755
            with open(source, "rb") as fh:
                tar.addfile(info, fh)
        source.unlink()
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, command.format(setuid=_system_setuid_file()), workspace)

    target = workspace / name
    assert _host_setid(target) == 0, f"{attack}: {oct(os.lstat(target).st_mode)}"
    for child in workspace.rglob("*"):
        assert _host_setid(child) == 0, child
    refused = _refusals(result, REASON_SETID)
    if not refused and "failed to preserve ownership" in result.stderr.text:
        # Unprivileged under Landlock the copy's owner cannot be kept (EINVAL), and cp then
        # drops the set-id bits itself: no set-id call was made, so none was refused. The
        # host check above is what must hold.
        return
    assert refused, (attack, result.stderr.text, result.sandbox)
    want = os.path.normpath(str(target))
    assert any(t == want and operation in op for t, op in refused), refused
    # The command saw a refusal, not a silent success.
    assert result.exit_code != 0 or "not permitted" in result.stderr.text.lower()


async def test_mkdir_mode_bits_are_masked_by_the_kernel(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    """mkdir(2) ignores S_ISUID/S_ISGID in its mode; nothing traps, nothing arrives."""
    ex = make_executor(mode="workspace-write")
    script = "import os; os.mkdir('d', 0o6775); os.makedirs('e/f', 0o2775)"
    result = await _run(ex, f'{PY} -c "{script}"', workspace)
    assert result.exit_code == 0, result.stderr.text
    for path in (workspace / "d", workspace / "e", workspace / "e" / "f"):
        assert path.is_dir() and _host_setid(path) == 0
    assert _refusals(result, REASON_SETID) == []


CAP = "b'\\x01\\x00\\x00\\x02\\x00\\x20\\x00\\x00' + bytes(12)"  # v2, cap_net_raw permitted


@pytest.mark.parametrize("how", ["setxattr", "fsetxattr", "setcap"])
async def test_a_file_capability_never_reaches_the_host(
    make_executor: ExecutorFactory, workspace: Path, how: str
) -> None:
    target = workspace / "f"
    target.write_bytes(Path("/usr/bin/id").read_bytes())
    target.chmod(0o755)
    commands = {
        "setxattr": f"{PY} -c \"import os; os.setxattr('f', 'security.capability', {CAP})\"",
        "fsetxattr": (
            f"{PY} -c \"import os; fd = os.open('f', os.O_RDONLY); "
            f"os.setxattr(fd, 'security.capability', {CAP})\""
        ),
        "setcap": "setcap cap_net_raw+ep f",
    }
    if how == "setcap" and not any(
        os.path.exists(os.path.join(d, "setcap")) for d in ("/usr/sbin", "/sbin", "/usr/bin")
    ):
        pytest.skip("setcap is not installed")
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, commands[how], workspace)

    with pytest.raises(OSError) as caught:
        os.getxattr(target, "security.capability")
    assert caught.value.errno == errno.ENODATA
    assert result.exit_code != 0
    refused = _refusals(result, REASON_FILE_CAPS)
    if how == "setcap":
        # setcap raises CAP_SETFCAP first; with an empty bounding set it stops before setxattr.
        assert "CAP_SETFCAP" in result.stderr.text or refused, result.stderr.text
        return
    assert [t for t, op in refused if op.endswith("setxattr security.capability")] == [
        str(target)
    ], refused


async def test_openat2_is_answered_enosys(make_executor: ExecutorFactory, workspace: Path) -> None:
    """openat2 keeps its mode in memory BPF cannot read: callers get ENOSYS and fall back."""
    script = (
        "import ctypes, os, struct\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "how = struct.pack('QQQ', os.O_CREAT | os.O_WRONLY, 0o4755, 0)\n"
        "rc = libc.syscall(437, -100, b'f', how, len(how))\n"
        "print(rc, ctypes.get_errno())\n"
    )
    (workspace / "o2.py").write_text(script)
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, f"{PY} o2.py", workspace)
    assert result.stdout.text.split() == ["-1", str(errno.ENOSYS)], result.stderr.text
    assert not (workspace / "f").exists()


async def test_ordinary_modes_and_copies_keep_working(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    src = workspace / "src"
    src.mkdir()
    (src / "tool").write_text("#!/bin/sh\necho tool\n")
    (src / "tool").chmod(0o750)
    (src / "data").write_text("d")
    (src / "data").chmod(0o640)
    with tarfile.open(workspace / "plain.tar", "w") as tar:
        tar.add(str(src), arcname="unpacked")
    (workspace / "own.txt").write_text("x")
    os.setxattr(workspace / "own.txt", "user.origin", b"host")
    ex = make_executor(mode="workspace-write")
    command = (
        # Modes are what this is about: ownership is not kept (unprivileged under Landlock
        # the files' owner is not mapped in the command's user namespace: EINVAL).
        "set -e; echo 'echo hi' > s.sh; chmod +x s.sh; ./s.sh; chmod 755 s.sh; "
        "cp --preserve=mode,timestamps src/tool tool; cp --preserve=mode,timestamps src/data "
        "data; mkdir -p out; tar -xpf plain.tar --no-same-owner -C out; "
        "chmod -R u+rwX,go+rX out; cp -a --no-preserve=ownership src copy; "
        "install -m 0755 src/tool bin-tool; "
        # A file with an xattr copied as tools copy: the attribute refused, the copy made.
        f"{PY} -c \"import shutil; shutil.copy2('own.txt', 'own-copy.txt')\"; "
        "cp -a own.txt own-cp.txt"
    )
    result = await _run(ex, command, workspace)
    assert result.exit_code == 0, result.stderr.text
    assert result.stdout.text.strip() == "hi"
    assert stat.S_IMODE(os.stat(workspace / "s.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(workspace / "tool").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(workspace / "data").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(workspace / "out/unpacked/tool").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(workspace / "copy/data").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(workspace / "bin-tool").st_mode) == 0o755
    assert (workspace / "own-copy.txt").read_text() == (workspace / "own-cp.txt").read_text()
    assert result.sandbox is not None
    assert result.sandbox.denials == ()  # the copies worked: nothing asks to widen the mode


def test_the_syscall_numbers_match_libseccomp() -> None:
    import pyseccomp

    from bash_sandbox.linux.file_calls import MODE_CALLS, XATTR_CALLS, syscall_numbers

    for machine, arch in (("x86_64", pyseccomp.Arch.X86_64), ("aarch64", pyseccomp.Arch.AARCH64)):
        table = syscall_numbers(machine)
        for call in MODE_CALLS + XATTR_CALLS:
            known = pyseccomp.resolve_syscall(arch, call.name)
            if known >= 0:
                assert table.get(call.name) == known, (machine, call.name)
            elif call.name in ("setxattrat",):
                assert table[call.name] == 463
            else:
                assert call.name not in table, (machine, call.name)  # no such call there


def test_the_filter_traps_only_setid_modes() -> None:
    from bash_sandbox.linux.seccomp import render_notify_rules

    chmod = [r for r in render_notify_rules(watch_writes=False) if r.syscall == "fchmodat"]
    assert [(a.index, a.value, a.mask) for r in chmod for a in r.args] == [
        (2, 0o4000, 0o4000),
        (2, 0o2000, 0o2000),
    ]
    opens = [r for r in render_notify_rules(watch_writes=False) if r.syscall == "openat"]
    assert {tuple((a.index, a.value) for a in r.args) for r in opens} == {
        ((2, 0o100), (3, 0o4000)),
        ((2, 0o100), (3, 0o2000)),
        ((2, 0o20000000), (3, 0o4000)),
        ((2, 0o20000000), (3, 0o2000)),
    }


async def test_a_host_setid_file_is_never_linked_into_a_root(
    make_executor: ExecutorFactory, workspace: Path
) -> None:
    ex = make_executor(mode="workspace-write")
    result = await _run(ex, f"ln {_system_setuid_file()} f", workspace)
    assert result.exit_code != 0
    assert not (workspace / "f").exists()


# A default ACL of `user::rwx group::rwx other::rwx` (acl_ea_header v2, three entries).
_ACL = (
    "bytes([2,0,0,0, 1,0,7,0,255,255,255,255, 4,0,7,0,255,255,255,255, 32,0,7,0,255,255,255,255])"
)


@pytest.mark.parametrize(
    "name", ["system.posix_acl_default", "system.posix_acl_access", "user.tag"]
)
async def test_no_acl_or_other_xattr_outlives_the_command(
    make_executor: ExecutorFactory, workspace: Path, name: str
) -> None:
    # A default ACL left on a workspace directory overrode the host's umask for what the
    # host made there later: `git init` gave a world-writable `.git/config`, and another
    # local user's fsmonitor ran as root (red team). Every xattr write is refused: the name
    # is in the command's memory, which another thread can rewrite after it is judged.
    ex = make_executor(mode="workspace-write")
    (workspace / "d").mkdir()
    result = await _run(ex, f"{PY} -c \"import os; os.setxattr('d', '{name}', {_ACL})\"", workspace)
    assert result.exit_code != 0
    with pytest.raises(OSError) as caught:
        os.getxattr(workspace / "d", name)
    assert caught.value.errno == errno.ENODATA
    # The host's own files there keep the umask's mode.
    old = os.umask(0o022)
    try:
        (workspace / "d" / "config").write_text("[core]\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(workspace / "d" / "config").st_mode) == 0o644
    # Refused all the same, an access ACL is how coreutils sets any mode, and `user.*`
    # attributes ride along with copies: neither is a denial.
    want = [] if name in ("system.posix_acl_access", "user.tag") else [f"setxattr {name}"]
    assert [op for _, op in _refusals(result, REASON_XATTR)] == want
