"""The executor's own certificate authority, for the domains whose credentials the proxy injects.

Made at the first spawn that needs it, with `cryptography`: an ECDSA P-256 key and a CA
certificate (``bash-sandbox egress CA``, path length 0, valid for 30 days), then one leaf per
credential domain, signed by it. The keys live only in this process's memory; the server
contexts load them from an anonymous memfd that is closed at once, so no file anywhere (and
nothing a confined command can open) ever holds a key. Confined commands trust the CA
through a bundle (the system's roots plus this CA's certificate) that `bundle_pem()`
returns; it is trusted nowhere else.
"""

from __future__ import annotations

import datetime
import os
import ssl
import threading

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=30)
_BACKDATE = datetime.timedelta(hours=1)  # tolerate a little clock skew in the sandbox
# Where the system's roots are, when Python's own default does not name a file.
_SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def system_bundle_pem(extra_files: tuple[str, ...] = ()) -> bytes:
    """The host's trusted roots (and ``extra_files``, e.g. the user's own SSL_CERT_FILE),
    concatenated; empty when none is found."""
    paths = ssl.get_default_verify_paths()
    candidates = [p for p in (paths.cafile, paths.openssl_cafile) if p]
    candidates += [p for p in _SYSTEM_BUNDLES if p not in candidates]
    chunks: list[bytes] = []
    for path in candidates:
        try:
            with open(path, "rb") as fh:
                chunks.append(fh.read())
        except OSError:
            continue
        break
    for path in extra_files:
        try:
            with open(path, "rb") as fh:
                chunks.append(fh.read())
        except OSError:
            continue
    return b"\n".join(chunk.strip() + b"\n" for chunk in chunks)


class EgressAuthority:
    """A per-executor CA and the TLS server contexts of the domains it impersonates."""

    def __init__(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bash-sandbox egress CA")])
        self._name = name
        self._not_before = now - _BACKDATE
        self._not_after = now + _VALIDITY
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self._lock = threading.Lock()
        self._contexts: dict[str, ssl.SSLContext] = {}

    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def server_context(self, domain: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for ``domain`` signed by this CA (cached)."""
        with self._lock:
            context = self._contexts.get(domain)
            if context is None:
                context = self._contexts[domain] = self._make_context(domain)
            return context

    def _make_context(self, domain: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, domain)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(domain)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        pem = leaf.public_bytes(serialization.Encoding.PEM) + self.certificate_pem() + _pem_key(key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])  # the proxy speaks HTTP/1.1 to the client
        # An anonymous file: the key is loaded from memory, never from a path on disk.
        fd = os.memfd_create("bsx-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return context
