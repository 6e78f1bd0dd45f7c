"""The hints' rules on lines the corpus does not hold: backends, scratch dirs, modes, and
that printed text never makes a denial."""

from __future__ import annotations

import pytest

from bash_sandbox.facts import find_refusal_messages, infer_file_hints
from bash_seam import DenialKind, HintSource, SandboxHint
from policies import SandboxPolicy

WS = "/srv/ws"


def _policy(mode: str = "workspace-write", **kw: object) -> SandboxPolicy:
    kw.setdefault("deny_read", ("/home/u/.ssh",))
    return SandboxPolicy.model_validate({"mode": mode, "workspace_root": WS, **kw})


def _targets(stderr: str, stdout: str = "", **kw: object) -> list[tuple[str, str, str]]:
    policy = kw.pop("policy", None) or _policy()
    found = infer_file_hints(stdout, stderr, policy=policy, workdir=WS, **kw)  # type: ignore[arg-type]
    # A relative path stays as printed (the tool's directory is unknown): shown with "./".
    return [(d.kind.value, f"./{d.target}" if d.relative else d.target, d.reason) for d in found]


def test_output_makes_hints_from_the_output_never_denials() -> None:
    found = infer_file_hints(
        "", "touch: cannot touch '/opt/x': Read-only file system", policy=_policy(), workdir=WS
    )
    assert found == [
        SandboxHint(
            kind=DenialKind.FILE_WRITE,
            target="/opt/x",
            reason="outside the writable roots",
            source=HintSource.OUTPUT,
        )
    ]


def test_a_relative_path_is_shown_as_printed_not_resolved_against_the_start() -> None:
    # `cd sub && echo x > rel.txt`: bash prints "rel.txt", written in WS/sub; joining it to
    # the starting directory would name WS/rel.txt, a file nobody wrote.
    (hint,) = infer_file_hints(
        "", "bash: line 1: rel.txt: Read-only file system", policy=_policy("read-only"), workdir=WS
    )
    assert (hint.target, hint.relative, hint.reason) == ("rel.txt", True, "read-only mode")
    # git submodule add names ".git/config" relative to the submodule it works in.
    (hint,) = infer_file_hints(
        "",
        "error: could not write config file .git/config: Device or resource busy",
        policy=_policy(protected_paths=(".git/config",)),
        workdir=WS,
    )
    assert (hint.target, hint.relative) == (".git/config", True)


def test_danger_full_access_hints_nothing() -> None:
    policy = _policy("danger-full-access")
    assert _targets("touch: cannot touch '/opt/x': Read-only file system", policy=policy) == []


def test_operation_less_eacces_counts_only_where_the_backend_refuses_writes_so() -> None:
    line = "/usr/bin/bash: line 1: /opt/out: Permission denied"
    assert _targets(line) == []  # bwrap answers refused writes with EROFS: this is Unix perms
    assert _targets(line, write_refusals=frozenset({"EROFS", "EACCES"})) == [
        ("file-write", "/opt/out", "outside the writable roots")
    ]
    # An explicit write operation is a write whatever the errno.
    assert _targets("mkdir: cannot create directory '/opt/d': Permission denied") == [
        ("file-write", "/opt/d", "outside the writable roots")
    ]


def test_scratch_dirs_follow_the_backend() -> None:
    line = "/usr/bin/bash: line 1: /tmp/x: Read-only file system"
    shm = "/usr/bin/bash: line 1: /dev/shm/x: Read-only file system"
    for mode in ("read-only", "workspace-write"):  # a private /tmp and /dev/shm in both
        assert _targets(f"{line}\n{shm}", policy=_policy(mode)) == []
    # The Landlock-only fallback keeps the host /tmp read-only and names its own TMPDIR.
    assert _targets(line, scratch_dirs=("/tmp/bash-sandbox-1/tmp",)) == [
        ("file-write", "/tmp/x", "outside the writable roots")
    ]
    # The host's /tmp entry holding a workspace is bound back read-only.
    under_tmp = SandboxPolicy(mode="workspace-write", workspace_root="/tmp/run1/ws", deny_read=())
    assert infer_file_hints(
        "",
        "touch: cannot touch '/tmp/run1/next-to-ws': Read-only file system\n"
        "touch: cannot touch '/tmp/other': Read-only file system",
        policy=under_tmp,
        workdir="/tmp/run1/ws",
    ) == [
        SandboxHint(
            kind=DenialKind.FILE_WRITE,
            target="/tmp/run1/next-to-ws",
            reason="outside the writable roots",
        )
    ]


def test_read_only_names_the_step_that_would_allow_the_write() -> None:
    policy = _policy("read-only", writable_roots=("/srv/cache",))
    assert _targets(
        "touch: cannot touch 'a': Read-only file system\n"
        "touch: cannot touch '/srv/cache/b': Read-only file system\n"
        "touch: cannot touch '/opt/c': Read-only file system",
        policy=policy,
    ) == [
        ("file-write", "./a", "read-only mode"),
        ("file-write", "/srv/cache/b", "read-only mode"),
        ("file-write", "/opt/c", "outside the writable roots"),
    ]


def test_protected_names_and_their_placeholders() -> None:
    assert _targets(
        "bash: line 1: .git/config: Is a directory\n"
        "touch: cannot touch '.git/hooks/x': No such file or directory\n"
        "error: could not write config file .git/config: Device or resource busy\n"
        "cat: .git/config: Is a directory\n"
    ) == [
        ("file-write", "./.git/config", "protected name .git/config"),
        ("file-write", "./.git/hooks/x", "protected name .git/hooks"),
    ]
    # Outside a protected name, these errnos are ordinary failures.
    assert _targets("touch: cannot touch 'src/x': No such file or directory") == []
    assert _targets("bash: line 1: build: Is a directory") == []


def test_deny_read_is_reported_as_a_read_unless_the_wording_says_write() -> None:
    assert _targets(
        "cat: /home/u/.ssh/id_rsa: Permission denied\n"
        "cp: cannot create regular file '/home/u/.ssh/known': Permission denied"
    ) == [
        ("file-read", "/home/u/.ssh/id_rsa", "deny_read"),
        ("file-write", "/home/u/.ssh/known", "deny_read"),
    ]
    # Missing is not refused.
    assert _targets("cat: /home/u/.ssh/nope: No such file or directory") == []


def test_device_sinks_are_never_denials() -> None:
    assert _targets("bash: line 1: /dev/null: Read-only file system") == []


def test_each_refusal_once_stderr_first_and_both_streams_read() -> None:
    found = _targets(
        "touch: cannot touch '/opt/a': Read-only file system\n" * 3,
        "E   OSError: [Errno 30] Read-only file system: '/opt/b'\n"
        "FAILED t.py::t - OSError: [Errno 30] Read-only file system: '/opt/a'",
    )
    assert [t for _, t, _ in found] == ["/opt/a", "/opt/b"]


@pytest.mark.parametrize(
    "line",
    [
        "Permission denied",
        "PermissionError: [Errno 13] Permission denied",
        "error: unable to create temporary file: Read-only file system",
        "npm error code EROFS",
        "  code: 'EROFS',",
        "curl: (23) Failure writing output to destination",
        "ConnectionRefusedError: [Errno 111] Connection refused",
    ],
)
def test_messages_without_a_path_yield_nothing(line: str) -> None:
    assert find_refusal_messages(line) == []
    assert _targets(line, policy=_policy("read-only")) == []


def test_relative_and_home_paths_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/u")
    assert _targets(
        "mkdir: cannot create directory '../sibling': Read-only file system\n"
        "tee: ~/.ssh/config: Permission denied"
    ) == [
        ("file-write", "./../sibling", "outside the writable roots"),
        ("file-read", "/home/u/.ssh/config", "deny_read"),
    ]


def _push_report(url: str) -> str:
    return (
        "error: remote unpack failed: unable to create temporary object directory\n"
        f"To {url}\n"
        " ! [remote rejected] HEAD -> main (unpacker error)\n"
        f"error: failed to push some refs to '{url}'\n"
    )


def test_a_push_to_a_local_repository_outside_the_roots_is_a_write_denial() -> None:
    # receive-pack names neither an errno nor a path: the repository is the "To" URL.
    for url in ("/srv/remote.git", "file:///srv/remote.git"):
        assert _targets(_push_report(url)) == [
            ("file-write", "/srv/remote.git", "outside the writable roots")
        ]
    assert _targets(_push_report("../remote.git")) == [
        ("file-write", "./../remote.git", "outside the writable roots")
    ]
    # Inside the workspace it is git's own failure under workspace-write...
    assert _targets(_push_report(f"{WS}/remote.git")) == []
    # ...and read-only mode's under read-only.
    assert _targets(_push_report(f"{WS}/remote.git"), policy=_policy("read-only")) == [
        ("file-write", f"{WS}/remote.git", "read-only mode")
    ]
    # Network remotes are the supervisor's business, and a report without the unpack
    # error (a non-fast-forward) is no refusal at all.
    for url in ("git@example.com:o/r.git", "https://example.com/o/r.git", "ssh://h/r.git"):
        assert _targets(_push_report(url)) == []
    rejected = " ! [rejected] main -> main (non-fast-forward)\n"
    assert _targets(f"To /srv/remote.git\n{rejected}error: failed to push some refs to '/x'") == []


def test_an_errno_name_inside_a_path_is_no_errno() -> None:
    # Node repeats the path on a `path:` line; a directory named after an errno is a path.
    stderr = (
        "Error: EROFS: read-only file system, open '/opt/ww-erofs-case/n.txt'\n"
        "  code: 'EROFS',\n"
        "  path: '/opt/ww-erofs-case/n.txt'\n"
        "cat: /opt/eacces.d/ENOENT-x: Is a file\n"
    )
    assert _targets(stderr) == [
        ("file-write", "/opt/ww-erofs-case/n.txt", "outside the writable roots")
    ]
    assert find_refusal_messages("ls: /srv/EACCES/x: done\nsee /tmp/erofs.log") == []
