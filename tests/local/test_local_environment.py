"""The environment a real command sees: scrubbed credentials, defaults, and the two channels."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bash_local import LocalBashExecutor, build_command_env
from bash_seam import BashExecSpec, EnvChannelError

Spec = Callable[..., BashExecSpec]


async def command_env(executor: LocalBashExecutor, spec: BashExecSpec) -> dict[str, str]:
    result = await executor.run(spec)
    assert result.exit_code == 0, result.stderr.text
    pairs = (line.split("=", 1) for line in result.stdout.text.split("\0") if "=" in line)
    return dict(pairs)


@pytest.fixture
def host_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    marker = tmp_path / "bash_env_ran"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"touch {marker}\n")
    for name, value in {
        "FOO_TOKEN": "t",
        "my_secret_thing": "s",
        "Api_Key": "k",
        "DB_PASSWORD": "p",
        "DSH_SESSION": "host-session",
        "BASH_ENV": str(hook),
        "ENV": str(hook),
        "PLAIN_SETTING": "kept",
    }.items():
        monkeypatch.setenv(name, value)
    return marker


async def test_credentials_dsh_names_and_startup_hooks_are_not_inherited(
    executor: LocalBashExecutor, spec: Spec, host_env: Path
) -> None:
    env = await command_env(executor, spec("env -0"))
    for name in ("FOO_TOKEN", "my_secret_thing", "Api_Key", "DB_PASSWORD", "DSH_SESSION"):
        assert name not in env
    assert "BASH_ENV" not in env and "ENV" not in env
    assert not host_env.exists()  # bash never sourced the hook
    assert env["PLAIN_SETTING"] == "kept"
    assert env["PATH"]


async def test_output_defaults_are_set(executor: LocalBashExecutor, spec: Spec) -> None:
    env = await command_env(executor, spec("env -0"))
    assert env["NO_COLOR"] == "1"
    assert env["TERM"] == "dumb"
    assert env["PAGER"] == "cat" and env["GIT_PAGER"] == "cat"


async def test_request_env_may_restore_a_credential_and_override_defaults(
    executor: LocalBashExecutor, spec: Spec, host_env: Path
) -> None:
    env = await command_env(
        executor, spec("env -0", env={"FOO_TOKEN": "restored", "TERM": "xterm"})
    )
    assert env["FOO_TOKEN"] == "restored"
    assert env["TERM"] == "xterm"


async def test_dsh_env_carries_only_dsh_names(
    executor: LocalBashExecutor, spec: Spec, host_env: Path
) -> None:
    env = await command_env(executor, spec("env -0", dsh_env={"DSH_SESSION": "request"}))
    assert env["DSH_SESSION"] == "request"
    with pytest.raises(EnvChannelError, match="dsh_env"):
        spec("env -0", dsh_env={"HOME": "/"})
    with pytest.raises(EnvChannelError, match="env may not set DSH_SESSION"):
        spec("env -0", env={"DSH_SESSION": "x"})


def test_layers_apply_in_order() -> None:
    built = build_command_env(
        {"TERM": "xterm", "A_KEY": "k", "KEEP": "1"},
        env={"KEEP": "2", "NO_COLOR": "0"},
        dsh_env={"DSH_A": "a"},
    )
    assert built == {
        "TERM": "dumb",
        "KEEP": "2",
        "NO_COLOR": "0",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "DSH_A": "a",
    }
