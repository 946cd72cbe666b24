"""mTLS over loopback with real aiohttp servers and clients: what is accepted, what is
refused (expired, wrong CA, wrong identity, no certificate, plaintext either way), and
certificate rotation without a restart."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509

from gtm.clock import FakeClock, SystemClock
from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor
from gtm.tls import (
    PlaintextRefused,
    TlsConfig,
    TlsMaterial,
    client_session_options,
    connector_ssl,
    peer_identities,
)
from tests.integration.security.conftest import Pki

pytestmark = pytest.mark.integration

EXPIRED = {
    "not_before": dt.datetime.now(dt.UTC) - dt.timedelta(days=30),
    "not_after": dt.datetime.now(dt.UTC) - dt.timedelta(days=1),
}


def _material(config: TlsConfig) -> TlsMaterial:
    return TlsMaterial(config, clock=SystemClock(), registry=new_registry())


async def _whoami(request: web.Request) -> web.Response:
    peercert = request.transport.get_extra_info("peercert") if request.transport else None
    return web.json_response({"client": list(peer_identities(peercert))})


@asynccontextmanager
async def _server(context: ssl.SSLContext | None) -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_get("/whoami", _whoami)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


@asynccontextmanager
async def _client(context: ssl.SSLContext | None) -> AsyncIterator[aiohttp.ClientSession]:
    # force_close: every request is a new connection, so a new handshake.
    connector = aiohttp.TCPConnector(ssl=connector_ssl(context), force_close=True)
    async with aiohttp.ClientSession(
        connector=connector, **client_session_options(context)
    ) as session:
        yield session


async def _get(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url) as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


async def _server_cert(port: int, context: ssl.SSLContext) -> bytes:
    """The certificate the server presents on a new handshake (DER)."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        await writer.wait_closed()
    assert isinstance(der, bytes)
    return der


def _identity_of(der: bytes) -> str:
    cert = x509.load_der_x509_certificate(der)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return str(san.get_values_for_type(x509.UniformResourceIdentifier)[0])


async def test_right_identities_both_ways(pki: Pki) -> None:
    server = _material(pki.config("region/eu-west", clients=("global/*",)))
    client = _material(pki.config("global/g1", peers=("region/*",)))
    async with _server(server.server_context()) as port, _client(client.client_context()) as s:
        body = await _get(s, f"https://127.0.0.1:{port}/whoami")
        der = await _server_cert(port, client.client_context())
    assert body == {"client": ["global/g1"]}
    assert _identity_of(der) == "spiffe://gtm/region/eu-west"


@pytest.mark.parametrize(
    ("make_client", "why"),
    [
        (lambda pki, other: other.config("global/g1", peers=("region/*",)), "client of another CA"),
        (lambda pki, other: pki.config("zone/z1", peers=("region/*",)), "wrong client identity"),
        (
            lambda pki, other: pki.config("global/g1", peers=("region/*",), **EXPIRED),
            "expired client certificate",
        ),
    ],
)
async def test_server_refuses_bad_clients(
    pki: Pki, other_pki: Pki, make_client: Callable[[Pki, Pki], TlsConfig], why: str
) -> None:
    server = _material(pki.config("region/eu-west", clients=("global/*",)))
    client = _material(make_client(pki, other_pki))  # an expired one loads (gauge < 0)
    async with _server(server.server_context()) as port, _client(client.client_context()) as s:
        # The server ends the handshake (TLS 1.3: after the client thinks it is done, so
        # the client sees a reset or a disconnect rather than a certificate error).
        with pytest.raises(aiohttp.ClientError):
            await _get(s, f"https://127.0.0.1:{port}/whoami")


@pytest.mark.parametrize(
    ("make_server", "expected"),
    [
        (lambda pki, other: other.config("region/eu-west"), "certificate verify failed"),
        (
            lambda pki, other: pki.config("zone/eu-west-a"),
            "names zone/eu-west-a; expected region/*",
        ),
        (lambda pki, other: pki.config("region/eu-west", **EXPIRED), "certificate has expired"),
    ],
)
async def test_client_refuses_bad_servers(
    pki: Pki, other_pki: Pki, make_server: Callable[[Pki, Pki], TlsConfig], expected: str
) -> None:
    server = _material(make_server(pki, other_pki))
    client = _material(pki.config("global/g1", peers=("region/*",)))
    async with _server(server.server_context()) as port, _client(client.client_context()) as s:
        with pytest.raises(aiohttp.ClientConnectorCertificateError) as caught:
            await _get(s, f"https://127.0.0.1:{port}/whoami")
    assert expected in str(caught.value)


async def test_client_without_certificate_is_refused(pki: Pki) -> None:
    server = _material(pki.config("region/eu-west"))
    no_cert = ssl.create_default_context(cafile=str(pki.ca_path))
    no_cert.check_hostname = False
    async with _server(server.server_context()) as port, _client(no_cert) as s:
        with pytest.raises(aiohttp.ClientError):
            await _get(s, f"https://127.0.0.1:{port}/whoami")


async def test_plaintext_client_is_refused_by_a_tls_listener(pki: Pki) -> None:
    server = _material(pki.config("region/eu-west"))
    async with _server(server.server_context()) as port, _client(None) as s:
        with pytest.raises(aiohttp.ClientError):
            await _get(s, f"http://127.0.0.1:{port}/whoami")


async def test_tls_client_never_dials_plaintext(pki: Pki) -> None:
    client = _material(pki.config("global/g1", peers=("region/*",)))
    async with _server(None) as port, _client(client.client_context()) as s:
        with pytest.raises(PlaintextRefused, match="no plaintext fallback"):
            await _get(s, f"http://127.0.0.1:{port}/whoami")


async def test_rotation_without_restart(pki: Pki) -> None:
    clock = FakeClock()
    server_config = pki.config("region/eu-west", name="server")
    client_config = pki.config("global/g1", peers=("region/*",), name="client")
    server = TlsMaterial(server_config, clock=clock, registry=new_registry())
    client = TlsMaterial(client_config, clock=clock, registry=new_registry())
    client_context = client.client_context()
    async with (
        TaskSupervisor(registry=new_registry(), clock=clock) as supervisor,
        _server(server.server_context()) as port,
        _client(client_context) as s,
    ):
        supervisor.spawn("server-tls", server.run(interval=60))
        supervisor.spawn("client-tls", client.run(interval=60))
        url = f"https://127.0.0.1:{port}/whoami"
        body = await _get(s, url)
        der = await _server_cert(port, client_context)
        first = x509.load_der_x509_certificate(der).serial_number
        assert body == {"client": ["global/g1"]}
        # The rotation tool replaces both certificates (same identities, new keys).
        pki.ca.issue("region/eu-west").write(server_config.cert, server_config.key)
        pki.ca.issue("global/g2").write(client_config.cert, client_config.key)
        await clock.advance(60)
        await clock.settle()
        body = await _get(s, url)
        der = await _server_cert(port, client_context)
    assert x509.load_der_x509_certificate(der).serial_number != first
    assert body == {"client": ["global/g2"]}
