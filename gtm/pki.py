"""A small certificate authority for ``gtm up --tls`` and the tests: never for production.

Certificates carry gtm identities as ``spiffe://gtm/KIND/NAME`` URI SANs (see
:mod:`gtm.tls`), plus ``localhost``/loopback SANs so ordinary tools (``curl --cacert``)
can talk to a local deployment. Keys are ECDSA P-256: generated in milliseconds, and
supported by every TLS 1.2/1.3 stack.

:func:`ensure_local_pki` is what ``gtm up --tls`` runs: the CA and one certificate per
identity are written into a directory on first run and reused afterwards; a missing or
soon-expiring certificate is re-issued from the same CA, so clients that trust the CA
keep working.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gtm.tls import EXPIRY_WARNING_DAYS, identity_uri

#: Validity of a local CA and of the certificates it issues. One year for leaves, so a
#: long-lived local setup meets the expiry warning (30 days) and the re-issue path.
CA_DAYS = 3650
LEAF_DAYS = 365

_LOOPBACK_SANS: tuple[x509.GeneralName, ...] = (
    x509.DNSName("localhost"),
    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    x509.IPAddress(ipaddress.ip_address("::1")),
)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    # Write beside and rename: a reader (gtm's reload) never sees half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class IssuedCert:
    """A certificate and its private key, in PEM."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, cert_path: Path, key_path: Path) -> tuple[Path, Path]:
        _write(key_path, self.key_pem, private=True)
        _write(cert_path, self.cert_pem)
        return cert_path, key_path


@dataclass(frozen=True, slots=True)
class LeafFiles:
    """Where one identity's certificate and key are."""

    cert: Path
    key: Path


class CertificateAuthority:
    """A self-signed CA that issues gtm identity certificates."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self._key = key
        self.cert = cert

    @classmethod
    def create(
        cls,
        name: str = "gtm local CA",
        *,
        not_before: dt.datetime | None = None,
        not_after: dt.datetime | None = None,
    ) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        start = not_before or _now() - dt.timedelta(minutes=5)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(not_after or start + dt.timedelta(days=CA_DAYS))
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
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @classmethod
    def load(cls, cert_path: Path, key_path: Path) -> CertificateAuthority:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path} is not an EC private key")
        return cls(key, x509.load_pem_x509_certificate(cert_path.read_bytes()))

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def write(self, cert_path: Path, key_path: Path | None = None) -> Path:
        """Write the CA certificate (and, if ``key_path``, its key)."""
        if key_path is not None:
            _write(key_path, _key_pem(self._key), private=True)
        _write(cert_path, self.cert_pem)
        return cert_path

    def issue(
        self,
        identity: str | None,
        *,
        common_name: str | None = None,
        hosts: Iterable[str] = (),
        loopback: bool = True,
        not_before: dt.datetime | None = None,
        not_after: dt.datetime | None = None,
    ) -> IssuedCert:
        """A certificate for ``identity`` (``KIND/NAME``; None: no gtm identity), usable
        as both TLS server and client. ``hosts`` adds DNS names or IP addresses as SANs;
        ``common_name`` sets the subject CN (etcd maps a client certificate's CN to its
        user)."""
        key = ec.generate_private_key(ec.SECP256R1())
        start = not_before or _now() - dt.timedelta(minutes=5)
        sans: list[x509.GeneralName] = []
        if identity is not None:
            sans.append(x509.UniformResourceIdentifier(identity_uri(identity)))
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        if loopback:
            sans.extend(s for s in _LOOPBACK_SANS if s not in sans)
        cn = common_name or identity or "gtm"
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(not_after or start + dt.timedelta(days=LEAF_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return IssuedCert(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _file_stem(identity: str) -> str:
    return identity.replace("/", "-")


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    found = {str(a) for a in san.get_values_for_type(x509.IPAddress)}
    return found | set(san.get_values_for_type(x509.DNSName))


def _needs_issue(
    cert_path: Path, key_path: Path, ca: CertificateAuthority, hosts: Iterable[str]
) -> bool:
    if not (cert_path.is_file() and key_path.is_file()):
        return True
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError:
        return True
    if cert.issuer != ca.cert.subject:
        return True
    if not {str(_host(h)) for h in hosts} <= _names(cert):
        return True  # the deployment moved to an address the certificate does not name
    left = cert.not_valid_after_utc - _now()
    return left < dt.timedelta(days=EXPIRY_WARNING_DAYS)


def _host(host: str) -> object:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return host


@dataclass(frozen=True, slots=True)
class LocalPki:
    """A directory with a CA and one certificate per identity."""

    directory: Path
    ca_cert: Path
    leaves: dict[str, LeafFiles]
    created: tuple[str, ...]  # identities (and "ca") written by this call

    def files(self, identity: str) -> LeafFiles:
        return self.leaves[identity]


def ensure_local_pki(
    directory: Path,
    identities: Iterable[str],
    hosts: Mapping[str, Sequence[str]] | None = None,
) -> LocalPki:
    """The CA in ``directory`` (made on first use) and a certificate for every identity
    (issued when missing, from another CA, not naming its ``hosts[identity]`` addresses,
    or within 30 days of expiry)."""
    hosts = hosts or {}
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca_cert, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    created: list[str] = []
    if ca_cert.is_file() and ca_key.is_file():
        ca = CertificateAuthority.load(ca_cert, ca_key)
    else:
        ca = CertificateAuthority.create()
        ca.write(ca_cert, ca_key)
        created.append("ca")
    leaves: dict[str, LeafFiles] = {}
    for identity in identities:
        stem = _file_stem(identity)
        cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}-key.pem"
        wanted = tuple(hosts.get(identity, ()))
        if _needs_issue(cert_path, key_path, ca, wanted):
            ca.issue(identity, hosts=wanted).write(cert_path, key_path)
            created.append(identity)
        leaves[identity] = LeafFiles(cert_path, key_path)
    return LocalPki(directory, ca_cert, leaves, tuple(created))
