"""gtm.tls without sockets: configuration, identities, expiry gauge, reload of files."""

from __future__ import annotations

import datetime as dt
import logging
import ssl
from pathlib import Path

import pytest

from gtm.clock import FakeClock
from gtm.errors import ConfigError
from gtm.metrics import new_registry
from gtm.pki import CertificateAuthority
from gtm.tls import (
    EXPIRY_WARNING_DAYS,
    PeerIdentityError,
    Side,
    TlsConfig,
    TlsError,
    TlsMaterial,
    build_context,
    cert_info,
    check_peer,
    client_session_options,
    identity_uri,
    matches,
    peer_identities,
)

DAY = 86400.0


def _at(clock: FakeClock, seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(clock.wall() + seconds, dt.UTC)


def _files(
    tmp_path: Path,
    ca: CertificateAuthority,
    identity: str,
    *,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> TlsConfig:
    ca_path = ca.write(tmp_path / "ca.pem")
    issued = ca.issue(identity, not_before=not_before, not_after=not_after)
    cert, key = issued.write(tmp_path / "cert.pem", tmp_path / "key.pem")
    return TlsConfig(ca_path, cert, key, peers=("region/*",))


def _expiry(registry: object, role: str, identity: str) -> float | None:
    value = registry.get_sample_value(  # type: ignore[attr-defined]
        "gtm_tls_certificate_expiry_seconds", {"role": role, "identity": identity}
    )
    return None if value is None else float(value)


def test_no_tls_options_means_no_tls() -> None:
    assert TlsConfig.from_options(ca=None, cert=None, key=None) is None


def test_some_tls_options_name_the_missing_ones() -> None:
    with pytest.raises(ConfigError, match="missing --tls-ca, --tls-key"):
        TlsConfig.from_options(ca=None, cert="c.pem", key=None)


@pytest.mark.parametrize("pattern", ["region", "REGION/x", "region/eu west", "/x", "region/"])
def test_bad_identity_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ConfigError, match="invalid TLS identity pattern"):
        TlsConfig(Path("ca"), Path("c"), Path("k"), peers=(pattern,))


def test_identity_uri_is_spiffe_and_validated() -> None:
    assert identity_uri("region/eu-west") == "spiffe://gtm/region/eu-west"
    with pytest.raises(ConfigError, match="KIND/NAME"):
        identity_uri("eu-west")


def test_peer_identities_keep_only_gtm_uris() -> None:
    peercert = {
        "subjectAltName": (
            ("DNS", "region.example"),
            ("URI", "spiffe://other/region/eu-west"),
            ("URI", "spiffe://gtm/region/eu-west"),
        )
    }
    assert peer_identities(peercert) == ("region/eu-west",)
    assert peer_identities(None) == ()
    assert matches(("region/eu-west",), ("zone/*", "region/eu-*")) == "region/eu-west"
    assert matches(("region/eu-west",), ("region/us-*",)) is None


def test_check_peer_refuses_with_both_identities_named(caplog: pytest.LogCaptureFixture) -> None:
    peercert = {"subjectAltName": (("URI", "spiffe://gtm/zone/eu-west-a"),)}
    with pytest.raises(PeerIdentityError, match=r"names zone/eu-west-a; expected region/\*"):
        check_peer(peercert, ("region/*",), Side.CLIENT)
    assert isinstance(PeerIdentityError("x"), ssl.SSLCertVerificationError)
    assert "TLS server identity refused" in caplog.text
    assert check_peer(peercert, ("zone/*",), Side.SERVER) == "zone/eu-west-a"


def test_client_session_options_without_tls_add_nothing() -> None:
    assert client_session_options(None) == {}


def test_contexts_require_peer_certificates(tmp_path: Path) -> None:
    config = _files(tmp_path, CertificateAuthority.create(), "region/eu-west")
    server = build_context(config, Side.SERVER)
    client = build_context(config, Side.CLIENT)
    front_door = build_context(config, Side.SERVER, client_certs=False)
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert client.verify_mode == ssl.CERT_REQUIRED
    assert front_door.verify_mode == ssl.CERT_NONE
    assert client.gtm_patterns == ("region/*",)
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2


def test_unloadable_files_name_the_file(tmp_path: Path) -> None:
    config = _files(tmp_path, CertificateAuthority.create(), "region/eu-west")
    other = CertificateAuthority.create().issue("region/x")
    (tmp_path / "key.pem").write_bytes(other.key_pem)  # a key that is not the cert's
    with pytest.raises(TlsError, match=r"key\.pem.*key belongs to the certificate"):
        build_context(config, Side.SERVER)
    (tmp_path / "ca.pem").write_text("not a certificate")
    with pytest.raises(TlsError, match=r"ca\.pem"):
        cert_info(config.ca)


def test_expiry_gauge_counts_down_on_the_injected_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    ca = CertificateAuthority.create(not_before=_at(clock, -DAY), not_after=_at(clock, 900 * DAY))
    config = _files(
        tmp_path, ca, "region/eu-west", not_before=_at(clock, -DAY), not_after=_at(clock, 90 * DAY)
    )
    registry = new_registry()
    material = TlsMaterial(config, clock=clock, registry=registry)
    assert material.identity == "region/eu-west"
    assert _expiry(registry, "certificate", "region/eu-west") == pytest.approx(90 * DAY, abs=1)
    assert _expiry(registry, "ca", "CN=gtm local CA") == pytest.approx(900 * DAY, abs=1)
    clock.advance_nowait(10 * DAY)
    material.check_expiry()
    assert _expiry(registry, "certificate", "region/eu-west") == pytest.approx(80 * DAY, abs=1)


def test_expiry_timestamp_is_not_after_and_does_not_move(tmp_path: Path) -> None:
    # What alerts compare with time(): the notAfter itself, the same at every check.
    clock = FakeClock()
    ca = CertificateAuthority.create(not_before=_at(clock, -DAY), not_after=_at(clock, 900 * DAY))
    config = _files(
        tmp_path, ca, "zone/a", not_before=_at(clock, -DAY), not_after=_at(clock, 20 * DAY)
    )
    registry = new_registry()
    material = TlsMaterial(config, clock=clock, registry=registry)
    name = "gtm_tls_cert_expiry_timestamp_seconds"
    leaf = {"cert": "certificate", "identity": "zone/a"}
    expected = _at(clock, 20 * DAY).timestamp()
    assert registry.get_sample_value(name, leaf) == pytest.approx(expected, abs=1)
    clock.advance_nowait(5 * DAY)
    material.check_expiry()
    assert registry.get_sample_value(name, leaf) == pytest.approx(expected, abs=1)
    ca_labels = {"cert": "ca", "identity": "CN=gtm local CA"}
    assert registry.get_sample_value(name, ca_labels) == pytest.approx(
        _at(clock, 895 * DAY).timestamp(), abs=1
    )


def test_warning_once_when_within_30_days(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    ca = CertificateAuthority.create(not_before=_at(clock, -DAY), not_after=_at(clock, 900 * DAY))
    config = _files(
        tmp_path, ca, "zone/a", not_before=_at(clock, -DAY), not_after=_at(clock, 31 * DAY)
    )
    material = TlsMaterial(config, clock=clock, registry=new_registry())
    assert "expires in" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="gtm.tls"):
        clock.advance_nowait(2 * DAY)
        material.check_expiry()
        material.check_expiry()
    warnings = [r for r in caplog.records if "expires in 29.0 days" in r.getMessage()]
    assert len(warnings) == 1
    assert EXPIRY_WARNING_DAYS == 30


def test_reload_swaps_certificate_and_gauge_labels(tmp_path: Path) -> None:
    clock = FakeClock()
    ca = CertificateAuthority.create(not_before=_at(clock, -DAY), not_after=_at(clock, 900 * DAY))
    config = _files(
        tmp_path, ca, "zone/a", not_before=_at(clock, -DAY), not_after=_at(clock, 60 * DAY)
    )
    registry = new_registry()
    material = TlsMaterial(config, clock=clock, registry=registry)
    material.server_context()
    assert material.reload_if_changed() is False  # nothing changed
    ca.issue("zone/b", not_before=_at(clock, -DAY), not_after=_at(clock, 300 * DAY)).write(
        config.cert, config.key
    )
    assert material.reload_if_changed() is True
    assert material.identity == "zone/b"
    assert _expiry(registry, "certificate", "zone/a") is None
    assert _expiry(registry, "certificate", "zone/b") == pytest.approx(300 * DAY, abs=1)


def test_half_written_files_keep_the_old_certificate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _files(tmp_path, CertificateAuthority.create(), "zone/a")
    material = TlsMaterial(config, clock=FakeClock(), registry=new_registry())
    material.client_context()
    config.cert.write_bytes(config.cert.read_bytes()[:100])  # a rotation caught mid-write
    assert material.reload_if_changed() is False
    assert material.identity == "zone/a"
    assert "do not load yet, keeping the old ones" in caplog.text
