"""Per-command grants: who is asking the proxy, which allowlist applies, where denials go.

The executor registers each command and gets a `ProxyGrant`: an unguessable token and that
command's allowlist. The command's proxy URL carries the token as userinfo, so its clients
send ``Proxy-Authorization: Basic base64("bsx-<token>:x")`` and the proxy knows whose request
it is. A request without a valid token (a tool that drops proxy credentials, a JVM, a token
of a closed grant) is served under the executor's base list, and its denials go to every
grant registered at that moment: the proxy cannot tell which command asked, so each of them
is told.

Grants are touched from two threads: the executor registers, reads and closes them; the
proxy's loop looks them up and records denials. Every shared field sits behind one lock,
held only for dictionary and list operations, so neither side ever waits on the other.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import threading
from collections.abc import Callable

from bash_sandbox.egress.admission import EgressDenial
from policies.egress import EgressRule, parse_allowlist

TOKEN_PREFIX = "bsx-"  # noqa: S105 (a user-name prefix, not a secret)


def token_from_proxy_authorization(value: bytes) -> str | None:
    """The grant token in a ``Proxy-Authorization: Basic`` value, or None."""
    scheme, _, credentials = value.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user = decoded.partition(":")[0]
    if not user.startswith(TOKEN_PREFIX):
        return None
    return user[len(TOKEN_PREFIX) :] or None


class ProxyGrant:
    """One registered command: its token, its allowlist and the denials it met."""

    def __init__(
        self,
        *,
        token: str,
        allow: tuple[str, ...],
        rules: tuple[EgressRule, ...],
        environment: Callable[[str], dict[str, str]],
        max_denials: int,
        on_close: Callable[[ProxyGrant], None],
    ) -> None:
        self._token = token
        self.allow = allow
        self.rules = rules
        self._environment = environment
        self._max_denials = max_denials
        self._on_close = on_close
        self._lock = threading.Lock()
        self._denials: list[EgressDenial] = []
        self._denials_total = 0
        self._notes: dict[str, None] = {}
        self._closed = False

    @property
    def token(self) -> str:
        return self._token

    @property
    def closed(self) -> bool:
        return self._closed

    def environment(self) -> dict[str, str]:
        """The proxy variables for this command (see `bash_sandbox.egress.environment`)."""
        return self._environment(self._token)

    def denials(self) -> list[EgressDenial]:
        """The first denials this command met, oldest first (a copy)."""
        with self._lock:
            return list(self._denials)

    @property
    def denials_total(self) -> int:
        """Every denial counted, also those past the kept ones."""
        with self._lock:
            return self._denials_total

    def notes(self) -> list[str]:
        """What the proxy did on the operator's say-so (a pinned answer used), in order."""
        with self._lock:
            return list(self._notes)

    def note(self, text: str) -> None:
        with self._lock:
            if len(self._notes) < self._max_denials:
                self._notes.setdefault(text, None)

    def record(self, denial: EgressDenial) -> None:
        with self._lock:
            self._denials_total += 1
            if len(self._denials) < self._max_denials:
                self._denials.append(denial)

    def close(self) -> None:
        """Revoke the token and close this command's open proxy connections. Idempotent;
        never blocks (the connections are closed on the proxy's own loop)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._on_close(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<ProxyGrant {state} allow={self.allow!r}>"


class GrantTable:
    """The registered grants by token, plus the executor's base list."""

    def __init__(self, base_allow: tuple[str, ...], *, max_denials: int) -> None:
        self.base_rules = parse_allowlist(base_allow)
        self._max_denials = max_denials
        self._lock = threading.Lock()
        self._by_token: dict[str, ProxyGrant] = {}

    def register(
        self,
        allow: tuple[str, ...],
        *,
        environment: Callable[[str], dict[str, str]],
        on_close: Callable[[ProxyGrant], None],
    ) -> ProxyGrant:
        rules = parse_allowlist(allow)  # a bad entry raises before anything is registered

        def closed(grant: ProxyGrant) -> None:
            with self._lock:
                self._by_token.pop(grant.token, None)
            on_close(grant)

        grant = ProxyGrant(
            token=secrets.token_hex(16),  # 128 bits: not guessable by a neighbour command
            allow=tuple(rule.text for rule in rules),
            rules=rules,
            environment=environment,
            max_denials=self._max_denials,
            on_close=closed,
        )
        with self._lock:
            self._by_token[grant.token] = grant
        return grant

    def lookup(self, token: str | None) -> ProxyGrant | None:
        if token is None:
            return None
        with self._lock:
            return self._by_token.get(token)

    def record(self, grant: ProxyGrant | None, denial: EgressDenial) -> None:
        """Give ``denial`` to ``grant``; when the asker is unknown (no token), to none: a
        denial is evidence about its command, and any command of the executor (one without
        a grant too) could send a request without a token into another's facts (a red
        team's made a concurrent `sleep; exit 1` report `network_denied` and an attacker's
        domain to allow). Every open grant gets a note instead."""
        if grant is not None:
            grant.record(denial)
            return
        with self._lock:
            everyone = tuple(self._by_token.values())
        for each in everyone:
            each.note(
                f"a request without this sandbox's proxy token was refused ({denial.message()}); "
                "which command sent it is not known"
            )

    def note(self, grant: ProxyGrant | None, text: str) -> None:
        """Give ``text`` to ``grant``, or to every open grant when the asker is unknown."""
        if grant is not None:
            grant.note(text)
            return
        with self._lock:
            everyone = tuple(self._by_token.values())
        for each in everyone:
            each.note(text)

    def close_all(self) -> None:
        with self._lock:
            grants = tuple(self._by_token.values())
        for grant in grants:
            grant.close()
