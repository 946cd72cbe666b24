"""What mutual TLS between tiers costs: requests to an aiohttp server on loopback, one
client, sequential, in three modes measured in the same run:

* ``plain``      — HTTP, no TLS (what the tiers do without --tls-*);
* ``mtls-stock`` — mutual TLS with ordinary ``ssl`` contexts (chain verified, no identity
  check): the peer to compare the identity check against;
* ``mtls-gtm``   — gtm.tls contexts: the same, plus the SPIFFE identity check in the
  handshake on both sides.

Each mode runs twice: a new connection per request (every request pays a handshake: the
worst case) and one kept-alive connection (what the tiers' pooled sessions do). The
modes take turns in several rounds, so a machine that gets busier during the run slows
them alike. Printed: requests/s, p50 and p99 latency (µs), and p50 ratios against
``plain`` and ``mtls-stock``.

    python bench/tls_handshake.py            # 1,000 requests per mode and connection
    python bench/tls_handshake.py --smoke    # 50 (a few seconds, CI)
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from gtm.clock import SystemClock
from gtm.metrics import new_registry
from gtm.pki import CertificateAuthority
from gtm.stats import percentile
from gtm.tls import Side, TlsConfig, TlsMaterial, client_session_options, connector_ssl

WARMUP = 10
ROUNDS = 5


@dataclass(frozen=True, slots=True)
class Figure:
    mode: str
    connection: str
    latencies: tuple[float, ...]
    elapsed: float

    def percentile_us(self, p: int) -> float:
        return 1e6 * percentile(self.latencies, p / 100)

    @property
    def per_s(self) -> float:
        return len(self.latencies) / self.elapsed


def _configs(directory: Path) -> tuple[TlsConfig, TlsConfig]:
    ca = CertificateAuthority.create("bench CA")
    ca_path = ca.write(directory / "ca.pem")
    server = ca.issue("region/bench").write(directory / "s.pem", directory / "s-key.pem")
    client = ca.issue("global/bench").write(directory / "c.pem", directory / "c-key.pem")
    return (
        TlsConfig(ca_path, *server, clients=("global/*",)),
        TlsConfig(ca_path, *client, peers=("region/*",)),
    )


def _stock(config: TlsConfig, side: Side) -> ssl.SSLContext:
    protocol = ssl.PROTOCOL_TLS_SERVER if side is Side.SERVER else ssl.PROTOCOL_TLS_CLIENT
    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.cert, config.key)
    context.load_verify_locations(cafile=config.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = False
    return context


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _run(
    mode: str,
    server_ssl: ssl.SSLContext | None,
    client_ssl: ssl.SSLContext | None,
    n: int,
) -> list[Figure]:
    """``n`` requests on new connections, then ``n`` on one kept-alive connection."""
    app = web.Application()
    app.router.add_get("/", _ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    figures = []
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl).start()
        port = runner.addresses[0][1]
        url = f"{'https' if server_ssl else 'http'}://127.0.0.1:{port}/"
        for connection, force_close in (("new", True), ("kept", False)):
            connector = aiohttp.TCPConnector(ssl=connector_ssl(client_ssl), force_close=force_close)
            async with aiohttp.ClientSession(
                connector=connector, **client_session_options(client_ssl)
            ) as session:

                async def once(session: aiohttp.ClientSession = session) -> None:
                    async with session.get(url) as response:
                        await response.read()
                        assert response.status == 200

                for _ in range(WARMUP):
                    await once()
                latencies = []
                started = time.perf_counter()
                for _ in range(n):
                    t0 = time.perf_counter()
                    await once()
                    latencies.append(time.perf_counter() - t0)
                elapsed = time.perf_counter() - started
            figures.append(Figure(mode, connection, tuple(latencies), elapsed))
    finally:
        await runner.cleanup()
    return figures


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server_config, client_config = _configs(Path(tmp))
        clock, registry = SystemClock(), new_registry()
        server = TlsMaterial(server_config, clock=clock, registry=registry)
        client = TlsMaterial(client_config, clock=clock, registry=new_registry())
        modes = (
            ("plain", None, None),
            ("mtls-stock", _stock(server_config, Side.SERVER), _stock(client_config, Side.CLIENT)),
            ("mtls-gtm", server.server_context(), client.client_context()),
        )
        parts: dict[tuple[str, str], list[Figure]] = {}
        for _ in range(ROUNDS):
            for mode, server_ssl, client_ssl in modes:
                for f in await _run(mode, server_ssl, client_ssl, max(1, n // ROUNDS)):
                    parts.setdefault((f.mode, f.connection), []).append(f)
        figures = [
            Figure(
                mode,
                connection,
                tuple(x for f in fs for x in f.latencies),
                sum(f.elapsed for f in fs),
            )
            for (mode, connection), fs in parts.items()
        ]
    print(f"{'mode':<12}{'connection':<12}{'req/s':>10}{'p50 µs':>10}{'p99 µs':>10}")
    for f in figures:
        print(
            f"{f.mode:<12}{f.connection:<12}{f.per_s:>10.0f}"
            f"{f.percentile_us(50):>10.0f}{f.percentile_us(99):>10.0f}"
        )
    by = {(f.mode, f.connection): f for f in figures}
    print()
    for connection in ("new", "kept"):
        plain = by[("plain", connection)].percentile_us(50)
        stock = by[("mtls-stock", connection)].percentile_us(50)
        ours = by[("mtls-gtm", connection)].percentile_us(50)
        print(
            f"{connection} connection: p50 mtls-gtm / plain = {ours / plain:.2f}x, "
            f"mtls-gtm / mtls-stock (cost of the identity check) = {ours / stock:.2f}x"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="50 requests per mode (CI)")
    parser.add_argument("--requests", type=int, default=1000, help="requests per mode")
    args = parser.parse_args()
    asyncio.run(main(50 if args.smoke else args.requests))
