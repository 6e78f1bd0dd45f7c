"""Every malformed message on the MCP wire gets a JSON-RPC error, and serving goes on.

The SDK's stdio transport hands a line it cannot validate to the server as an exception,
and its dispatcher drops it (logged at debug level): a client that sent garbage, or a
request with an id but no method, waits forever on that id. `AnsweringReadStream` sits
between the transport and `Server.run`, answers each such item itself, as JSON-RPC 2.0
requires, and passes every well-formed message through unchanged:

- not JSON: -32700 Parse error, id null;
- JSON but not a message (no method, a method that is not a string, params that are not an
  object, a batch array): -32600 Invalid Request, with the message's id when it has a
  usable one, else id null.

Unknown methods (-32601) are the SDK's own answer.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import mcp_types as types
from mcp.shared.message import SessionMessage
from pydantic import ValidationError


def _message_id(exc: ValidationError) -> int | str | None:
    """The id of the rejected object, when it had a usable one."""
    for err in exc.errors():
        data = err.get("input")
        if isinstance(data, dict) and "id" in data:
            found = data["id"]
            if isinstance(found, str) or (isinstance(found, int) and not isinstance(found, bool)):
                return found
    return None


def _first_problem(exc: ValidationError) -> str:
    # The request branch of the union says what a request lacked.
    for err in exc.errors():
        loc = err["loc"]
        if loc and loc[0] == "JSONRPCRequest":
            where = ".".join(str(p) for p in loc[1:]) or "message"
            return f"{where}: {err['msg']}"
    return "not a JSON-RPC 2.0 request, notification or response object"


def answer_for(exc: Exception) -> types.JSONRPCError:
    """The error response for one line the transport could not validate."""
    if isinstance(exc, ValidationError):
        if any(err["type"] == "json_invalid" for err in exc.errors()):
            error = types.ErrorData(code=types.PARSE_ERROR, message="Parse error: not JSON")
            return types.JSONRPCError(jsonrpc="2.0", id=None, error=error)
        error = types.ErrorData(
            code=types.INVALID_REQUEST, message=f"Invalid Request: {_first_problem(exc)}"
        )
        return types.JSONRPCError(jsonrpc="2.0", id=_message_id(exc), error=error)
    error = types.ErrorData(code=types.PARSE_ERROR, message=f"Parse error: {exc}")
    return types.JSONRPCError(jsonrpc="2.0", id=None, error=error)


class AnsweringReadStream:
    """The transport's read stream, with malformed items answered on ``write_stream``
    instead of being passed on (where they would be dropped)."""

    def __init__(self, inner: Any, write_stream: Any) -> None:
        self._inner = inner
        self._write = write_stream

    @property
    def last_context(self) -> Any:
        # The SDK restores the sender's contextvars from here when the stream has them.
        return getattr(self._inner, "last_context", None)

    async def _pass(self, item: SessionMessage | Exception) -> SessionMessage | None:
        if isinstance(item, Exception):
            await self._write.send(SessionMessage(answer_for(item)))
            return None
        return item

    async def receive(self) -> SessionMessage:
        while True:
            item = await self._pass(await self._inner.receive())
            if item is not None:
                return item

    def __aiter__(self) -> AnsweringReadStream:
        return self

    async def __anext__(self) -> SessionMessage:
        while True:
            item = await self._pass(await self._inner.__anext__())
            if item is not None:
                return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> AnsweringReadStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = await self._inner.__aexit__(exc_type, exc_val, exc_tb)
        return result
