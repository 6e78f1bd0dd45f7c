"""Seatbelt backend: exact profile text, path escaping, argv shape, dialects, selection.

The renderer, escaping and selection tests run everywhere. Tests that spawn under
`/usr/bin/sandbox-exec` skip themselves off macOS; they check the host from outside the
sandbox (file absent, content unchanged, server saw nothing), not only the command's stderr.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from bash_local.spawn import SpawnPlan
from bash_sandbox.backends import seatbelt
from bash_sandbox.backends.base import BackendContext
from bash_sandbox.backends.mount_plan import HostView, PlaceholderSources
from bash_sandbox.backends.seatbelt import (
    SANDBOX_EXEC,
    SeatbeltBackend,
    SeatbeltProfile,
    render_seatbelt_profile,
    seatbelt_argv,
    seatbelt_supported,
    user_temp_dir_from,
)
from bash_sandbox.errors import SandboxUnavailableError
from bash_sandbox.selection import BackendSelector, candidate_backends
from policies import NetworkMode, SandboxEnforcement, SandboxMode, SandboxPolicy

macos_only = pytest.mark.skipif(sys.platform != "darwin", reason="needs macOS sandbox-exec")

USER_TEMP = "/private/var/folders/ab/T"

BASE = """\
(version 1)

; Closed by default: anything not allowed below fails with EPERM.
(deny default)

; Processes: exec and fork freely (children inherit this sandbox); signal and
; inspect only processes of this sandbox.
(allow process-exec)
(allow process-fork)
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))

; Platform lookups a shell and common tools need: user names, the temp dir,
; preferences, sysctl reads, POSIX semaphores (Python multiprocessing).
(allow sysctl-read)
(allow user-preference-read)
(allow mach-lookup
  (global-name "com.apple.system.opendirectoryd.libinfo")
  (global-name "com.apple.system.opendirectoryd.membership")
  (global-name "com.apple.bsd.dirhelper")
  (global-name "com.apple.cfprefsd.daemon")
  (global-name "com.apple.cfprefsd.agent")
  (global-name "com.apple.system.notification_center")
  (global-name "com.apple.system.logger")
  (local-name "com.apple.cfprefsd.agent"))
(allow ipc-posix-shm-read* (ipc-posix-name-prefix "apple.cfprefs."))
(allow ipc-posix-sem)
(allow system-socket (socket-domain AF_UNIX))

; Reads: the whole filesystem; deny_read is taken away below.
(allow file-read*)

; Writes: the tty-less sinks a shell needs.
(allow file-write-data
  (literal "/dev/null")
  (regex #"^/dev/fd/[0-9]+$"))

"""

NO_NETWORK = """\
; Network: none. There is no loopback of the sandbox's own to allow: 127.0.0.1
; here is the host's, with the host's services listening on it.
"""


def _policy(mode: str = "read-only", **kw: object) -> SandboxPolicy:
    values: dict[str, object] = {"workspace_root": "/Users/me/proj", "deny_read": ()}
    values.update(kw)
    return SandboxPolicy(mode=SandboxMode(mode), **values)


def _ctx(tmp_path: Path, **kw: object) -> BackendContext:
    sources = PlaceholderSources(
        empty_dir="/nonexistent/e", deny_dir="/nonexistent/d", deny_file="/nonexistent/f"
    )
    return BackendContext(sources=sources, **kw)  # type: ignore[arg-type]


def _plan(cwd: str, script: str = "true") -> SpawnPlan:
    return SpawnPlan(argv=("/bin/bash", "-c", script), env={"PATH": "/usr/bin:/bin"}, cwd=cwd)


# -- exact profile text ------------------------------------------------------------------


def test_read_only_isolated_profile_is_exact() -> None:
    policy = _policy(deny_read=("/Users/me/.ssh", "/Users/me/.aws"))

    profile = render_seatbelt_profile(policy, user_temp_dir=USER_TEMP)

    assert (
        profile.text
        == BASE
        + """\
; Secrets: neither read nor written, wherever they sit.
(deny file-read* file-write*
  (literal (param "DENY_READ_0"))
  (subpath (param "DENY_READ_0"))
  (literal (param "DENY_READ_1"))
  (subpath (param "DENY_READ_1")))

"""
        + NO_NETWORK
    )
    # read-only: no writable root, not even the temp dirs.
    assert profile.params == (
        ("DENY_READ_0", "/Users/me/.ssh"),
        ("DENY_READ_1", "/Users/me/.aws"),
    )


def test_workspace_write_isolated_profile_is_exact() -> None:
    policy = _policy(
        "workspace-write",
        writable_roots=("/Users/me/cache",),
        protected_paths=(".git/hooks", ".envrc"),
        deny_read=("/Users/me/.ssh",),
    )

    profile = render_seatbelt_profile(policy, user_temp_dir=USER_TEMP)

    assert (
        profile.text
        == BASE
        + """\
; Writes: the writable roots (workspace, extra roots, temp dirs).
(allow file-write*
  (subpath (param "WRITABLE_ROOT_0"))
  (subpath (param "WRITABLE_ROOT_1"))
  (subpath (param "WRITABLE_ROOT_2"))
  (subpath (param "WRITABLE_ROOT_3")))

; No set-user-id or set-group-id bit, wherever the command may write.
(deny file-write-setugid)

; Protected names stay read-only inside every writable root, existing or
; not, and the directory entries leading to them cannot be created, moved
; or replaced; after the allows, because the last matching rule wins.
(deny file-write*
  (literal (param "PROTECTED_0"))
  (subpath (param "PROTECTED_0"))
  (literal (param "PROTECTED_1"))
  (subpath (param "PROTECTED_1"))
  (literal (param "PROTECTED_2"))
  (subpath (param "PROTECTED_2"))
  (literal (param "PROTECTED_3"))
  (subpath (param "PROTECTED_3"))
  (literal (param "PROTECTED_4"))
  (subpath (param "PROTECTED_4"))
  (literal (param "PROTECTED_5"))
  (subpath (param "PROTECTED_5"))
  (literal (param "PROTECTED_6"))
  (subpath (param "PROTECTED_6"))
  (literal (param "PROTECTED_7"))
  (subpath (param "PROTECTED_7"))
  (literal (param "PROTECTED_PARENT_0"))
  (literal (param "PROTECTED_PARENT_1"))
  (literal (param "PROTECTED_PARENT_2"))
  (literal (param "PROTECTED_PARENT_3")))

; Secrets: neither read nor written, wherever they sit.
(deny file-read* file-write*
  (literal (param "DENY_READ_0"))
  (subpath (param "DENY_READ_0")))

; No renaming or deleting the directories above a protected or secret
; path: moving one away would sidestep the path rules above.
(deny file-write-unlink
  (literal (param "GUARDED_ANCESTOR_0"))
  (literal (param "GUARDED_ANCESTOR_1"))
  (literal (param "GUARDED_ANCESTOR_2"))
  (literal (param "GUARDED_ANCESTOR_3"))
  (literal (param "GUARDED_ANCESTOR_4"))
  (literal (param "GUARDED_ANCESTOR_5"))
  (literal (param "GUARDED_ANCESTOR_6"))
  (literal (param "GUARDED_ANCESTOR_7"))
  (literal (param "GUARDED_ANCESTOR_8"))
  (literal (param "GUARDED_ANCESTOR_9")))

"""
        + NO_NETWORK
        + """
; Unix sockets: bind and connect only under the workspace and extra roots.
(allow network-bind
  (local unix-socket (subpath (param "WRITABLE_ROOT_0")))
  (local unix-socket (subpath (param "WRITABLE_ROOT_1"))))
(allow network-outbound
  (remote unix-socket (subpath (param "WRITABLE_ROOT_0")))
  (remote unix-socket (subpath (param "WRITABLE_ROOT_1"))))
"""
    )
    assert profile.params == (
        ("WRITABLE_ROOT_0", "/Users/me/proj"),
        ("WRITABLE_ROOT_1", "/Users/me/cache"),
        ("WRITABLE_ROOT_2", "/private/tmp"),
        ("WRITABLE_ROOT_3", USER_TEMP),
        # Every protected name under every writable root, whether it exists or not.
        ("PROTECTED_0", "/Users/me/proj/.git/hooks"),
        ("PROTECTED_1", "/Users/me/proj/.envrc"),
        ("PROTECTED_2", "/Users/me/cache/.git/hooks"),
        ("PROTECTED_3", "/Users/me/cache/.envrc"),
        ("PROTECTED_4", "/private/tmp/.git/hooks"),
        ("PROTECTED_5", "/private/tmp/.envrc"),
        ("PROTECTED_6", f"{USER_TEMP}/.git/hooks"),
        ("PROTECTED_7", f"{USER_TEMP}/.envrc"),
        ("PROTECTED_PARENT_0", "/Users/me/proj/.git"),
        ("PROTECTED_PARENT_1", "/Users/me/cache/.git"),
        ("PROTECTED_PARENT_2", "/private/tmp/.git"),
        ("PROTECTED_PARENT_3", f"{USER_TEMP}/.git"),
        ("DENY_READ_0", "/Users/me/.ssh"),
        ("GUARDED_ANCESTOR_0", "/Users/me/proj"),
        ("GUARDED_ANCESTOR_1", "/Users/me"),
        ("GUARDED_ANCESTOR_2", "/Users"),
        ("GUARDED_ANCESTOR_3", "/Users/me/cache"),
        ("GUARDED_ANCESTOR_4", "/private/tmp"),
        ("GUARDED_ANCESTOR_5", "/private"),
        ("GUARDED_ANCESTOR_6", USER_TEMP),
        ("GUARDED_ANCESTOR_7", "/private/var/folders/ab"),
        ("GUARDED_ANCESTOR_8", "/private/var/folders"),
        ("GUARDED_ANCESTOR_9", "/private/var"),
    )


def test_workspace_write_host_profile_is_exact() -> None:
    policy = _policy("workspace-write", network="host", protected_paths=())

    profile = render_seatbelt_profile(policy, user_temp_dir=None)

    assert (
        profile.text
        == BASE
        + """\
; Writes: the writable roots (workspace, extra roots, temp dirs).
(allow file-write*
  (subpath (param "WRITABLE_ROOT_0"))
  (subpath (param "WRITABLE_ROOT_1")))

; No set-user-id or set-group-id bit, wherever the command may write.
(deny file-write-setugid)

; Network: the host's IP network and its name resolution (mDNSResponder, configd).
(allow network-bind (local ip "*:*"))
(allow network-inbound (local ip "*:*"))
(allow network-outbound (remote ip "*:*"))
(allow network-outbound (literal "/private/var/run/mDNSResponder"))
(allow system-socket (require-all (socket-domain AF_SYSTEM) (socket-protocol 2)))
(allow mach-lookup
  (global-name "com.apple.SystemConfiguration.DNSConfiguration")
  (global-name "com.apple.SystemConfiguration.configd")
  (global-name "com.apple.networkd")
  (global-name "com.apple.trustd.agent")
  (global-name "com.apple.ocspd")
  (global-name "com.apple.SecurityServer"))

; Unix sockets: bind and connect only under the workspace and extra roots.
(allow network-bind
  (local unix-socket (subpath (param "WRITABLE_ROOT_0"))))
(allow network-outbound
  (remote unix-socket (subpath (param "WRITABLE_ROOT_0"))))
"""
    )
    assert profile.params == (
        ("WRITABLE_ROOT_0", "/Users/me/proj"),
        ("WRITABLE_ROOT_1", "/private/tmp"),
    )


def test_isolated_loopback_option_allows_only_localhost() -> None:
    profile = render_seatbelt_profile(_policy(), user_temp_dir=None, allow_loopback=True)

    assert (
        profile.text
        == BASE
        + """\
; Network: loopback only. This is the host's loopback, so host services
; listening on it are reachable too (the network layer is partial).
(allow network-bind (local ip "localhost:*"))
(allow network-inbound (local ip "localhost:*"))
(allow network-outbound (remote ip "localhost:*"))
"""
    )


def test_isolated_profile_has_no_ip_rule_and_host_profile_has_no_localhost_only_rule() -> None:
    isolated = render_seatbelt_profile(_policy("workspace-write"), user_temp_dir=None).text
    host = render_seatbelt_profile(_policy(network="host"), user_temp_dir=None).text

    assert "(local ip" not in isolated and "(remote ip" not in isolated
    assert '(remote ip "*:*")' in host and "localhost" not in host


def test_narrowing_rules_come_after_the_grants_they_narrow() -> None:
    text = render_seatbelt_profile(
        _policy("workspace-write", deny_read=("/Users/me/.ssh",)), user_temp_dir=USER_TEMP
    ).text

    assert text.index("(allow file-write*") < text.index("(deny file-write*")
    assert text.index("(allow file-read*)") < text.index("(deny file-read* file-write*")
    assert text.index("(deny file-write*") < text.index("(deny file-write-unlink")


def test_private_tmp_and_hidden_paths_and_aliases_become_params() -> None:
    policy = _policy(
        "workspace-write", protected_paths=(".git/hooks",), deny_read=("/Users/me/.ssh",)
    )

    profile = render_seatbelt_profile(
        policy,
        user_temp_dir=None,
        private_tmp="/Users/me/.state/tmp",
        extra_deny_read=("/Users/me/.state/spill",),
        protected_aliases=("/Users/me/proj/realgit/hooks",),
    )

    params = dict(profile.params)
    assert params["WRITABLE_ROOT_1"] == "/Users/me/.state/tmp"
    assert params["DENY_READ_1"] == "/Users/me/.state/spill"
    assert "/Users/me/proj/realgit/hooks" in params.values()


def test_duplicate_roots_are_rendered_once() -> None:
    policy = _policy("workspace-write", writable_roots=("/Users/me/proj", "/private/tmp"))

    profile = render_seatbelt_profile(
        policy, user_temp_dir="/private/tmp/", private_tmp="/Users/me/proj"
    )

    roots = [v for k, v in profile.params if k.startswith("WRITABLE_ROOT_")]
    assert roots == ["/Users/me/proj", "/private/tmp"]


def test_read_only_renders_no_write_rule_even_with_aliases() -> None:
    profile = render_seatbelt_profile(
        _policy(),
        user_temp_dir=USER_TEMP,
        private_tmp="/x/tmp",
        protected_aliases=("/Users/me/proj/realgit/hooks",),
    )

    assert "file-write*" not in profile.text
    assert profile.params == ()


def test_danger_full_access_has_no_profile() -> None:
    with pytest.raises(ValueError, match="unconfined"):
        render_seatbelt_profile(_policy("danger-full-access"), user_temp_dir=None)


# -- escaping ----------------------------------------------------------------------------

HOSTILE = [
    'quote"name',
    "back\\slash",
    "new\nline",
    "paren)(allow default)(deny",
    '")(allow file-write* (subpath "/"))(deny file-read* (literal "',
    '#"^/',
    "semi; comment",
    "-D EVIL=1",
]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_paths_leave_the_profile_text_unchanged(hostile: str) -> None:
    def render(part: str) -> SeatbeltProfile:
        policy = _policy(
            "workspace-write",
            workspace_root=f"/Users/me/{part}",
            writable_roots=(f"/Users/me/x{part}",),
            protected_paths=(f"{part}name",),
            # In a directory's name: a `*` in the last name is a pattern, refused.
            deny_read=(f"/Users/me/d{part}/secret",),
        )
        return render_seatbelt_profile(policy, user_temp_dir=f"/private/var/folders/{part}")

    # Same shape (depth) as the hostile name, nothing but plain letters.
    benign, evil = render(re.sub(r"[^/]", "x", hostile)), render(hostile)

    assert evil.text == benign.text
    assert [k for k, _ in evil.params] == [k for k, _ in benign.params]
    assert ("WRITABLE_ROOT_0", os.path.realpath(f"/Users/me/{hostile}")) in evil.params


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_path_reaches_sandbox_exec_as_one_param_value(hostile: str) -> None:
    policy = _policy("workspace-write", workspace_root=f"/Users/me/{hostile}")
    profile = render_seatbelt_profile(policy, user_temp_dir=None)

    argv = seatbelt_argv(profile, ("/bin/bash", "-c", "true"))

    i = argv.index(f"WRITABLE_ROOT_0={os.path.realpath(f'/Users/me/{hostile}')}")
    assert argv[i - 1] == "-D"
    assert argv[2] == profile.text


def test_profile_text_never_contains_a_policy_path() -> None:
    policy = _policy(
        "workspace-write", writable_roots=("/Users/me/cache",), deny_read=("/Users/me/.ssh",)
    )

    text = render_seatbelt_profile(policy, user_temp_dir=USER_TEMP).text

    for _, value in render_seatbelt_profile(policy, user_temp_dir=USER_TEMP).params:
        assert value not in text


@pytest.mark.parametrize(
    "field",
    [
        {"workspace_root": "/Users/me/a\x00b"},
        {"writable_roots": ("/Users/me/a\x00b",)},
        {"deny_read": ("/Users/me/a\x00b",)},
        {"protected_paths": ("a\x00b",)},
    ],
)
def test_nul_in_a_policy_path_is_rejected_by_the_model(field: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match=r"NUL|absolute|relative"):
        _policy("workspace-write", **field)


def test_nul_that_bypassed_the_model_is_rejected_by_the_renderer() -> None:
    forged = SandboxPolicy.model_construct(
        mode=SandboxMode.WORKSPACE_WRITE,
        workspace_root="/Users/me/a\x00b",
        network=NetworkMode.ISOLATED,
        writable_roots=(),
        protected_paths=(),
        deny_read=(),
    )

    with pytest.raises(ValueError, match="NUL"):
        render_seatbelt_profile(forged, user_temp_dir=None)
    with pytest.raises(ValueError, match="NUL"):
        render_seatbelt_profile(_policy("workspace-write"), user_temp_dir="/private/var/f\x00")
    with pytest.raises(ValueError, match="NUL"):
        render_seatbelt_profile(_policy(), user_temp_dir=None, extra_deny_read=("/a\x00",))


def test_relative_extra_path_is_rejected() -> None:
    with pytest.raises(ValueError, match="absolute"):
        render_seatbelt_profile(_policy(), user_temp_dir=None, extra_deny_read=("rel/path",))


# -- argv and wrap -----------------------------------------------------------------------


def test_argv_starts_with_absolute_sandbox_exec_and_ends_with_the_command() -> None:
    profile = SeatbeltProfile(text="(version 1)", params=(("A_0", "/x"), ("B_0", "/y=z")))

    argv = seatbelt_argv(profile, ("/bin/bash", "-c", "echo hi"))

    assert argv == (
        "/usr/bin/sandbox-exec",
        "-p",
        "(version 1)",
        "-D",
        "A_0=/x",
        "-D",
        "B_0=/y=z",
        "--",
        "/bin/bash",
        "-c",
        "echo hi",
    )
    assert SANDBOX_EXEC == "/usr/bin/sandbox-exec"


def test_argv_refuses_an_empty_command() -> None:
    with pytest.raises(ValueError):
        seatbelt_argv(SeatbeltProfile(text="(version 1)", params=()), ())


@pytest.fixture
def darwin_backend(monkeypatch: pytest.MonkeyPatch) -> SeatbeltBackend:
    """A backend that believes it is on macOS, so wrap() renders on any host."""
    monkeypatch.setattr(seatbelt, "_runner_present", lambda: True)
    return SeatbeltBackend(platform="darwin")


def test_wrap_prefixes_sandbox_exec_and_keeps_the_rest_of_the_plan(
    darwin_backend: SeatbeltBackend, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    policy = _policy(workspace_root=str(ws))
    plan = _plan(str(ws), "echo hi")

    wrapped = darwin_backend.wrap(policy, plan, _ctx(tmp_path))

    assert wrapped.argv[:2] == ("/usr/bin/sandbox-exec", "-p")
    assert wrapped.argv[-4:] == ("--", "/bin/bash", "-c", "echo hi")
    assert wrapped.env == plan.env and wrapped.cwd == plan.cwd
    assert wrapped.preexec_fn is None and wrapped.pass_fds == ()


def test_wrap_adds_hidden_paths_private_tmp_and_symlink_aliases(
    darwin_backend: SeatbeltBackend, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    (ws / "realgit" / "hooks").mkdir(parents=True)
    (ws / ".git").symlink_to(ws / "realgit")
    secret_target = tmp_path / "vault"
    secret_target.mkdir()
    secret_link = tmp_path / "secret-link"
    secret_link.symlink_to(secret_target)
    private_tmp = tmp_path / "state" / "tmp"
    private_tmp.mkdir(parents=True)
    policy = _policy(
        "workspace-write",
        workspace_root=str(ws),
        protected_paths=(".git/hooks",),
        deny_read=(str(secret_link),),
    )
    ctx = _ctx(
        tmp_path, view=HostView(hidden=(str(tmp_path / "spill"),)), private_tmpdir=str(private_tmp)
    )

    wrapped = darwin_backend.wrap(policy, _plan(str(ws)), ctx)

    values = set(wrapped.argv)
    assert f"WRITABLE_ROOT_1={private_tmp}" in values
    assert f"PROTECTED_0={ws}/.git/hooks" in values
    assert any(v.startswith("PROTECTED_") and v.endswith(f"={ws}/realgit/hooks") for v in values)
    assert f"DENY_READ_0={secret_link}" in values
    assert any(v.startswith("DENY_READ_") and v.endswith(f"={secret_target}") for v in values)
    assert any(v.startswith("DENY_READ_") and v.endswith(f"={tmp_path}/spill") for v in values)
    assert wrapped.env["TMPDIR"] == str(private_tmp)


def test_wrap_turns_a_nul_path_into_sandbox_unavailable(
    darwin_backend: SeatbeltBackend, tmp_path: Path
) -> None:
    forged = SandboxPolicy.model_construct(
        mode=SandboxMode.READ_ONLY,
        workspace_root=str(tmp_path),
        network=NetworkMode.ISOLATED,
        writable_roots=(),
        protected_paths=(),
        deny_read=("/Users/me/a\x00b",),
    )

    with pytest.raises(SandboxUnavailableError) as err:
        darwin_backend.wrap(forged, _plan(str(tmp_path)), _ctx(tmp_path))
    assert err.value.code == "SANDBOX_UNAVAILABLE"
    assert re.search("NUL|null byte", err.value.detail)


def test_wrap_off_macos_fails_closed(tmp_path: Path) -> None:
    backend = SeatbeltBackend(platform="linux")

    with pytest.raises(SandboxUnavailableError, match="macOS only"):
        backend.wrap(_policy(workspace_root=str(tmp_path)), _plan(str(tmp_path)), _ctx(tmp_path))


def test_wrap_refuses_danger_full_access(darwin_backend: SeatbeltBackend, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="never goes through a backend"):
        darwin_backend.wrap(
            _policy("danger-full-access", workspace_root=str(tmp_path)),
            _plan(str(tmp_path)),
            _ctx(tmp_path),
        )


# -- user temp dir -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        ("/private/var/folders/ab/cd/T/", "/private/var/folders/ab/cd/T"),
        ("/private/var/folders/ab/cd/T", "/private/var/folders/ab/cd/T"),
        ("/", None),
        ("/Users/me", None),
        ("/private/var/foldersX/evil", None),
        ("relative/T", None),
        ("/private/var/folders/a\x00b", None),
        ("", None),
        (None, None),
    ],
)
def test_user_temp_dir_is_accepted_only_under_var_folders(
    candidate: str | None, expected: str | None
) -> None:
    assert user_temp_dir_from(candidate) == expected


# -- dialects ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_code", "stderr", "expected"),
    [
        (
            71,
            "sandbox-exec: sandbox_apply: Operation not permitted\n",
            "sandbox-exec: sandbox_apply: Operation not permitted",
        ),
        (
            65,
            "sandbox-exec: <input string>:3:1: unbound variable: bogus\n",
            "sandbox-exec: <input string>:3:1: unbound variable: bogus",
        ),
        (
            71,
            "sandbox-exec: execvp() of '/bin/nope' failed: No such file or directory\n",
            "sandbox-exec: execvp() of '/bin/nope' failed: No such file or directory",
        ),
        (
            1,
            "\n  sandbox_apply: Operation not permitted\n",
            "sandbox_apply: Operation not permitted",
        ),
        (1, "bash: /ws/f: Operation not permitted\n", None),
        (1, "bash: /ws/f: Operation not permitted\nsandbox-exec: printed by the command\n", None),
        (0, "sandbox-exec: sandbox_apply: Operation not permitted\n", None),
        (None, "sandbox-exec: sandbox_apply: Operation not permitted\n", None),
    ],
)
def test_runner_failure_is_sandbox_exec_own_first_line(
    exit_code: int | None, stderr: str, expected: str | None
) -> None:
    assert SeatbeltBackend().runner_failure(exit_code, stderr) == expected


def test_a_runner_failure_is_recognised_by_its_first_line() -> None:
    applied = "sandbox-exec: sandbox_apply: Operation not permitted\n"
    assert SeatbeltBackend().runner_failure(71, applied) is not None


def test_every_mode_is_partial_for_a_process_leaving_the_group() -> None:
    # No PID namespace or cgroup on macOS: a `setsid` daemon outlives the run (row 11), in
    # read-only too (a red team's review: read-only with the host network said `full`).
    for policy in (_policy(), _policy(network="host")):
        assert SeatbeltBackend().enforcement(policy) is SandboxEnforcement.PARTIAL
        assert SeatbeltBackend().partial_reasons(policy) == (seatbelt.PROCESS_GAP,)
    loopback = SeatbeltBackend(allow_loopback=True)
    assert loopback.partial_reasons(_policy()) == (seatbelt.PROCESS_GAP, seatbelt.LOOPBACK_GAP)
    assert loopback.partial_reasons(_policy(network="host")) == (seatbelt.PROCESS_GAP,)
    layers = {layer.layer: layer for layer in loopback.layers()}
    assert layers["network"].enforcement == "partial"
    assert layers["processes"].enforcement == "partial"
    assert seatbelt.PROCESS_GAP in layers["processes"].how


def test_workspace_write_is_partial_and_says_what_it_cannot_hold() -> None:
    # Writes land in place: no git import, exact-case names, the host's temp dirs (threat
    # rows 3, 4, 16, 20).
    policy = _policy("workspace-write")
    backend = SeatbeltBackend()
    assert backend.enforcement(policy) is SandboxEnforcement.PARTIAL
    reasons = backend.partial_reasons(policy)
    assert reasons == (seatbelt.PROCESS_GAP, seatbelt.WORKSPACE_WRITE_GAPS)
    assert "git" in reasons[1] and "/private/tmp" in reasons[1] and ".VSCODE" in reasons[1]
    files = [layer for layer in backend.layers() if layer.layer == "files"]
    assert [layer.enforcement for layer in files] == ["partial"]
    assert reasons[1] in files[0].how


def test_the_private_temp_dir_in_the_hidden_state_is_given_back() -> None:
    # The command's TMPDIR lies in the executor's state directory, which is hidden (denied
    # read and write); the deny came last, so every `mktemp` failed (a red team's review).
    state = "/private/var/folders/ab/T/bash-sandbox-501"
    private = f"{state}/state/exec-x/landlock-tmp/k"
    profile = render_seatbelt_profile(
        _policy("workspace-write", protected_paths=()),
        user_temp_dir=USER_TEMP,
        private_tmp=private,
        extra_deny_read=(state,),
    )
    deny = profile.text.index("(deny file-read* file-write*")
    allow = profile.text.index("; The command's own temp dir")
    assert deny < allow
    (ref,) = [name for name, value in profile.params if value == private]
    assert f'(allow file-read* file-write*\n  (subpath (param "{ref}")))' in profile.text
    # The set-id refusal is said again after it: the grant would take it back (round 13).
    assert profile.text.rindex("(deny file-write-setugid)") > allow
    # Without a hidden parent, nothing is added.
    plain = render_seatbelt_profile(
        _policy("workspace-write", protected_paths=()), user_temp_dir=USER_TEMP, private_tmp=private
    )
    assert "own temp dir" not in plain.text


# -- probe and selection -----------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the non-macOS answer")
def test_probe_off_macos_is_unusable_with_a_clear_reason() -> None:
    probe = SeatbeltBackend().probe(timeout_ms=1000)

    assert probe.backend == "seatbelt"
    assert not probe.usable
    assert "sandbox-exec is macOS only" in probe.detail


def test_seatbelt_is_supported_only_on_darwin() -> None:
    assert seatbelt_supported("darwin")
    assert not seatbelt_supported("linux")
    assert not seatbelt_supported("win32")


def test_selection_on_darwin_is_seatbelt() -> None:
    backends = candidate_backends("auto", platform="darwin")

    assert [b.name for b in backends.full] == ["seatbelt"] and backends.fallback is None


def test_selection_without_a_chain_fails_closed() -> None:
    selector = BackendSelector(candidate_backends("auto", platform="freebsd14"), 1000)

    with pytest.raises(SandboxUnavailableError):
        selector.choose(SandboxMode.READ_ONLY)


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the non-macOS answer")
def test_explicit_seatbelt_off_macos_fails_closed() -> None:
    selector = BackendSelector(candidate_backends("seatbelt"), 1000)

    with pytest.raises(SandboxUnavailableError, match="macOS only"):
        selector.choose(SandboxMode.WORKSPACE_WRITE)


# -- real runs (macOS) -------------------------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return Path(os.path.realpath(ws))


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside every writable root: not under a temp dir, so under the home."""
    path = Path(tempfile.mkdtemp(prefix=".bash-sandbox-test-", dir=Path.home()))
    try:
        yield Path(os.path.realpath(path))
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _run(
    policy: SandboxPolicy, script: str, tmp_path: Path, backend: SeatbeltBackend | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "TMPDIR": tempfile.gettempdir()}
    plan = SpawnPlan(argv=("/bin/bash", "-c", script), env=env, cwd=policy.workspace_root)
    wrapped = (backend or SeatbeltBackend()).wrap(policy, plan, _ctx(tmp_path))
    return subprocess.run(
        list(wrapped.argv),
        env=dict(wrapped.env),
        cwd=wrapped.cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _ws_policy(mode: str, ws: Path, **kw: object) -> SandboxPolicy:
    return _policy(mode, workspace_root=str(ws), **kw)


@macos_only
def test_probe_on_macos_confines_a_command() -> None:
    probe = SeatbeltBackend().probe(timeout_ms=10_000)

    assert probe.usable, probe.detail
    assert probe.binary == "/usr/bin/sandbox-exec"


@macos_only
def test_read_only_write_is_denied_and_host_unchanged(ws: Path, tmp_path: Path) -> None:
    (ws / "kept").write_text("original")

    done = _run(
        _ws_policy("read-only", ws), "echo x > new; echo x > kept; rm -f kept; mkdir d", tmp_path
    )

    assert "Operation not permitted" in done.stderr
    assert SeatbeltBackend().is_denial(done.stderr)
    assert SeatbeltBackend().runner_failure(done.returncode, done.stderr) is None
    assert sorted(p.name for p in ws.iterdir()) == ["kept"]
    assert (ws / "kept").read_text() == "original"


@macos_only
def test_no_set_id_bit_reaches_the_host(ws: Path, tmp_path: Path) -> None:
    # Row 19: a set-id file left in the workspace would run as its owner for another user.
    (ws / "tool").write_text("#!/bin/sh\n")
    (ws / "tool").chmod(0o755)

    done = _run(
        _ws_policy("workspace-write", ws),
        "chmod u+s tool; chmod g+s tool; cp tool tool2 && chmod 6755 tool2; true",
        tmp_path,
    )

    assert done.returncode == 0, done.stderr
    for name in ("tool", "tool2"):
        mode = (ws / name).stat().st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID), (name, oct(mode))


@macos_only
def test_dev_null_is_writable_in_read_only(ws: Path, tmp_path: Path) -> None:
    done = _run(
        _ws_policy("read-only", ws),
        "echo x > /dev/null && echo y 2>/dev/null >&2 && echo ok",
        tmp_path,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@macos_only
def test_workspace_write_stops_at_the_workspace_boundary(
    ws: Path, outside: Path, tmp_path: Path
) -> None:
    (outside / "kept").write_text("original")

    done = _run(
        _ws_policy("workspace-write", ws),
        f'echo in > inside; echo x > "{outside}/new"; echo x >> "{outside}/kept"; '
        f'rm -f "{outside}/kept"',
        tmp_path,
    )

    assert (ws / "inside").read_text() == "in\n"
    assert not (outside / "new").exists()
    assert (outside / "kept").read_text() == "original"
    assert "Operation not permitted" in done.stderr


@macos_only
def test_workspace_write_hardlink_to_an_outside_file_cannot_change_it(
    ws: Path, outside: Path, tmp_path: Path
) -> None:
    (outside / "victim").write_text("original")

    _run(
        _ws_policy("workspace-write", ws),
        f'ln "{outside}/victim" link; echo pwned >> link',
        tmp_path,
    )

    assert (outside / "victim").read_text() == "original"


@macos_only
def test_temp_dirs_are_writable_in_workspace_write_only(ws: Path, tmp_path: Path) -> None:
    script = (
        'f=$(mktemp "$TMPDIR/bs.XXXXXX") && echo x > "$f" && rm "$f" && '
        'g=$(mktemp /tmp/bs.XXXXXX) && rm "$g" && echo ok'
    )

    writable = _run(_ws_policy("workspace-write", ws), script, tmp_path)
    read_only = _run(_ws_policy("read-only", ws), script, tmp_path)

    assert writable.returncode == 0, writable.stderr
    assert writable.stdout.strip() == "ok"
    assert read_only.returncode != 0
    assert "Operation not permitted" in read_only.stderr


@macos_only
def test_protected_paths_are_denied_existing_or_not(ws: Path, tmp_path: Path) -> None:
    repo = ws / "repo"
    (repo / ".git" / "hooks").mkdir(parents=True)
    (repo / ".git" / "config").write_text("[core]\n")
    fresh = ws / "fresh"
    fresh.mkdir()
    elsewhere = ws / "elsewhere"
    (elsewhere / "hooks").mkdir(parents=True)
    script = (
        "echo x > .git/hooks/pre-commit; echo x >> .git/config; mv .git .git-moved; "
        "echo ok > .git/objects-are-fine"
    )

    existing = _run(_ws_policy("workspace-write", repo), script, tmp_path)
    missing = _run(
        _ws_policy("workspace-write", fresh),
        f'mkdir -p .git/hooks; ln -s "{elsewhere}" .git; echo "gitdir: x" > .git',
        tmp_path,
    )

    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert (repo / ".git" / "config").read_text() == "[core]\n"
    assert not (repo / ".git-moved").exists()
    assert (repo / ".git" / "objects-are-fine").read_text() == "ok\n", existing.stderr
    assert not os.path.lexists(fresh / ".git"), missing.stderr


@macos_only
def test_deny_read_paths_cannot_be_read(ws: Path, tmp_path: Path) -> None:
    vault = Path(os.path.realpath(tmp_path)) / "vault"
    vault.mkdir()
    (vault / "key").write_text("s3cret")

    done = _run(
        _ws_policy("workspace-write", ws, deny_read=(str(vault),)),
        f'cat "{vault}/key"; ls "{vault}"; cp "{vault}/key" stolen',
        tmp_path,
    )

    assert "s3cret" not in done.stdout
    assert not (ws / "stolen").exists()
    assert "Operation not permitted" in done.stderr


@macos_only
def test_background_process_is_confined_too(ws: Path, tmp_path: Path) -> None:
    done = _run(_ws_policy("read-only", ws), '( echo x > bg ) & wait $!; echo "bg=$?"', tmp_path)

    assert done.stdout.strip() == "bg=1"
    assert not (ws / "bg").exists()


@macos_only
def test_signalling_a_process_outside_the_sandbox_is_denied(ws: Path, tmp_path: Path) -> None:
    done = _run(
        _ws_policy("workspace-write", ws),
        f"kill -0 $$ && echo self-ok; kill -0 {os.getpid()} && echo escaped",
        tmp_path,
    )

    assert "self-ok" in done.stdout
    assert "escaped" not in done.stdout


@macos_only
def test_isolated_network_cannot_reach_a_host_loopback_server(ws: Path, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        isolated = _run(
            _ws_policy("workspace-write", ws),
            f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected",
            tmp_path,
        )

        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the server
        assert "connected" not in isolated.stdout

        host = _run(
            _ws_policy("workspace-write", ws, network="host"),
            f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected",
            tmp_path,
        )
        assert "connected" in host.stdout, host.stderr


@macos_only
def test_isolated_network_cannot_reach_a_host_unix_socket_outside_the_roots(
    ws: Path, tmp_path: Path
) -> None:
    # Short path: sun_path is 104 bytes on macOS. /private/tmp is writable, not connectable.
    sock_dir = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        path = os.path.realpath(sock_dir / "s")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(path)
            server.listen()
            connect = f"import socket; socket.socket(socket.AF_UNIX).connect({path!r})"
            done = _run(
                _ws_policy("workspace-write", ws),
                f"{shlex.quote(sys.executable)} -c {shlex.quote(connect)}",
                tmp_path,
            )
            assert done.returncode != 0
            server.setblocking(False)
            with pytest.raises(BlockingIOError):
                server.accept()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
