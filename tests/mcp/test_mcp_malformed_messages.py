"""Every request with an id gets an answer: garbage and malformed messages over real stdio.

A client waits on the id it sent; the SDK's transport used to drop what it could not
validate, so such a client hung. Each case is sent to a real server process, the answer is
read with a bounded timeout, and the server is shown to keep serving afterwards.
"""

from __future__ import annotations

import json

import mcp_types as types
import pytest
from mcp_probes import ServerLauncher

CASES = [
    # (raw line, expected code, expected id)
    (b"garbage{", types.PARSE_ERROR, None),
    (b'{"jsonrpc": "2.0", "id": 7}', types.INVALID_REQUEST, 7),
    (b'{"jsonrpc": "2.0", "id": "abc", "method": 5}', types.INVALID_REQUEST, "abc"),
    (b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": 1}', types.INVALID_REQUEST, 9),
    (b"[1, 2]", types.INVALID_REQUEST, None),
    (b'{"jsonrpc": "2.0", "id": 11, "method": "no/such/method"}', types.METHOD_NOT_FOUND, 11),
]


def test_every_malformed_request_is_answered_and_serving_goes_on(launcher: ServerLauncher) -> None:
    server = launcher.popen()
    server.initialize()
    assert server.proc.stdin is not None
    for line, code, request_id in CASES:
        server.proc.stdin.write(line + b"\n")
        server.proc.stdin.flush()
        reply = json.loads(server.read_line(timeout=15))
        assert reply["jsonrpc"] == "2.0"
        assert reply["id"] == request_id, (line, reply)
        assert reply["error"]["code"] == code, (line, reply)
        # Still serving: a real request right after is answered.
        listed = server.request("tools/list")
        assert "bash_run" in {tool["name"] for tool in listed["result"]["tools"]}
    server.proc.stdin.close()
    assert server.wait_exit(timeout=30) == 0


@pytest.mark.parametrize("line", [b"\xff\xfe not utf-8", b"{}", b"null"])
def test_even_an_answer_with_a_null_id_comes_before_the_next_one(
    launcher: ServerLauncher, line: bytes
) -> None:
    server = launcher.popen()
    server.initialize()
    assert server.proc.stdin is not None
    server.proc.stdin.write(line + b"\n")
    server.proc.stdin.flush()
    reply = json.loads(server.read_line(timeout=15))
    assert reply["id"] is None
    assert reply["error"]["code"] in (types.PARSE_ERROR, types.INVALID_REQUEST)
