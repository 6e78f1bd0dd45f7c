"""The default `deny_read`: every credential store under a home, plus host secrets, unreadable.

The real test populates a fake home with every store of the one list (each holding its own
secret), runs one confined command per Linux backend that tries to read them all, and checks
that no secret byte came out, while an ordinary dotfile next to them stays readable.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from bash_sandbox import SandboxBashExecutor
from bash_seam import BashExecRequest
from policies import (
    DEFAULT_DENY_READ_HOST,
    DEFAULT_DENY_READ_RELATIVE,
    SandboxMode,
    SandboxPolicy,
    default_deny_read,
)
from tests.sandbox.conftest import LINUX_BACKENDS, require_backend

# What the brief and the issue require at the least; the list may hold more.
REQUIRED_RELATIVE = {
    ".pgpass", ".cargo/credentials.toml", ".cargo/credentials", ".m2/settings.xml",
    ".config/pip/pip.conf", ".pip/pip.conf", ".vault-token", ".cache/huggingface/token",
    ".huggingface/token", ".config/containers/auth.json", ".terraform.d", ".docker",
    ".bash_history", ".zsh_history", ".local/share/fish/fish_history", ".python_history",
    ".psql_history", ".mysql_history", ".node_repl_history", ".claude", ".claude.json",
    ".codex", ".config/claude", ".continue", ".cursor", ".config/github-copilot",
    ".config/gh", ".git-credentials", ".config/git/credentials", ".npmrc", ".yarnrc.yml",
    ".gem/credentials", ".local/share/keyrings", ".password-store", ".config/rclone",
    ".s3cfg", ".boto", ".oci", ".config/doctl", ".config/hub", ".netrc", ".kube", ".azure",
    ".aws", ".gnupg", ".ssh",
}  # fmt: skip
REQUIRED_HOST = {"/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/ssl/private"}


# Stores that are directories on a real machine; every other entry is planted as a file.
DIRECTORY_STORES = {
    ".ssh", ".gnupg", ".aws", ".azure", ".config/gcloud", ".oci", ".config/doctl", ".kube",
    ".docker", ".terraform.d", ".config/rclone", ".local/share/keyrings", ".password-store",
    ".config/gh", ".config/hub", ".claude", ".config/claude", ".codex", ".gemini", ".aider",
    ".continue", ".cursor", ".config/Cursor", ".codeium", ".config/github-copilot",
    ".config/goose", ".local/share/opencode",
}  # fmt: skip


def _populate(home: Path) -> dict[str, str]:
    """Each store of the list as a real file (a dir gets a file inside); path -> secret."""
    planted: dict[str, str] = {}
    for entry in DEFAULT_DENY_READ_RELATIVE:
        # A glob entry gets a name only the glob matches, to prove it is expanded.
        rel = entry.replace("*", ".planted-by-test")
        target = home / rel / "inner" / "secret" if rel in DIRECTORY_STORES else home / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        secret = f"SECRET-{secrets.token_hex(8)}"
        target.write_text(secret + "\n")
        planted[str(target)] = secret
    return planted


def test_the_one_list_holds_the_required_stores() -> None:
    assert set(DEFAULT_DENY_READ_RELATIVE) >= REQUIRED_RELATIVE
    assert any(rel.startswith(".aider") and "*" in rel for rel in DEFAULT_DENY_READ_RELATIVE)
    assert set(DEFAULT_DENY_READ_HOST) >= REQUIRED_HOST
    assert any("ssh_host_" in p for p in DEFAULT_DENY_READ_HOST)
    # One list: no entry twice, none absolute, none escaping the home.
    assert len(set(DEFAULT_DENY_READ_RELATIVE)) == len(DEFAULT_DENY_READ_RELATIVE)
    assert all(not r.startswith("/") and ".." not in r for r in DEFAULT_DENY_READ_RELATIVE)


def test_default_expands_globs_now_and_keeps_missing_literals(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".aider.oauth-keys.env").write_text("x")
    listed = default_deny_read(str(home))
    assert str(home / ".aider.oauth-keys.env") in listed
    assert str(home / ".ssh") in listed  # absent, still listed: the backends look at spawn
    assert not any("*" in p and not p.startswith("/etc/") for p in listed)
    assert set(DEFAULT_DENY_READ_HOST) - {p for p in DEFAULT_DENY_READ_HOST if "*" in p} <= set(
        listed
    )
    assert len(set(listed)) == len(listed)
    # The policy's default is the same list for the user's home.
    policy = SandboxPolicy(mode="read-only", workspace_root=str(tmp_path))
    assert policy.deny_read == default_deny_read()


def test_deny_read_validation_rules_are_kept(tmp_path: Path) -> None:
    policy = SandboxPolicy(
        mode="read-only", workspace_root=str(tmp_path), deny_read=("~/x/../.ssh", "/a//b/")
    )
    assert policy.deny_read == (os.path.expanduser("~/.ssh"), "/a/b")
    for bad in ("relative", "/a\x00b"):
        with pytest.raises(ValueError, match="deny_read"):
            SandboxPolicy(mode="read-only", workspace_root=str(tmp_path), deny_read=(bad,))


@pytest.mark.parametrize("backend", LINUX_BACKENDS)
async def test_every_default_store_is_unreadable_and_ordinary_dotfiles_are_not(
    backend: str, tmp_path: Path
) -> None:
    require_backend(backend)
    home = tmp_path / "home"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    planted = _populate(home)
    (home / ".bashrc").write_text("ORDINARY-DOTFILE\n")
    # Read each planted file directly and by walking its store; print whatever comes out.
    command = (
        'for f in "$@"; do cat -- "$f"; done 2>/dev/null; '
        f"grep -r . {home} 2>/dev/null; cat /etc/shadow /etc/gshadow 2>/dev/null; true"
    )
    args = " ".join(f"'{p}'" for p in planted)
    async with SandboxBashExecutor(
        backend=backend,
        workspace_root=str(workspace),
        deny_read=default_deny_read(str(home)),
    ) as executor:
        result = await executor.run(
            executor.resolve(
                BashExecRequest(
                    command=f"set -- {args}; {command}", sandbox_mode=SandboxMode.READ_ONLY
                )
            )
        )
    out = result.stdout.text + result.stderr.text
    assert "ORDINARY-DOTFILE" in out  # the positive control: the rest of home is readable
    leaked = [path for path, secret in planted.items() if secret in out]
    assert leaked == []
    assert len(planted) >= len(REQUIRED_RELATIVE)
    if os.geteuid() == 0 and os.path.exists("/etc/shadow"):
        with open("/etc/shadow") as shadow:
            first = shadow.readline().strip()
        assert first and first not in out


def test_a_pattern_in_deny_read_is_a_request_error_not_a_silent_no_op(tmp_path: Path) -> None:
    # `ws/*.pem` was taken as the literal name and denied nothing, saying nothing (red team).
    from pydantic import ValidationError

    from policies import SandboxMode, SandboxPolicy

    with pytest.raises(ValidationError, match="deny_read takes paths, not patterns"):
        SandboxPolicy(
            mode=SandboxMode.READ_ONLY,
            workspace_root=str(tmp_path),
            deny_read=(str(tmp_path / "*.pem"),),
        )
    # The defaults' patterns reach a policy expanded.
    policy = SandboxPolicy(mode=SandboxMode.READ_ONLY, workspace_root=str(tmp_path))
    assert not any("*" in p for p in policy.deny_read)
