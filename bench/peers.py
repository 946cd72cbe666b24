"""The routers operators run in front of vLLM and SGLang, as benchmark peers (issue 26).

``sglang-router`` (SGLang's model gateway) and ``vllm-router`` (vLLM's router, a fork of
it) are Rust routers shipped as Python wheels: the router runs inside one Python process
(a PyO3 extension), so that process's CPU time is the router's. Both come from the
``bench-peers`` extra (``pip install -e '.[bench-peers]'``); a benchmark that asks for
a peer that is not installed fails with :class:`PeerMissing`, naming the extra, rather
than skipping it (a side-by-side without its peers would read as a win).

:func:`start_peer` starts one on a loopback port in front of given worker URLs with a
given policy and waits until it serves: the process listens only once its workers
answered their health check, and its own ``/health`` then answers 200 (sglang-router's
``/readiness`` also counts the healthy workers, which is what we wait for there).
:meth:`PeerRouter.stop` ends it (SIGTERM, then SIGKILL after a grace);
:meth:`PeerRouter.cpu_seconds` reads its CPU time from ``/proc`` (user + system, all
threads).

The routers' own defaults are kept (policy thresholds, retries, circuit breakers,
health-check intervals) except where a default cannot work on one machine: each gets
its own Prometheus port (both default to 29000), and its log goes to a file instead of
a pipe nobody reads (a full pipe stops a process that logs every request — the routers
do at their default level — mid-request). Extra arguments are the caller's
(``extra_args``), e.g. vllm-router's ``--kv-event-source`` for ``kv_aware``.

    python bench/peers.py --worker http://127.0.0.1:8001 --peer sglang-router \\
        --policy cache_aware          # start one, print its URL, stop on Ctrl-C
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import aiohttp

# Run as a script, sys.path starts at bench/, not at the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gtm.errors import GtmError
from gtm.net import free_ports
from gtm.testing.processes import cpu_seconds

#: The optional-dependencies extra (pyproject.toml) that installs both peers.
EXTRA = "bench-peers"
#: How long a peer gets to listen and see its workers healthy (a cold start on a loaded
#: 2-core machine; both check their workers before they listen).
STARTUP_TIMEOUT_S = 90.0
#: How long a stopped peer gets after SIGTERM before SIGKILL (both drain in-flight
#: requests on SIGTERM, for up to minutes by default).
STOP_GRACE_S = 10.0


class Peer(StrEnum):
    SGLANG = "sglang-router"
    VLLM = "vllm-router"


#: The routing policies each peer offers for a plain (not prefill/decode) pool, as its
#: ``--policy`` lists them; the first is the peer's default.
POLICIES: dict[Peer, tuple[str, ...]] = {
    Peer.SGLANG: ("cache_aware", "power_of_two", "round_robin", "random"),
    Peer.VLLM: (
        "cache_aware",
        "kv_aware",
        "round_robin",
        "power_of_two",
        "consistent_hash",
        "random",
    ),
}

#: The Python module each peer's wheel installs (its presence = the peer is installed).
_MODULES = {Peer.SGLANG: "sglang_router", Peer.VLLM: "vllm_router"}


class PeerMissing(GtmError):
    """A benchmark asked for a peer router that is not installed."""


class PeerStartError(GtmError):
    """A peer router exited or did not become ready in time."""


def require(peer: Peer) -> None:
    """Raise :class:`PeerMissing` unless ``peer``'s wheel is installed here."""
    if importlib.util.find_spec(_MODULES[peer]) is None:
        raise PeerMissing(
            f"{peer.value} is not installed: pip install -e '.[{EXTRA}]' "
            f"(the side-by-side benchmarks need it; they do not skip a peer)"
        )


def version(peer: Peer) -> str:
    """The installed wheel's version ("" when it is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(peer.value)
    except PackageNotFoundError:
        return ""


def command(
    peer: Peer,
    policy: str,
    workers: Sequence[str],
    *,
    host: str,
    port: int,
    prometheus_port: int,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line that starts ``peer`` with ``policy`` in front of ``workers``."""
    if policy not in POLICIES[peer]:
        raise ValueError(f"{peer.value} has no policy {policy!r} (one of {POLICIES[peer]})")
    module = "sglang_router.launch_router" if peer is Peer.SGLANG else "vllm_router.launch_router"
    return [
        sys.executable, "-m", module,
        "--host", host, "--port", str(port),
        "--worker-urls", *workers,
        "--policy", policy,
        "--prometheus-host", host, "--prometheus-port", str(prometheus_port),
        *extra_args,
    ]  # fmt: skip


@dataclass
class PeerRouter:
    """A running peer router: its URL, process and log file."""

    peer: Peer
    policy: str
    url: str
    proc: asyncio.subprocess.Process
    log_path: Path
    #: Its Prometheus exposition (``/metrics`` on its own port).
    metrics_url: str = ""
    #: The directory made for its log (none given): removed by :meth:`stop`, so a run
    #: of the benchmarks leaves no logs behind (a peer logs two lines per request:
    #: ~50 MB per ``bench/zone_proxy.py`` run).
    own_dir: Path | None = None
    _cpu_at_exit: float | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """CPU seconds the router has used so far (after :meth:`stop`: in all)."""
        if self._cpu_at_exit is not None:
            return self._cpu_at_exit
        return cpu_seconds(self.proc.pid)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`; remembers the CPU time."""
        if self.proc.returncode is None:
            with contextlib.suppress(OSError):
                self._cpu_at_exit = cpu_seconds(self.proc.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self.own_dir is not None:
            shutil.rmtree(self.own_dir, ignore_errors=True)
            self.own_dir = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


async def _ready(session: aiohttp.ClientSession, router: PeerRouter, workers: int) -> bool:
    path = "/readiness" if router.peer is Peer.SGLANG else "/health"
    try:
        async with session.get(router.url + path) as response:
            if response.status != 200:
                return False
            if router.peer is Peer.SGLANG:
                body = await response.json(content_type=None)
                return int(body.get("healthy_workers", 0)) >= workers
            return True
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False


async def start_peer(
    peer: Peer,
    policy: str,
    workers: Sequence[str],
    *,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    log_dir: Path | None = None,
    timeout_s: float = STARTUP_TIMEOUT_S,
) -> PeerRouter:
    """Start ``peer`` with ``policy`` in front of ``workers`` on a free port of ``host``
    and wait until it serves with every worker healthy."""
    require(peer)
    port, prometheus = free_ports(host, 2)
    args = command(
        peer, policy, workers, host=host, port=port, prometheus_port=prometheus,
        extra_args=extra_args,
    )  # fmt: skip
    own_dir = None if log_dir is not None else Path(tempfile.mkdtemp(prefix="gtm-peer-"))
    directory = log_dir or own_dir
    assert directory is not None
    log_path = directory / f"{peer.value}-{policy}-{port}.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "NO_COLOR": "1", "RUST_LOG_STYLE": "never"},
        )  # fmt: skip
    router = PeerRouter(
        peer, policy, f"http://{host}:{port}", proc, log_path,
        metrics_url=f"http://{host}:{prometheus}/metrics", own_dir=own_dir,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    timeout = aiohttp.ClientTimeout(total=2.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                tail = router.log_tail()
                await router.stop()
                raise PeerStartError(
                    f"{peer.value} --policy {policy} exited ({proc.returncode}):\n{tail}"
                )
            if await _ready(session, router, len(workers)):
                return router
            await asyncio.sleep(0.2)
    tail = router.log_tail()
    await router.stop()
    raise PeerStartError(f"{peer.value} --policy {policy} not ready in {timeout_s:g} s:\n{tail}")


@contextlib.asynccontextmanager
async def running_peer(
    peer: Peer,
    policy: str,
    workers: Sequence[str],
    *,
    extra_args: Sequence[str] = (),
    log_dir: Path | None = None,
) -> AsyncIterator[PeerRouter]:
    """:func:`start_peer` as a context: stopped on the way out."""
    router = await start_peer(peer, policy, workers, extra_args=extra_args, log_dir=log_dir)
    try:
        yield router
    finally:
        await router.stop()


def available() -> dict[Peer, str]:
    """Each installed peer and its version."""
    return {p: version(p) for p in Peer if importlib.util.find_spec(_MODULES[p]) is not None}


async def _serve(args: argparse.Namespace) -> int:
    router = await start_peer(Peer(args.peer), args.policy, args.worker)
    print(
        f"{router.peer.value} {version(router.peer)} --policy {router.policy}: listening on "
        f"{router.url} (pid {router.pid}, log {router.log_path})",
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await router.stop()
        print(f"stopped; CPU {router.cpu_seconds():.2f} s")
    return 0


async def _smoke() -> int:
    """Each peer with its default policy in front of one emulated GPU: one completion
    through it, then its CPU time."""
    from gtm.gpu_profiles import LLAMA_8B
    from gtm.testing.processes import start_listening

    for peer in Peer:
        require(peer)
    worker = await start_listening(
        ["gpu-sim", "--port", "0", "--gpu-type", "H100", "--speedup", "10",
         "--warmup-passes", "0"]
    )  # fmt: skip
    try:
        for peer in Peer:
            async with running_peer(peer, POLICIES[peer][0], [worker.url]) as router:
                body = {"model": LLAMA_8B, "prompt": "one two three", "max_tokens": 4}
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(router.url + "/v1/completions", json=body) as response,
                ):
                    answer = await response.json(content_type=None)
                if response.status != 200 or not answer.get("choices"):
                    raise PeerStartError(f"{peer.value}: {response.status} {answer}")
                print(f"{peer.value} {version(peer)} --policy {router.policy}: "
                      f"served a completion; CPU {router.cpu_seconds():.2f} s so far")  # fmt: skip
    finally:
        await worker.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="each peer serves one request")
    parser.add_argument("--peer", choices=[p.value for p in Peer])
    parser.add_argument("--policy", help="the peer's --policy (default: its own default)")
    parser.add_argument("--worker", action="append", default=[], help="a worker URL")
    args = parser.parse_args()
    if args.smoke:
        return asyncio.run(_smoke())
    if args.peer is None or not args.worker:
        parser.error("--peer and at least one --worker (or --smoke)")
    args.policy = args.policy or POLICIES[Peer(args.peer)][0]
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
