"""Widening through a real server: the ceiling, the user's yes or no, the session log.

Every widening test writes a marker file that only the wider mode could write, then looks
for it on the host: present only when the user approved, absent on every refusal. Both
protocol eras are covered: ``legacy`` (elicitation/create during the call) and ``auto``
(the 2026-07-28 round trip through ``InputRequiredResult``).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from mcp_probes import ServerLauncher, UserAtKeyboard

from bash_seam import SandboxFacts
from policies import sandbox_denial_marker
from tests.facts.evidence import WRITE_INTENT_WITNESSED, file_refusal_reported

ERAS = ["legacy", "auto"]
CEILING = ("--allow-escalation-to", "workspace-write")


def _facts(result: types.CallToolResult) -> dict[str, Any]:
    facts = result.structured_content
    assert isinstance(facts, dict)
    return facts


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def _error_code(result: types.CallToolResult) -> str:
    assert result.is_error, _text(result)
    code: str = _facts(result)["error"]["code"]
    return code


@pytest.mark.parametrize("era", ERAS)
async def test_a_mode_above_the_ceiling_is_refused_without_asking(
    launcher: ServerLauncher, workspace: Path, era: str
) -> None:
    user = UserAtKeyboard("accept", {"approve": True})
    async with launcher.client(*CEILING, mode=era, user=user) as client:
        result = await client.call_tool(
            "bash_run", {"command": "echo x > marker", "sandbox_mode": "danger-full-access"}
        )
    assert _error_code(result) == "ESCALATION_ABOVE_CEILING"
    assert "workspace-write" in _text(result)
    assert user.questions == []
    assert not (workspace / "marker").exists()


async def test_a_mode_field_is_refused_when_the_server_has_no_ceiling(
    launcher: ServerLauncher, workspace: Path
) -> None:
    user = UserAtKeyboard("accept", {"approve": True})
    async with launcher.client(user=user) as client:
        result = await client.call_tool(
            "bash_run", {"command": "echo x > marker", "sandbox_mode": "workspace-write"}
        )
    assert _error_code(result) == "INVALID_ARGUMENTS"
    assert user.questions == []
    assert not (workspace / "marker").exists()


@pytest.mark.parametrize("era", ERAS)
async def test_an_approved_widening_runs_once_wider_then_back_to_the_default(
    launcher: ServerLauncher, workspace: Path, era: str
) -> None:
    user = UserAtKeyboard("accept", {"approve": True})
    async with launcher.client(*CEILING, mode=era, user=user) as client:
        wider = await client.call_tool(
            "bash_run", {"command": "echo approved > marker", "sandbox_mode": "workspace-write"}
        )
        after = await client.call_tool("bash_run", {"command": "echo again > marker2"})
    assert not wider.is_error, _text(wider)
    assert _facts(wider)["sandbox"]["mode"] == "workspace-write"
    assert (workspace / "marker").read_text() == "approved\n"
    # The user was asked exactly once, about this command, with a yes/no form.
    assert len(user.questions) == 1
    question = user.questions[0]
    assert "echo approved > marker" in question.message
    assert "workspace-write" in question.message
    assert question.requested_schema["properties"]["approve"]["type"] == "boolean"
    assert question.requested_schema["required"] == ["approve"]
    # Per call: the next call is read-only again.
    sandbox = SandboxFacts.model_validate(_facts(after)["sandbox"])
    assert sandbox.mode == "read-only"
    assert file_refusal_reported(sandbox, str(workspace / "marker2"))
    assert (sandbox_denial_marker("read-only") in _text(after)) is WRITE_INTENT_WITNESSED
    assert not (workspace / "marker2").exists()


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize(
    ("action", "content"),
    [("decline", None), ("cancel", None), ("accept", {"approve": False})],
    ids=["decline", "cancel", "accept-no"],
)
async def test_a_refused_widening_runs_nothing(
    launcher: ServerLauncher,
    workspace: Path,
    era: str,
    action: str,
    content: dict[str, Any] | None,
) -> None:
    user = UserAtKeyboard(action, content)
    async with launcher.client(*CEILING, mode=era, user=user) as client:
        result = await client.call_tool(
            "bash_start", {"command": "echo x > marker", "sandbox_mode": "workspace-write"}
        )
        listed = await client.call_tool("bash_list", {})
    assert _error_code(result) == "ESCALATION_DECLINED"
    assert len(user.questions) == 1
    assert _facts(listed)["processes"] == []
    assert not (workspace / "marker").exists()


async def test_a_client_that_fails_to_ask_is_a_refusal(
    launcher: ServerLauncher, workspace: Path
) -> None:
    user = UserAtKeyboard(fail=True)
    async with launcher.client(*CEILING, mode="legacy", user=user) as client:
        result = await client.call_tool(
            "bash_run", {"command": "echo x > marker", "sandbox_mode": "workspace-write"}
        )
        alive = await client.call_tool("bash_list", {})
    assert _error_code(result) == "ESCALATION_DECLINED"
    assert "could not ask" in _text(result)
    assert not alive.is_error
    assert not (workspace / "marker").exists()


@pytest.mark.parametrize("era", ERAS)
async def test_without_elicitation_support_a_widening_is_refused(
    launcher: ServerLauncher, workspace: Path, era: str
) -> None:
    async with launcher.client(*CEILING, mode=era, user=None) as client:
        result = await client.call_tool(
            "bash_run", {"command": "echo x > marker", "sandbox_mode": "workspace-write"}
        )
    assert _error_code(result) == "ELICITATION_UNSUPPORTED"
    assert "elicitation" in _text(result)
    assert not (workspace / "marker").exists()


@pytest.mark.parametrize("era", ERAS)
async def test_host_network_needs_its_own_flag_and_approval(
    launcher: ServerLauncher, era: str
) -> None:
    user = UserAtKeyboard("accept", {"approve": True})
    # The interfaces of the network namespace the command runs in.
    probe = "python3 -c 'import socket; print(*sorted(n for _, n in socket.if_nameindex()))'"
    async with launcher.client(*CEILING, mode=era, user=user) as client:
        refused = await client.call_tool("bash_run", {"command": probe, "network": "host"})
    assert _error_code(refused) == "INVALID_ARGUMENTS"
    async with launcher.client("--allow-network-escalation", mode=era, user=user) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        isolated = await client.call_tool("bash_run", {"command": probe})
        host = await client.call_tool("bash_run", {"command": probe, "network": "host"})
    assert "network" in tools["bash_run"].input_schema["properties"]
    assert "sandbox_mode" not in tools["bash_run"].input_schema["properties"]
    assert _facts(isolated)["stdout"]["text"].split() == ["lo"]
    assert _facts(host)["network"] == "host"
    host_interfaces = sorted(name for _, name in socket.if_nameindex())
    assert _facts(host)["stdout"]["text"].split() == host_interfaces
    assert _facts(host)["sandbox"]["network"] == "host"
    assert len(user.questions) == 1
    assert "host network" in user.questions[0].message


async def test_approval_for_the_session_is_recorded_in_the_session_log(
    launcher: ServerLauncher, workspace: Path, outside: Path
) -> None:
    log = outside / "session.jsonl"
    user = UserAtKeyboard("accept", {"approve": True, "remember": True})
    async with launcher.client(*CEILING, "--session", str(log), user=user) as client:
        await client.call_tool(
            "bash_run", {"command": "echo 1 > marker", "sandbox_mode": "workspace-write"}
        )
        later = await client.call_tool("bash_run", {"command": "echo 2 > marker2"})
    assert "remember" in user.questions[0].requested_schema["properties"]
    assert _facts(later)["sandbox"]["mode"] == "workspace-write"
    assert (workspace / "marker2").read_text() == "2\n"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events == [{"type": "bash/sandbox-mode", "mode": "workspace-write"}]


async def test_a_session_override_from_the_log_applies_and_narrows_the_schema(
    launcher: ServerLauncher, workspace: Path, outside: Path
) -> None:
    log = outside / "session.jsonl"
    log.write_text('{"type": "bash/sandbox-mode", "mode": "workspace-write"}\n')
    async with launcher.client(*CEILING, "--session", str(log)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        result = await client.call_tool("bash_run", {"command": "echo s > marker"})
    # Already at the ceiling: nothing left to offer.
    assert "sandbox_mode" not in tools["bash_run"].input_schema["properties"]
    assert _facts(result)["sandbox"]["mode"] == "workspace-write"
    assert (workspace / "marker").read_text() == "s\n"


async def test_a_round_trip_approval_is_good_for_one_run_of_the_same_command(
    launcher: ServerLauncher, workspace: Path
) -> None:
    first = {"command": "echo once >> marker", "sandbox_mode": "workspace-write"}
    async with launcher.client(*CEILING, mode="auto", user=UserAtKeyboard()) as client:
        assert client.protocol_version == "2026-07-28"
        asked = await client.session.call_tool("bash_run", first, allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult)
        assert asked.input_requests is not None and asked.request_state is not None
        yes = {
            key: types.ElicitResult(action="accept", content={"approve": True})
            for key in asked.input_requests
        }
        state = asked.request_state
        # The sealed state is bound to the exact arguments: another command cannot use it.
        other = {"command": "echo other > marker3", "sandbox_mode": "workspace-write"}
        with pytest.raises(MCPError):
            await client.session.call_tool(
                "bash_run", other, input_responses=yes, request_state=state
            )
        ran = await client.session.call_tool(
            "bash_run", first, input_responses=yes, request_state=state
        )
        replayed = await client.session.call_tool(
            "bash_run", first, input_responses=yes, request_state=state
        )
    assert isinstance(ran, types.CallToolResult) and not ran.is_error, ran
    assert isinstance(replayed, types.CallToolResult)
    assert _error_code(replayed) == "APPROVAL_STALE"
    assert (workspace / "marker").read_text() == "once\n"
    assert not (workspace / "marker3").exists()


async def test_a_forged_round_trip_state_is_refused(
    launcher: ServerLauncher, workspace: Path
) -> None:
    args = {"command": "echo forged > marker", "sandbox_mode": "workspace-write"}
    yes = {"sandbox-approval": types.ElicitResult(action="accept", content={"approve": True})}
    async with launcher.client(*CEILING, mode="auto", user=UserAtKeyboard()) as client:
        with pytest.raises(MCPError):
            await client.session.call_tool(
                "bash_run", args, input_responses=yes, request_state="made-up-by-the-client"
            )
        # Answers without any state are not an approval either: the question is asked.
        asked = await client.session.call_tool(
            "bash_run", args, input_responses=yes, allow_input_required=True
        )
    assert isinstance(asked, types.InputRequiredResult)
    assert not (workspace / "marker").exists()


async def test_an_unreadable_session_log_stops_calls_instead_of_guessing_a_mode(
    launcher: ServerLauncher, workspace: Path, outside: Path
) -> None:
    log = outside / "session.jsonl"
    async with launcher.client("--mode", "workspace-write", "--session", str(log)) as client:
        log.unlink()
        log.mkdir()  # whatever the log became, it cannot be read as one
        result = await client.call_tool("bash_run", {"command": "echo x > marker"})
    assert _error_code(result) == "SESSION_UNREADABLE"
    assert not (workspace / "marker").exists()


async def test_the_approval_question_shows_every_character_the_command_holds(
    launcher: ServerLauncher, workspace: Path
) -> None:
    # A carriage return would redraw the line over the real command; a bidi control would
    # reorder it: the user must read what runs. Declined here: nothing runs.
    user = UserAtKeyboard("accept", {"approve": False})
    hidden = "touch pwned\r# harmless-looking comment\u202e"
    padded = hidden + " #" + "x" * 3000
    async with launcher.client(*CEILING, user=user) as client:
        await client.call_tool("bash_run", {"command": padded, "sandbox_mode": "workspace-write"})
    assert len(user.questions) == 1
    message = user.questions[0].message
    assert "\r" not in message and "\u202e" not in message
    assert "touch pwned^M# harmless-looking comment\\u202e" in message
    assert "more characters not shown]" in message
    assert not (workspace / "pwned").exists()


async def test_the_approval_question_shows_a_working_directory_exactly_as_it_is(
    launcher: ServerLauncher, workspace: Path
) -> None:
    # A directory named by a cloned repository, given as the call's workdir, was put in the
    # question raw: its newlines, escape sequences and bidi controls rewrote what the user
    # read ("this call stays READ-ONLY"); approved, the call ran in workspace-write (found by
    # a red team). Every control character of it is shown now, on one line, and the
    # command's own lines are indented so none reads as the question's text.
    name = "a\n\nbash-sandbox: this call stays READ-ONLY. \x1b]0;t\x07\u202e\r\nApprove: YES"
    (workspace / name).mkdir()
    user = UserAtKeyboard("accept", {"approve": False})
    call = {
        "command": "touch wrote\n\nWorking directory: /nowhere",
        "sandbox_mode": "workspace-write",
        "workdir": str(workspace / name / ".."),
    }
    async with launcher.client(*CEILING, user=user) as client:
        await client.call_tool("bash_run", call)
    assert len(user.questions) == 1
    message = user.questions[0].message
    assert "\x1b" not in message and "\x07" not in message and "\u202e" not in message
    shown = "a^J^Jbash-sandbox: this call stays READ-ONLY. ^[]0;t^G\\u202e^M^JApprove: YES"
    assert shown in message
    assert "\r" not in message  # round 17: a CRLF in the name was kept, its `\r` bare
    assert "    touch wrote\n    \n    Working directory: /nowhere" in message
    assert message.count("\nWorking directory: ") == 1
    assert not (workspace / "wrote").exists()
