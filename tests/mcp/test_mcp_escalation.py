"""The escalation rules alone: what a call may widen, the schema it is offered, who must agree."""

from __future__ import annotations

import os
from pathlib import Path

import mcp_types as types
import pytest

from bash_sandbox.cli.mcp_approval import approval_schema, read_answer, supports_form_elicitation
from bash_sandbox.cli.mcp_escalation import (
    Escalation,
    EscalationCeiling,
    EscalationError,
    check_session_log_location,
    judge_escalation,
)
from bash_sandbox.cli.mcp_tools import tool_definitions
from policies import NetworkMode, SandboxMode

RO, WW, DFA = SandboxMode.READ_ONLY, SandboxMode.WORKSPACE_WRITE, SandboxMode.DANGER_FULL_ACCESS
ISO, HOST = NetworkMode.ISOLATED, NetworkMode.HOST


def _judge(
    ceiling: EscalationCeiling, mode: SandboxMode | None, net: NetworkMode | None = None
) -> Escalation:
    return judge_escalation(
        ceiling, current_mode=RO, current_network=ISO, requested_mode=mode, requested_network=net
    )


def test_a_call_asking_nothing_runs_as_configured_without_a_question() -> None:
    got = _judge(EscalationCeiling(), None)
    assert (got.mode, got.network, got.needs_approval) == (RO, ISO, False)


def test_a_wider_mode_within_the_ceiling_needs_the_users_approval() -> None:
    got = _judge(EscalationCeiling(mode=DFA), WW)
    assert (got.mode, got.wider_mode, got.needs_approval) == (WW, True, True)


@pytest.mark.parametrize(
    ("ceiling", "asked"), [(None, WW), (WW, DFA), (RO, WW)], ids=["no-ceiling", "above", "equal"]
)
def test_a_wider_mode_above_the_ceiling_is_refused(
    ceiling: SandboxMode | None, asked: SandboxMode
) -> None:
    with pytest.raises(EscalationError) as caught:
        _judge(EscalationCeiling(mode=ceiling), asked)
    assert caught.value.code == "ESCALATION_ABOVE_CEILING"
    assert asked.value in str(caught.value)


def test_the_same_or_a_narrower_mode_needs_no_question() -> None:
    got = judge_escalation(
        EscalationCeiling(mode=DFA),
        current_mode=WW,
        current_network=ISO,
        requested_mode=RO,
        requested_network=None,
    )
    assert (got.mode, got.needs_approval) == (RO, False)


def test_the_host_network_needs_its_own_ceiling_and_then_approval() -> None:
    with pytest.raises(EscalationError):
        _judge(EscalationCeiling(mode=DFA), None, HOST)
    got = _judge(EscalationCeiling(network=HOST), None, HOST)
    assert (got.network, got.wider_network, got.wider_mode) == (HOST, True, False)
    assert got.describe() == "the host network"


def test_danger_full_access_asks_once_for_the_mode_not_again_for_the_network() -> None:
    got = _judge(EscalationCeiling(mode=DFA), DFA, HOST)
    assert (got.wider_mode, got.wider_network) == (True, False)


def _properties(tools: list[types.Tool], name: str) -> dict[str, object]:
    tool = next(t for t in tools if t.name == name)
    props: dict[str, object] = tool.input_schema["properties"]
    return props


def test_schema_has_no_escalation_fields_without_a_ceiling() -> None:
    tools = tool_definitions(EscalationCeiling(), RO, ISO)
    assert [t.name for t in tools] == [
        "bash_run",
        "bash_start",
        "bash_read",
        "bash_kill",
        "bash_list",
    ]
    assert set(_properties(tools, "bash_run")) == {"command", "workdir", "timeout_ms"}
    # `publish` widens nothing: it opens the host's loopback toward the sandbox, not out.
    assert set(_properties(tools, "bash_start")) == {"command", "workdir", "publish"}


def test_schema_offers_modes_up_to_the_ceiling_only() -> None:
    tools = tool_definitions(EscalationCeiling(mode=WW, network=HOST), RO, ISO)
    for name in ("bash_run", "bash_start"):
        props = _properties(tools, name)
        assert props["sandbox_mode"] == {
            "type": "string",
            "enum": ["read-only", "workspace-write"],
            "description": props["sandbox_mode"]["description"],  # type: ignore[index]
        }
        assert props["network"]["enum"] == ["isolated", "host"]  # type: ignore[index]


def test_a_ceiling_no_wider_than_the_default_offers_nothing() -> None:
    tools = tool_definitions(EscalationCeiling(mode=WW), WW, HOST)
    assert "sandbox_mode" not in _properties(tools, "bash_run")
    assert "network" not in _properties(tools, "bash_run")


def test_session_log_inside_the_workspace_or_a_writable_root_is_refused(
    tmp_path: Path, workspace: Path, outside: Path
) -> None:
    ws, extra, state = workspace, tmp_path / "extra", outside
    extra.mkdir()
    (state / "into-ws").symlink_to(ws)
    for path in (ws / "s.jsonl", ws / "sub" / ".." / "s.jsonl", extra / "s.jsonl", ws):
        with pytest.raises(EscalationError) as caught:
            check_session_log_location(str(path), [str(ws), str(extra)])
        assert caught.value.code == "SESSION_LOG_UNSAFE"
    with pytest.raises(EscalationError):
        check_session_log_location(str(state / "into-ws" / "s.jsonl"), [str(ws)])
    good = check_session_log_location(str(state / "s.jsonl"), [str(ws), str(extra)])
    assert good == os.path.realpath(state / "s.jsonl")
    # A sibling whose name merely starts like the workspace is outside it.
    assert check_session_log_location(str(tmp_path / "ws-log.jsonl"), [str(ws)])


def test_only_an_explicit_accept_with_approve_true_approves() -> None:
    def answer(action: str, content: dict[str, object] | None) -> bool:
        result = types.ElicitResult.model_validate({"action": action, "content": content})
        return read_answer(result, can_remember=True).approved

    assert answer("accept", {"approve": True})
    assert not answer("accept", {"approve": False})
    assert not answer("accept", {"approve": "yes"})
    assert not answer("accept", None)
    assert not answer("decline", {"approve": True})
    assert not answer("cancel", None)


def test_remember_is_only_kept_where_a_session_log_can_hold_it() -> None:
    result = types.ElicitResult(action="accept", content={"approve": True, "remember": True})
    assert read_answer(result, can_remember=True).remember
    assert not read_answer(result, can_remember=False).remember
    assert (
        "remember" not in approval_schema(can_remember=False, mode="workspace-write")["properties"]
    )


def test_form_elicitation_support_is_read_from_the_client_capabilities() -> None:
    caps = types.ClientCapabilities
    assert not supports_form_elicitation(None)
    assert not supports_form_elicitation(caps())
    assert supports_form_elicitation(caps(elicitation=types.ElicitationCapability()))
    url_only = types.ElicitationCapability(url=types.UrlElicitationCapability())
    assert not supports_form_elicitation(caps(elicitation=url_only))
