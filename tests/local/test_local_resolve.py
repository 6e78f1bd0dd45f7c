"""Request -> spec resolution and construction: defaults, caps, and bad input rejected early."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from bash_local import LocalBashConfig, LocalBashExecutor
from bash_seam import (
    BashExecRequest,
    BashExecSpec,
    EnvChannelError,
    InvalidRequestError,
    WorkdirError,
)


def test_defaults_come_from_config_and_process(tmp_path: Path) -> None:
    ex = LocalBashExecutor(timeout_ms=1234, max_output_bytes=99)
    spec = ex.resolve(BashExecRequest(command="true"))
    assert spec.workdir == os.getcwd()
    assert spec.timeout_ms == 1234
    assert spec.stdout_max_bytes == 99
    assert spec.owner is None
    assert spec.sandbox_policy is None
    assert "owner" in spec.model_fields_set and "sandbox_policy" in spec.model_fields_set

    ex = LocalBashExecutor(cwd=str(tmp_path))
    assert ex.resolve(BashExecRequest(command="true")).workdir == str(tmp_path)


def test_request_values_win_and_timeout_is_capped(tmp_path: Path) -> None:
    ex = LocalBashExecutor(cwd="/", max_timeout_ms=5_000, max_output_bytes=10)
    spec = ex.resolve(
        BashExecRequest(
            command="true",
            workdir=str(tmp_path),
            timeout_ms=60_000,
            stdout_max_bytes=1_000_000,
            owner="agent-7",
        )
    )
    assert spec.workdir == str(tmp_path)
    assert spec.timeout_ms == 5_000
    assert spec.stdout_max_bytes == 1_000_000
    assert spec.owner == "agent-7"


def test_config_default_timeout_is_capped_too() -> None:
    ex = LocalBashExecutor(timeout_ms=9_000, max_timeout_ms=1_000)
    assert ex.resolve(BashExecRequest(command="true")).timeout_ms == 1_000


def test_relative_workdir_is_rejected_by_name() -> None:
    ex = LocalBashExecutor()
    with pytest.raises(WorkdirError, match="some/dir"):
        ex.resolve(BashExecRequest(command="true", workdir="some/dir"))
    with pytest.raises(WorkdirError, match="absolute"):
        ex.resolve(BashExecRequest(command="true", workdir=""))


def test_missing_or_non_directory_workdir_is_rejected_by_name(tmp_path: Path) -> None:
    ex = LocalBashExecutor()
    missing = tmp_path / "nope"
    with pytest.raises(WorkdirError, match="nope"):
        ex.resolve(BashExecRequest(command="true", workdir=str(missing)))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(WorkdirError, match="file"):
        ex.resolve(BashExecRequest(command="true", workdir=str(a_file)))


def test_env_channel_misuse_is_rejected_at_resolve() -> None:
    ex = LocalBashExecutor()
    with pytest.raises(EnvChannelError, match="DSH_SESSION"):
        ex.resolve(BashExecRequest(command="true", env={"DSH_SESSION": "x"}))
    with pytest.raises(EnvChannelError, match="HOME"):
        ex.resolve(BashExecRequest(command="true", dsh_env={"HOME": "/"}))


@pytest.mark.parametrize(
    "fields",
    [
        {"command": "echo a\x00b"},
        {"command": "true", "env": {"A": 1}},
        {"command": "true", "timeout_ms": -5},
        {"command": "true", "timeout_ms": 0},
        {"command": "true", "stdout_max_bytes": 1.5},
        {"command": "true", "bogus": 1},
    ],
)
def test_bad_request_fields_are_rejected_by_name(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as info:
        BashExecRequest(**fields)
    named = {str(err["loc"][0]) for err in info.value.errors()}
    assert named & set(fields)


def test_spec_built_by_hand_is_validated_too() -> None:
    with pytest.raises(ValidationError, match="timeout_ms"):
        BashExecSpec(
            command="true",
            workdir="/",
            timeout_ms=-1,
            stdout_max_bytes=10,
            owner=None,
            sandbox_policy=None,
        )


def test_overrides_are_validated_into_the_config() -> None:
    ex = LocalBashExecutor(LocalBashConfig(timeout_ms=5), grace_ms=7)
    assert ex.config.timeout_ms == 5 and ex.config.grace_ms == 7
    with pytest.raises(InvalidRequestError, match="bogus"):
        LocalBashExecutor(bogus=1)
    with pytest.raises(InvalidRequestError, match="grace_ms"):
        LocalBashExecutor(grace_ms=-1)
    with pytest.raises(InvalidRequestError, match="cwd"):
        LocalBashExecutor(cwd="relative")


def test_config_subclass_survives_overrides() -> None:
    class WiderConfig(LocalBashConfig):
        flavour: str = "plain"

    ex = LocalBashExecutor(WiderConfig(flavour="spicy"), grace_ms=9)
    assert isinstance(ex.config, WiderConfig)
    assert ex.config.flavour == "spicy" and ex.config.grace_ms == 9


def test_executor_does_not_sandbox() -> None:
    assert LocalBashExecutor().sandbox_mode is None
