"""State-store latency: put, get, compare-and-swap and watch delivery, on the embedded
MemoryStore and on a real single-member etcd started here (EtcdServer on loopback, fsync
on unless --no-fsync), through the same StateStore calls the tiers make.

Printed per store and operation: operations, p50 and p99 latency (µs), operations/s,
and the p50 ratio of etcd to the memory store measured in the same run.

* put / get / cas: one client, sequential; 256-byte values over 100 keys; cas chains
  on one key (each swap expects the previous one's revision, so every swap succeeds).
* put x16: 16 concurrent writers (throughput; latency is per operation).
* watch: a put, then the time until a watcher on that prefix has the event in hand.

    python bench/state_store.py            # full run (about 30-60 s)
    python bench/state_store.py --smoke    # a few hundred operations (a few seconds, CI)
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path

from gtm.clock import SystemClock
from gtm.metrics import new_registry
from gtm.state.etcd import EtcdStore
from gtm.state.etcd_server import EtcdServer
from gtm.state.memory import MemoryStore
from gtm.state.store import StateStore
from gtm.state.url import Endpoint
from gtm.stats import percentile

VALUE = bytes(range(256))
KEYS = 100
WRITERS = 16
WARMUP = 50


@dataclass(frozen=True, slots=True)
class Figure:
    store: str
    op: str
    latencies: tuple[float, ...]  # seconds, one per operation
    elapsed: float  # wall time of the whole run of this operation, seconds

    def percentile_us(self, p: int) -> float:
        return 1e6 * percentile(self.latencies, p / 100)

    @property
    def ops_per_s(self) -> float:
        return len(self.latencies) / self.elapsed


async def _timed(n: int, op: Callable[[int], Awaitable[object]]) -> tuple[tuple[float, ...], float]:
    latencies = []
    started = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        await op(i)
        latencies.append(time.perf_counter() - t0)
    return tuple(latencies), time.perf_counter() - started


async def _measure(name: str, store: StateStore, n: int) -> list[Figure]:
    figures = []

    async def put(i: int) -> object:
        return await store.put(f"/bench/kv/{i % KEYS:03}", VALUE)

    async def get(i: int) -> object:
        return await store.get(f"/bench/kv/{i % KEYS:03}")

    for op_name, op in (("put", put), ("get", get)):
        await _timed(WARMUP, op)
        figures.append(Figure(name, op_name, *await _timed(n, op)))

    revision = await store.put("/bench/cas", VALUE)

    async def cas(i: int) -> object:
        nonlocal revision
        result = await store.compare_and_swap("/bench/cas", VALUE, expected_mod_revision=revision)
        assert result.succeeded, "a chained CAS must succeed"
        revision = result.revision
        return result

    figures.append(Figure(name, "cas", *await _timed(n, cas)))
    figures.append(await _concurrent_puts(name, store, n))
    figures.append(await _watch_latency(name, store, n))
    return figures


async def _concurrent_puts(name: str, store: StateStore, n: int) -> Figure:
    latencies: list[float] = []

    async def writer(w: int) -> None:
        for i in range(n // WRITERS):
            t0 = time.perf_counter()
            await store.put(f"/bench/kv/{(w * 7 + i) % KEYS:03}", VALUE)
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(WRITERS)))
    return Figure(name, f"put x{WRITERS}", tuple(latencies), time.perf_counter() - started)


async def _watch_latency(name: str, store: StateStore, n: int) -> Figure:
    start = await store.current_revision() + 1
    async with aclosing(store.watch("/bench/watch/", start_revision=start)) as watch:

        async def put_then_event(i: int) -> object:
            revision = await store.put(f"/bench/watch/{i % KEYS:03}", VALUE)
            while True:  # one put, one batch — but be exact about which event we wait for
                batch = await anext(watch)
                if any(e.kv.mod_revision == revision for e in batch.events):
                    return batch

        await _timed(WARMUP, put_then_event)
        return Figure(name, "watch", *await _timed(n, put_then_event))


def _print(figures: list[Figure], fsync: bool) -> None:
    memory = {f.op: f for f in figures if f.store == "memory"}
    print(
        f"state store latency (etcd: single member on loopback, fsync {'on' if fsync else 'off'})"
    )
    header = f"{'store':<8}{'op':<10}{'ops':>8}{'p50 µs':>10}{'p99 µs':>10}{'ops/s':>11}"
    print(header + f"{'p50 vs memory':>15}")
    for f in figures:
        ratio = f.percentile_us(50) / memory[f.op].percentile_us(50)
        print(
            f"{f.store:<8}{f.op:<10}{len(f.latencies):>8,}{f.percentile_us(50):>10,.1f}"
            f"{f.percentile_us(99):>10,.1f}{f.ops_per_s:>11,.0f}"
            + (f"{ratio:>14,.0f}x" if f.store != "memory" else f"{'-':>15}")
        )


async def _run(memory_ops: int, etcd_ops: int, server: EtcdServer) -> list[Figure]:
    memory = MemoryStore(SystemClock(), new_registry())
    etcd = EtcdStore([Endpoint(server.host, server.port)], registry=new_registry())
    try:
        return await _measure("memory", memory, memory_ops) + await _measure("etcd", etcd, etcd_ops)
    finally:
        await memory.aclose()
        await etcd.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few hundred operations (CI)")
    parser.add_argument("--no-fsync", action="store_true", help="run etcd with --unsafe-no-fsync")
    args = parser.parse_args()
    memory_ops, etcd_ops = (2_000, 200) if args.smoke else (100_000, 10_000)
    fsync = not args.no_fsync
    with (
        tempfile.TemporaryDirectory(prefix="gtm-bench-etcd-") as tmp,
        EtcdServer(Path(tmp) / "data", fsync=fsync) as server,
    ):
        figures = asyncio.run(_run(memory_ops, etcd_ops, server))
    _print(figures, fsync)


if __name__ == "__main__":
    main()
