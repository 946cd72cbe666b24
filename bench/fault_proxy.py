"""Fault proxy overhead: throughput and added latency with no toxics, vs direct.

Starts ``gtm chaos proxy`` as its own process (as it is deployed), a sink/echo server and
the clients in this process, and measures on loopback:

- throughput (MB/s, 1 MB = 10^6 bytes): each connection uploads a fixed number of bytes
  and waits for a one-byte acknowledgement, for 1 and 50 concurrent connections;
- round-trip latency (µs, p50/p99) of 64-byte ping-pongs on 1 and 50 connections, and
  the latency the proxy adds (proxied percentile minus direct percentile).

Toxiproxy itself is the natural peer, but no Toxiproxy binary can be installed here
(PyPI, Debian and npm ship none), so no peer ratio is printed unless ``--toxiproxy-url``
points at a running Toxiproxy, which is then measured the same way.

    python bench/fault_proxy.py            # full run (~10 s on 2 cores)
    python bench/fault_proxy.py --smoke    # a few seconds, for CI
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from chaos.proxy.client import ToxiproxyClient
from chaos.proxy.errors import ToxiproxyNotFound
from gtm.stats import percentile_of_sorted

BLOCK = 64 * 1024
PING = b"p" * 64


@dataclass(frozen=True)
class Sizes:
    upload_bytes_total: int  # split across the connections of a run
    pings_per_connection_1: int
    pings_per_connection_50: int


FULL = Sizes(
    upload_bytes_total=400_000_000, pings_per_connection_1=5000, pings_per_connection_50=200
)
SMOKE = Sizes(upload_bytes_total=16_000_000, pings_per_connection_1=300, pings_per_connection_50=20)


# ---------------------------------------------------------------------- servers
async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """First 8 bytes: how many bytes follow; ack with one byte once all have arrived."""
    try:
        expected = int.from_bytes(await reader.readexactly(8), "big")
        while expected > 0:
            chunk = await reader.read(min(expected, 1 << 20))
            if not chunk:
                return
            expected -= len(chunk)
        writer.write(b"k")
        await writer.drain()
        await reader.read()  # until the client closes
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


def address_of(server: asyncio.Server) -> str:
    host, port = server.sockets[0].getsockname()[:2]
    return f"{host}:{port}"


async def open_to(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


# ---------------------------------------------------------------------- measurements
async def upload(address: str, size: int) -> None:
    reader, writer = await open_to(address)
    writer.write(size.to_bytes(8, "big"))
    block = bytes(BLOCK)
    left = size
    while left > 0:
        part = block[: min(BLOCK, left)]
        writer.write(part)
        await writer.drain()
        left -= len(part)
    if await reader.readexactly(1) != b"k":
        raise RuntimeError("sink did not acknowledge")
    writer.close()


async def throughput(address: str, connections: int, total: int) -> float:
    """MB/s uploaded through ``address`` by ``connections`` concurrent clients."""
    each = total // connections
    start = time.perf_counter()
    await asyncio.gather(*(upload(address, each) for _ in range(connections)))
    return each * connections / (time.perf_counter() - start) / 1e6


async def pings(address: str, count: int) -> list[float]:
    reader, writer = await open_to(address)
    rtts = []
    for _ in range(count):
        start = time.perf_counter()
        writer.write(PING)
        await reader.readexactly(len(PING))
        rtts.append(time.perf_counter() - start)
    writer.close()
    return rtts


async def latency(address: str, connections: int, count: int) -> tuple[float, float]:
    """(p50, p99) round-trip time in µs over ``connections`` concurrent ping-pongers."""
    runs = await asyncio.gather(*(pings(address, count) for _ in range(connections)))
    samples = sorted(rtt for run in runs for rtt in run)
    return percentile_of_sorted(samples, 0.5) * 1e6, percentile_of_sorted(samples, 0.99) * 1e6


# ---------------------------------------------------------------------- proxies
async def start_our_proxy() -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gtmctl",
        "--log-level",
        "warning",
        "chaos",
        "proxy",
        "--port",
        "0",
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    while True:
        line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
        if not line:
            raise RuntimeError("gtm chaos proxy exited before listening")
        if "listening on " in line:
            return process, line.rsplit("listening on ", 1)[1].strip()


async def make_proxy(url: str, name: str, upstream: str) -> str:
    def create() -> str:
        with ToxiproxyClient(url) as client:
            with contextlib.suppress(ToxiproxyNotFound):
                client.delete_proxy(name)
            return client.create_proxy(name, upstream, listen="127.0.0.1:0").listen

    return await asyncio.to_thread(create)


# ---------------------------------------------------------------------- report
@dataclass
class Row:
    label: str
    values: dict[str, float]


async def measure_target(label: str, sink_address: str, echo_address: str, sizes: Sizes) -> Row:
    values: dict[str, float] = {}
    for connections in (1, 50):
        values[f"tput{connections}"] = await throughput(
            sink_address, connections, sizes.upload_bytes_total
        )
    for connections, count in (
        (1, sizes.pings_per_connection_1),
        (50, sizes.pings_per_connection_50),
    ):
        p50, p99 = await latency(echo_address, connections, count)
        values[f"p50_{connections}"], values[f"p99_{connections}"] = p50, p99
    return Row(label, values)


def print_report(rows: list[Row], sizes: Sizes, smoke: bool) -> None:
    direct = rows[0].values
    print(f"fault proxy overhead, no toxics ({'smoke' if smoke else 'full'} run, loopback)")
    print(f"  upload {sizes.upload_bytes_total / 1e6:.0f} MB per run; 64 B ping-pongs")
    header = (
        f"  {'target':<26}{'MB/s 1c':>10}{'MB/s 50c':>10}"
        f"{'p50 1c':>9}{'p99 1c':>9}{'p50 50c':>9}{'p99 50c':>10}   (RTT µs)"
    )
    print(header)
    for row in rows:
        v = row.values
        print(
            f"  {row.label:<26}{v['tput1']:>10.0f}{v['tput50']:>10.0f}"
            f"{v['p50_1']:>9.0f}{v['p99_1']:>9.0f}{v['p50_50']:>9.0f}{v['p99_50']:>10.0f}"
        )
    for row in rows[1:]:
        v = row.values
        print(f"  {row.label}: vs direct")
        print(
            f"    throughput  {v['tput1'] / direct['tput1']:.2f}x (1 conn), "
            f"{v['tput50'] / direct['tput50']:.2f}x (50 conns)"
        )
        for n in (1, 50):
            added_p50 = v[f"p50_{n}"] - direct[f"p50_{n}"]
            added_p99 = v[f"p99_{n}"] - direct[f"p99_{n}"]
            print(
                f"    added latency, {n:>2} conn(s): p50 {added_p50:+.0f} µs, "
                f"p99 {added_p99:+.0f} µs"
            )
    if len(rows) == 2:
        print(
            "  peer: Toxiproxy not measured — no Toxiproxy binary is installable here "
            "(PyPI/Debian/npm); pass --toxiproxy-url to compare against a running one."
        )
    else:
        ours, peer = rows[1].values, rows[2].values
        print(
            f"  gtm / Toxiproxy: throughput {ours['tput1'] / peer['tput1']:.2f}x (1c), "
            f"{ours['tput50'] / peer['tput50']:.2f}x (50c); p50 RTT "
            f"{ours['p50_1'] / peer['p50_1']:.2f}x (1c), "
            f"{ours['p50_50'] / peer['p50_50']:.2f}x (50c)"
        )


async def main(smoke: bool, toxiproxy_url: str | None) -> None:
    sizes = SMOKE if smoke else FULL
    sink_server = await asyncio.start_server(sink, "127.0.0.1", 0)
    echo_server = await asyncio.start_server(echo, "127.0.0.1", 0)
    process, url = await start_our_proxy()
    try:
        targets: list[tuple[str, Callable[[str, str], Awaitable[str]]]] = [
            ("gtm chaos proxy", lambda name, up: make_proxy(url, name, up)),
        ]
        if toxiproxy_url:
            targets.append(("Toxiproxy", lambda name, up: make_proxy(toxiproxy_url, name, up)))
        rows = [
            await measure_target("direct", address_of(sink_server), address_of(echo_server), sizes)
        ]
        for label, make in targets:
            sink_proxy = await make("bench_sink", address_of(sink_server))
            echo_proxy = await make("bench_echo", address_of(echo_server))
            rows.append(await measure_target(label, sink_proxy, echo_proxy, sizes))
        print_report(rows, sizes, smoke)
    finally:
        process.terminate()
        await process.wait()
        sink_server.close()
        echo_server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few-second run for CI")
    parser.add_argument("--toxiproxy-url", help="also measure a running Toxiproxy (http://…)")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.smoke, arguments.toxiproxy_url))
