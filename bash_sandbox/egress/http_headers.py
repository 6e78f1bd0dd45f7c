"""What of an HTTP/1.1 message the proxy relays: the end-to-end headers, framed one way.

Hop-by-hop fields (RFC 9110 7.6.1) and those the `Connection` header names stay on their
hop. A message with both `Transfer-Encoding` and `Content-Length` loses the length (RFC 9112
6.3: an intermediary must remove it): h11 framed the body by its transfer coding, and an
upstream that reads the length instead would take the rest as a new request on the kept
connection, one the proxy never checked (a red team had a secret injected into it).
"""

from __future__ import annotations

from collections.abc import Sequence

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
    }
)


def forwardable(
    headers: Sequence[tuple[bytes, bytes]], drop: frozenset[bytes] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """``headers`` without hop-by-hop fields, those the Connection header names, ``drop``,
    and a `Content-Length` beside a `Transfer-Encoding`."""
    listed = {
        token.strip().lower()
        for key, value in headers
        if key == b"connection"
        for token in value.split(b",")
    }
    if any(key == b"transfer-encoding" for key, _ in headers):
        listed.add(b"content-length")
    return [(k, v) for k, v in headers if k not in HOP_BY_HOP and k not in listed and k not in drop]
