"""gtm.pki: the local certificate authority of ``gtm up --tls`` (files on disk, no sockets)."""

from __future__ import annotations

from pathlib import Path

from gtm.pki import ensure_local_pki
from gtm.tls import cert_info


def test_local_pki_is_made_once_then_reused(tmp_path: Path) -> None:
    first = ensure_local_pki(tmp_path / "tls", ["region/eu", "zone/eu-a"])
    assert set(first.created) == {"ca", "region/eu", "zone/eu-a"}
    assert (tmp_path / "tls").stat().st_mode & 0o777 == 0o700
    assert first.files("zone/eu-a").key.stat().st_mode & 0o777 == 0o600
    assert cert_info(first.files("zone/eu-a").cert).identity == "zone/eu-a"
    again = ensure_local_pki(tmp_path / "tls", ["region/eu", "zone/eu-a", "gpu/g1"])
    assert again.created == ("gpu/g1",)
    assert again.files("region/eu").cert.read_bytes() == first.files("region/eu").cert.read_bytes()


def test_local_pki_reissues_a_certificate_that_does_not_name_its_host(tmp_path: Path) -> None:
    first = ensure_local_pki(tmp_path, ["region/eu"], {"region/eu": ("127.0.1.1",)})
    assert first.created == ("ca", "region/eu")
    same = ensure_local_pki(tmp_path, ["region/eu"], {"region/eu": ("127.0.1.1",)})
    assert same.created == ()
    moved = ensure_local_pki(tmp_path, ["region/eu"], {"region/eu": ("127.0.1.9",)})
    assert moved.created == ("region/eu",)
