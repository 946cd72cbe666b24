"""Test PKI for the TLS integration tests: one CA, certificates issued per test."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gtm.pki import CertificateAuthority
from gtm.tls import TlsConfig


class Pki:
    """A CA in a temporary directory that writes TlsConfigs for identities."""

    def __init__(self, directory: Path, ca: CertificateAuthority | None = None) -> None:
        self.directory = directory
        self.ca = ca or CertificateAuthority.create("gtm test CA")
        self.ca_path = self.ca.write(directory / "ca.pem")

    def config(
        self,
        identity: str,
        *,
        peers: tuple[str, ...] = (),
        clients: tuple[str, ...] = (),
        name: str | None = None,
        not_before: dt.datetime | None = None,
        not_after: dt.datetime | None = None,
    ) -> TlsConfig:
        stem = name or identity.replace("/", "-")
        issued = self.ca.issue(identity, not_before=not_before, not_after=not_after)
        cert, key = issued.write(self.directory / f"{stem}.pem", self.directory / f"{stem}-key.pem")
        return TlsConfig(self.ca_path, cert, key, peers, clients)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
def other_pki(tmp_path: Path) -> Pki:
    (tmp_path / "other").mkdir()
    return Pki(tmp_path / "other")
