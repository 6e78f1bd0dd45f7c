"""`ProxyLimits`: the bounds that keep one misbehaving client from stalling the egress proxy.

Every wait the proxy does is bounded by one of these, so a slowloris client, a huge header
block or a flood of connections costs a bounded amount of time and memory, and is answered
with 408, 431 or 503 rather than left hanging.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt

_Positive = Annotated[StrictInt, Field(gt=0)]
_Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class ProxyLimits(BaseModel):
    """Bounds of the egress proxy; defaults no package manager or git clone reaches."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # A request head (request line plus headers) larger than this is answered 431.
    max_header_bytes: _Positive = 64 * 1024
    # Open client connections, in total and per command (requests without a token share one
    # count); the next one is answered 503 and closed. A tunnel holds six descriptors (two
    # sockets, two splice pipes): 128 stay well inside the common 1024-descriptor limit.
    max_connections: _Positive = 128
    max_connections_per_grant: _Positive = 64
    # Requests without a token (any command of the executor can send them): a small count
    # of their own, so one command's 64 plus these never hold every slot (a red team's did).
    max_connections_anonymous: _Positive = 8
    # From accept (or the first byte of a keep-alive request) to a complete request head: 408.
    request_head_timeout_s: _Seconds = 10.0
    # Resolving the name and connecting upstream, together: 504.
    connect_timeout_s: _Seconds = 10.0
    # No byte in either direction of a tunnel or forwarded exchange, or between two requests
    # on a kept-alive connection: the connection is closed.
    idle_timeout_s: _Seconds = 300.0
    # Denials kept per grant (every denial is counted; only the first ones are kept).
    max_denials_per_grant: _Positive = 256
