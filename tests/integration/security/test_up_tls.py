"""``gtm up --tls`` as a user runs it: every tier behind mutual TLS, an OpenAI request
from the (plain HTTP) front door through global → regional → zone → GPU, and the inner
listeners refusing plaintext and the wrong identities."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import openai
import pytest

from gtm.clock import SystemClock
from gtm.metrics import new_registry
from gtm.pki import CertificateAuthority
from gtm.tls import TlsConfig, TlsMaterial, client_session_options, connector_ssl
from tests.integration.gtmctl.up.helpers import Up, running_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CHAT = "meta-llama/Llama-3.1-8B-Instruct"
REGIONS = ("eu-west", "us-east")


def _client(tls_dir: Path, identity: str, peers: tuple[str, ...]) -> ssl.SSLContext:
    stem = identity.replace("/", "-")
    config = TlsConfig(
        tls_dir / "ca.pem", tls_dir / f"{stem}.pem", tls_dir / f"{stem}-key.pem", peers
    )
    return TlsMaterial(config, clock=SystemClock(), registry=new_registry()).client_context()


async def _status(url: str, context: ssl.SSLContext | None) -> int:
    connector = aiohttp.TCPConnector(ssl=connector_ssl(context), force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector, **client_session_options(context)) as s,
        s.get(url) as response,
    ):
        return response.status


def _regional_url(up: Up, scheme: str) -> str:
    return f"{scheme}://{up.address('eu-west')}:{up.http_port}/healthz"


async def test_up_tls_end_to_end(tmp_path: Path) -> None:
    tls_dir = tmp_path / "tls"
    async with running_up(tmp_path, "--tls", "--tls-dir", str(tls_dir), regions=REGIONS) as up:
        assert f"CA {tls_dir / 'ca.pem'}" in up.banner
        assert f"https://{up.address('eu-west')}" in up.banner
        client = openai.AsyncOpenAI(base_url=f"{up.base_url}/v1", api_key="gtm-demo-global")
        async with client:
            raw = await client.chat.completions.with_raw_response.create(
                model=CHAT, messages=[{"role": "user", "content": "hello"}], max_tokens=8
            )
        assert raw.headers["x-gtm-region"] in REGIONS
        assert raw.headers["x-gtm-gpu"].startswith(raw.headers["x-gtm-zone"])
        assert raw.parse().choices[0].message.content

        # An operator's certificate from the local CA is served, by gtm's own client and
        # by an ordinary one that checks host names (as curl does)...
        ops = _client(tls_dir, "ops/gtm-up", ("region/*",))
        assert await _status(_regional_url(up, "https"), ops) == 200
        curl_like = ssl.create_default_context(cafile=tls_dir / "ca.pem")
        curl_like.load_cert_chain(tls_dir / "ops-gtm-up.pem", tls_dir / "ops-gtm-up-key.pem")
        assert await _status(_regional_url(up, "https"), curl_like) == 200
        # ...plaintext is not...
        with pytest.raises(aiohttp.ClientError):
            await _status(_regional_url(up, "http"), None)
        # ...nor a GPU's certificate (the regional LB serves global/region/ops only)...
        gpu = next(p.name for p in tls_dir.glob("gpu-*-key.pem")).removesuffix("-key.pem")
        with pytest.raises(aiohttp.ClientError):
            await _status(
                _regional_url(up, "https"), _client(tls_dir, gpu.replace("-", "/", 1), ())
            )
        # ...nor a certificate with the right identity from another CA.
        other = CertificateAuthority.create("impostor CA")
        cert, key = other.issue("global/gtm-up").write(tmp_path / "imp.pem", tmp_path / "imp-k.pem")
        impostor = TlsMaterial(
            TlsConfig(tls_dir / "ca.pem", cert, key), clock=SystemClock(), registry=new_registry()
        ).client_context()
        with pytest.raises(aiohttp.ClientError):
            await _status(_regional_url(up, "https"), impostor)
        # ...and a client verifying identities refuses the regional LB posing as a zone.
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await _status(_regional_url(up, "https"), _client(tls_dir, "ops/gtm-up", ("zone/*",)))

    # A second run reuses the CA and certificates.
    ca = (tls_dir / "ca.pem").read_bytes()
    async with running_up(tmp_path, "--tls", "--tls-dir", str(tls_dir), regions=REGIONS[:1]) as up:
        assert (tls_dir / "ca.pem").read_bytes() == ca
        assert "CA " in up.banner


async def test_up_tls_processes(tmp_path: Path) -> None:
    """One process per tier (and a private etcd), each with its own certificate."""
    tls_dir = tmp_path / "tls"
    args = ("--processes", "--tls", "--tls-dir", str(tls_dir))
    async with running_up(tmp_path, *args, regions=REGIONS[:1]) as up:
        client = openai.AsyncOpenAI(base_url=f"{up.base_url}/v1", api_key="gtm-demo-global")
        async with client:
            raw = await client.chat.completions.with_raw_response.create(
                model=CHAT, messages=[{"role": "user", "content": "hello"}], max_tokens=8
            )
        assert raw.headers["x-gtm-region"] == "eu-west"
        assert raw.headers["x-gtm-gpu"].startswith(raw.headers["x-gtm-zone"])
        ops = _client(tls_dir, "ops/gtm-up", ("region/*",))
        assert await _status(_regional_url(up, "https"), ops) == 200
        with pytest.raises(aiohttp.ClientError):
            await _status(_regional_url(up, "http"), None)
