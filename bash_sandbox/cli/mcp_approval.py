"""Asking the user before a call widens the sandbox: MCP form elicitation, in both eras.

The question is a yes/no form (``approve``, plus ``remember`` when a `--session` log can keep
the new mode). Only an explicit ``accept`` with ``approve: true`` lets the call proceed;
decline, cancel, a missing answer or a client without form elicitation refuse it. How the
question travels depends on the protocol version the client negotiated:

1. handshake era (<= 2025-11-25): a standalone ``elicitation/create`` request, sent while the
   ``tools/call`` waits;
2. 2026-07-28 and later: the call returns an ``InputRequiredResult`` carrying the question and
   a ``requestState``; the client asks the user and retries the same call with the answer.
   The SDK's `RequestStateBoundary` seals that state and binds it to the tool name and the
   exact arguments, so an approval cannot be replayed onto another command; the state is a
   one-time nonce this object holds, so it cannot be replayed onto the same command either.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, ValidationError

from bash_sandbox.cli.mcp_escalation import Escalation, EscalationError
from bash_sandbox.cli.render import json_safe, render_visible

APPROVAL_KEY = "sandbox-approval"
# Questions a client was sent but never answered are forgotten past this many.
MAX_PENDING_QUESTIONS = 64
_COMMAND_PREVIEW_CHARS = 2_000


class Approval(BaseModel):
    """The user's answer to one widening question."""

    model_config = ConfigDict(frozen=True)

    approved: bool
    remember: bool = False
    reason: str = ""  # why not, when not approved


def supports_form_elicitation(capabilities: types.ClientCapabilities | None) -> bool:
    """Whether the client declared form elicitation (a bare ``elicitation: {}`` counts)."""
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def approval_schema(*, can_remember: bool, mode: str) -> dict[str, Any]:
    """The form the user fills in: flat booleans, as form elicitation requires."""
    properties: dict[str, Any] = {
        "approve": {
            "type": "boolean",
            "title": "Approve",
            "description": "Run this command with the wider access",
            "default": False,
        }
    }
    if can_remember:
        properties["remember"] = {
            "type": "boolean",
            "title": "For this session",
            "description": f"Also run every later command under {mode} without asking",
            "default": False,
        }
    return {"type": "object", "properties": properties, "required": ["approve"]}


def read_answer(answer: types.ElicitResult, *, can_remember: bool) -> Approval:
    """Approved only by ``accept`` with ``approve`` exactly true."""
    if answer.action != "accept":
        return Approval(approved=False, reason=f"the user chose {answer.action}")
    content = answer.content or {}
    if content.get("approve") is not True:
        return Approval(approved=False, reason="the user did not approve")
    remember = can_remember and content.get("remember") is True
    return Approval(approved=True, remember=remember)


def question_text(escalation: Escalation, *, command: str, workdir: str, current: str) -> str:
    # The user approves what they read: a `\r`, an escape sequence or a bidi control must
    # not hide or reorder part of the command, and a cut says how much it hid.
    # Each line of the command indented, so none of it reads as the question's own text;
    # the working directory (a name a cloned repository chose) on one line, every control
    # character in it shown, a newline included.
    preview = render_visible(command[:_COMMAND_PREVIEW_CHARS])
    hidden = len(command) - _COMMAND_PREVIEW_CHARS
    if hidden > 0:
        preview += f" [... {hidden} more characters not shown]"
    preview = "\n".join(f"    {line}" for line in preview.split("\n"))
    # CRLF too (`render_visible` keeps it for output): a `\r` left bare returned the cursor
    # over the question's text, a red team's.
    where = render_visible(workdir).replace("\r", "^M").replace("\n", "^J").replace("\t", "^I")
    text: str = json_safe(  # a working directory whose name is not UTF-8
        f"The model asks to run a command with {escalation.describe()} "
        f"(the sandbox now allows {current}).\n\n"
        f"Command:\n{preview}\n\nWorking directory: {where}\n\nApprove this one call?"
    )
    return text


class ApprovalDesk:
    """Asks the user for each widening call; holds the questions still awaiting an answer."""

    def __init__(self, *, can_remember: bool) -> None:
        self._can_remember = can_remember
        self._pending: OrderedDict[str, None] = OrderedDict()

    async def ask(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        escalation: Escalation,
        question: str,
    ) -> Approval | types.InputRequiredResult:
        """The user's answer, or (2026-07-28+) the question to return to the client.

        Raises `EscalationError` when the client cannot ask its user at all.
        """
        remember = self._can_remember and escalation.wider_mode
        schema = approval_schema(can_remember=remember, mode=escalation.mode.value)
        if not supports_form_elicitation(ctx.session.client_capabilities):
            raise EscalationError(
                f"this call needs {escalation.describe()}, which the user must approve, but "
                "the MCP client does not support elicitation, so it cannot ask; the client "
                "must support MCP form elicitation for any widening. Run the command without "
                "sandbox_mode/network, or ask the user to widen the server's --mode",
                "ELICITATION_UNSUPPORTED",
            )
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return self._ask_by_round_trip(params, question, schema, remember)
        if not ctx.session.can_send_request:
            raise EscalationError(
                "this connection cannot carry a question to the user; no widening possible",
                "ELICITATION_UNSUPPORTED",
            )
        try:
            answer = await ctx.session.elicit_form(
                question, schema, related_request_id=ctx.request_id
            )
        except (MCPError, ValidationError) as exc:
            # The client failed to ask, or answered nonsense: never a yes.
            return Approval(approved=False, reason=f"the client could not ask the user ({exc})")
        return read_answer(answer, can_remember=remember)

    def _ask_by_round_trip(
        self,
        params: types.CallToolRequestParams,
        question: str,
        schema: dict[str, Any],
        remember: bool,
    ) -> Approval | types.InputRequiredResult:
        nonce = params.request_state
        if nonce is None:
            nonce = secrets.token_urlsafe(16)
            self._pending[nonce] = None
            while len(self._pending) > MAX_PENDING_QUESTIONS:
                self._pending.popitem(last=False)
            request = types.ElicitRequest(
                params=types.ElicitRequestFormParams(message=question, requested_schema=schema)
            )
            return types.InputRequiredResult(
                input_requests={APPROVAL_KEY: request}, request_state=nonce
            )
        # The boundary already proved this state is ours and bound to these arguments;
        # consuming the nonce makes the answer good for one run only.
        if nonce not in self._pending:
            raise EscalationError(
                "this approval was already used or has expired; call the tool again to ask "
                "the user anew",
                "APPROVAL_STALE",
            )
        del self._pending[nonce]
        answer = (params.input_responses or {}).get(APPROVAL_KEY)
        if not isinstance(answer, types.ElicitResult):
            return Approval(approved=False, reason="the client sent no answer to the question")
        return read_answer(answer, can_remember=remember)
