"""Credentials that never enter the sandbox: placeholders outside, real values on the wire.

`CredentialVault` reads each configured secret once (from the executor's environment or a
file) and makes a random placeholder for it (``bsxph_`` and 40 hex digits). A confined
command is given the placeholder only: in the credential's variable and, for a credential
with a ``username``, as the password a git credential helper answers for
``https://<domain>`` (configured through ``GIT_CONFIG_COUNT``, no file). The proxy
terminates TLS for the credential domains only (`intercept.py`) and, on each request there,
replaces the domain's own placeholders with their secrets in the request headers that carry
credentials (`CREDENTIAL_HEADERS`: ``Authorization``, including inside ``Basic`` credentials,
``PRIVATE-TOKEN``, ``X-API-Key``, ...; never ``Host``, ``Origin`` or others a server echoes).
A request carrying any *other* domain's placeholder, or any placeholder over plain HTTP, is
refused (403) and recorded: a command cannot use the proxy to send a credential where it does
not belong, and the secret itself never crosses into the sandbox (not in its environment, its
files, or its memory).

The CA bundle the sandbox trusts (the system's roots plus the executor's CA) is written
into the executor's private ``/tmp`` (``/tmp/.bash-sandbox-egress-ca.pem``), rewritten
whenever a command removed or changed it; the CA's key is never written anywhere.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bash_sandbox.safe_read import read_regular
from policies.egress import EgressCredential

if TYPE_CHECKING:
    from bash_sandbox.egress.authority import EgressAuthority

PLACEHOLDER_PREFIX = "bsxph_"
BUNDLE_NAME = ".bash-sandbox-egress-ca.pem"
SANDBOX_BUNDLE = f"/tmp/{BUNDLE_NAME}"
# Every variable the common clients read for their trust roots.
_CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "npm_config_cafile",
)
_MAX_SECRET_BYTES = 16 * 1024
# The only request headers a secret is put into: those that carry credentials. Never the
# rest (Host, Origin, Referer, User-Agent, Cookie, X-Anything): servers echo those back (CORS
# reflects Origin, redirects and error pages name the Host), which would hand the secret to
# the sandbox that asked for it.
CREDENTIAL_HEADERS = frozenset(
    {
        b"authorization",
        b"private-token",  # GitLab
        b"job-token",  # GitLab CI
        b"x-api-key",
        b"api-key",
        b"x-auth-token",
    }
)


class CredentialError(ValueError):
    """A configured credential cannot be used (its source is missing, empty or unsafe)."""

    code = "CREDENTIAL_UNAVAILABLE"


@dataclass(frozen=True)
class _Entry:
    spec: EgressCredential
    placeholder: str
    secret: str


def _read_secret(spec: EgressCredential, environ: Mapping[str, str]) -> str:
    kind, _, where = spec.source.partition(":")
    if kind == "env":
        from bash_sandbox.environment import is_sandbox_inherited

        value = environ.get(where, "")
        # By the very rule the commands' environment is built with (`LC_*` names too).
        if is_sandbox_inherited(where, value):
            raise CredentialError(
                f"credential for {spec.domain}: {where} is passed to every command; keep "
                "the secret in a variable of its own"
            )
    else:
        try:
            value = read_regular(where, _MAX_SECRET_BYTES + 1).decode("utf-8", "replace")
        except OSError as exc:
            raise CredentialError(
                f"credential for {spec.domain}: cannot read {where}: {exc.strerror}"
            ) from None
        value = value.strip()
    if not value:
        raise CredentialError(f"credential for {spec.domain}: {spec.source} is empty or unset")
    if len(value) > _MAX_SECRET_BYTES or not value.isprintable():
        raise CredentialError(
            f"credential for {spec.domain}: {spec.source} is not a one-line printable secret"
        )
    return value


class CredentialVault:
    """The configured secrets, their placeholders, and the CA that serves their domains."""

    def __init__(
        self,
        credentials: Sequence[EgressCredential],
        *,
        environ: Mapping[str, str] | None = None,
        bundle_dir_fd: int | None = None,
    ) -> None:
        """``bundle_dir_fd``: the executor's private /tmp (its tmpfs root), where the trust
        bundle is written for the commands; None writes nothing (tests of the proxy alone).
        Raises `CredentialError`."""
        environ = environ if environ is not None else os.environ
        self._entries = tuple(
            _Entry(spec, PLACEHOLDER_PREFIX + secrets.token_hex(20), _read_secret(spec, environ))
            for spec in credentials
        )
        # `cryptography` is loaded only by an executor with credentials.
        from bash_sandbox.egress.authority import EgressAuthority, system_bundle_pem

        self.authority: EgressAuthority = EgressAuthority()
        user_bundle = tuple(p for p in (environ.get("SSL_CERT_FILE"),) if p and os.path.isfile(p))
        self._bundle = system_bundle_pem(user_bundle) + self.authority.certificate_pem()
        self._bundle_dir_fd = bundle_dir_fd

    @property
    def domains(self) -> frozenset[str]:
        return frozenset(e.spec.domain for e in self._entries)

    def placeholder(self, domain: str, index: int = 0) -> str:
        """The placeholder of ``domain``'s ``index``-th credential (tests, diagnostics)."""
        return [e.placeholder for e in self._entries if e.spec.domain == domain][index]

    def upstream_ca_file(self, domain: str) -> str | None:
        for entry in self._entries:
            if entry.spec.domain == domain and entry.spec.upstream_ca_file:
                return entry.spec.upstream_ca_file
        return None

    def bundle_pem(self) -> bytes:
        return self._bundle

    def sandbox_environment(self) -> dict[str, str]:
        """What a command is given: placeholders, the git helpers, the trust bundle."""
        env: dict[str, str] = {}
        helpers: list[tuple[str, str]] = []
        for entry in self._entries:
            spec = entry.spec
            if spec.env:
                env[spec.env] = entry.placeholder
            if spec.username:
                helpers.append(("credential.helper", _git_helper(spec, entry.placeholder)))
        if helpers:
            env["GIT_CONFIG_COUNT"] = str(len(helpers))
            for index, (key, value) in enumerate(helpers):
                env[f"GIT_CONFIG_KEY_{index}"] = key
                env[f"GIT_CONFIG_VALUE_{index}"] = value
        if self._bundle_dir_fd is not None:
            self._write_bundle()
            env |= dict.fromkeys(_CA_VARIABLES, SANDBOX_BUNDLE)
        return env

    def _write_bundle(self) -> None:
        """The bundle in the private /tmp, unless it is already there intact (a command may
        have removed or changed it: each spawn puts it back). Atomic: written, then renamed."""
        fd = self._bundle_dir_fd
        assert fd is not None
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        with contextlib.suppress(OSError), open(os.open(BUNDLE_NAME, flags, dir_fd=fd), "rb") as fh:
            if fh.read(len(self._bundle) + 1) == self._bundle:
                return
        temp = f"{BUNDLE_NAME}.{secrets.token_hex(6)}"
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        try:
            with open(out, "wb") as fh:
                fh.write(self._bundle)
            os.rename(temp, BUNDLE_NAME, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=fd)
            raise

    # -- the proxy's side ------------------------------------------------------------------

    def foreign_placeholder(
        self, domain: str | None, target: bytes, headers: Sequence[tuple[bytes, bytes]]
    ) -> str | None:
        """The domain whose placeholder this request carries though it goes to ``domain``
        (None: plain HTTP, where no placeholder may go), or None when it carries none."""
        texts = [target, *(v for _, v in headers), *_decoded_basic(headers)]
        for entry in self._entries:
            if entry.spec.domain == domain:
                continue
            needle = entry.placeholder.encode()
            if any(needle in text for text in texts):
                return entry.spec.domain
        return None

    def inject(
        self, domain: str, headers: Sequence[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        """``headers`` with ``domain``'s placeholders replaced by their secrets, in the
        `CREDENTIAL_HEADERS` only (elsewhere the placeholder goes out as it is)."""
        own = [e for e in self._entries if e.spec.domain == domain]
        out: list[tuple[bytes, bytes]] = []
        for name, value in headers:
            new = value
            if name.lower() not in CREDENTIAL_HEADERS:
                out.append((name, new))
                continue
            for entry in own:
                needle, secret = entry.placeholder.encode(), entry.secret.encode()
                new = new.replace(needle, secret)
                if name == b"authorization":
                    new = _replace_in_basic(new, needle, secret)
            out.append((name, new))
        return out


def _git_helper(spec: EgressCredential, placeholder: str) -> str:
    """A git credential helper answering the placeholder for https://domain[:port] only
    (git's URL-scoped helper keys would need the exact port)."""
    answer = f"username={spec.username}\\npassword={placeholder}\\n"
    host = spec.domain
    return (
        '!f() { test "$1" = get || exit 0; h=; p=; '
        'while IFS= read -r l && [ -n "$l" ]; do case "$l" in '
        'host=*) h="${l#host=}";; protocol=*) p="${l#protocol=}";; esac; done; '
        f'[ "$p" = https ] || exit 0; case "$h" in {host}|{host}:*) '
        f"printf '{answer}';; esac; }}; f"
    )


def _decoded_basic(headers: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    out = []
    for name, value in headers:
        if name not in (b"authorization", b"proxy-authorization"):
            continue
        scheme, _, data = value.strip().partition(b" ")
        if scheme.lower() == b"basic":
            with contextlib.suppress(binascii.Error, ValueError):
                out.append(base64.b64decode(data.strip(), validate=True))
    return out


def _replace_in_basic(value: bytes, needle: bytes, secret: bytes) -> bytes:
    scheme, _, data = value.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return value
    try:
        decoded = base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError):
        return value
    if needle not in decoded:
        return value
    return scheme + b" " + base64.b64encode(decoded.replace(needle, secret))


def credential_vault(
    credentials: Sequence[EgressCredential], bundle_dir_fd: int
) -> CredentialVault | None:
    """The vault for an executor's configured ``credentials`` (None without any); its
    trust bundle goes into the directory ``bundle_dir_fd`` (the private /tmp)."""
    return CredentialVault(credentials, bundle_dir_fd=bundle_dir_fd) if credentials else None


def share_bundle(root_fd: int, domain: str) -> None:
    """The trust bundle of the tmpfs root ``root_fd`` copied into the trust domain's
    directory there, which is what a command sees as its /tmp (`trust_domain.py`); nothing
    when there is no bundle. Atomic, and only when the copy is missing or changed."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        with open(os.open(BUNDLE_NAME, flags, dir_fd=root_fd), "rb") as fh:
            bundle = fh.read(1 << 22)
    except OSError:
        return
    target = f"{domain}/{BUNDLE_NAME}"
    with contextlib.suppress(OSError), open(os.open(target, flags, dir_fd=root_fd), "rb") as fh:
        if fh.read(len(bundle) + 1) == bundle:
            return
    temp = f"{domain}/.{BUNDLE_NAME}.{secrets.token_hex(6)}"
    out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=root_fd)
    try:
        with open(out, "wb") as fh:
            fh.write(bundle)
        os.rename(temp, target, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=root_fd)
        raise
