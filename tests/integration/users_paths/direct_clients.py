"""Clients that talk to a regional LB directly, as a DNS answer (``<region>.api``, or one
a resolver cached before a policy change) sends them, on a ``gtm up --processes``.

Where a client is: every client runs on this machine, so its place travels the way
``gtm load`` sends it — in ``X-Forwarded-For`` from 127.0.0.1, the local deployment's
trusted proxy — as an address of a city's documentation prefix that ``gtm up``'s geo
map places (:mod:`gtmctl.up.clients`). A client bound to 127.0.0.2 is an untrusted peer:
what it writes in ``X-Forwarded-For`` must not be believed.

:func:`zone_before_one_worker` is the smallest data path (one zone agent, one emulated
worker) for the tests of the zone's two HTTP servers.
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from gtm.testing.processes import GtmProcess, running
from gtmctl.up.clients import bundled_cities, city_network
from tests.integration.gtmctl.up.helpers import Up

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: The demo tenant every region may serve (residency aside): gtm up prints its key.
TENANT_KEY = "gtm-demo-global"
#: The address local tools connect from (gtm up's trusted proxy), and one that is not.
TRUSTED_SOURCE = "127.0.0.1"
UNTRUSTED_SOURCE = "127.0.0.2"


def city_client(name: str, country: str) -> str:
    """An address of ``name``'s prefix in gtm up's geo map."""
    for index, city in enumerate(bundled_cities()):
        if city.name == name and city.country == country:
            return str(city_network(index).network_address + 7)
    raise AssertionError(f"no bundled city {name}, {country}")


BERLIN = city_client("Berlin", "DE")  # GDPR: EEA regions only
NEW_YORK = city_client("New York City", "US")


def tenant_client(up: Up, **headers: str) -> AsyncOpenAI:
    """The OpenAI SDK as the demo tenant in Berlin points it at the front door (no
    retries: a failure is the test's to see), with ``headers`` sent besides."""
    return AsyncOpenAI(
        base_url=up.base_url + "/v1",
        api_key=TENANT_KEY,
        max_retries=0,
        timeout=60.0,
        default_headers={"X-Forwarded-For": BERLIN, **headers},
    )


@dataclass(frozen=True)
class Answer:
    status: int
    #: The region that served the request (x-gtm-region), if any.
    region: str | None
    spilled_from: str | None
    body: dict[str, Any]


async def deployment(up: Up) -> dict[str, Any]:
    """gtm up's deployment document (regions' URLs, the store, the run directory)."""
    return await admin_document(up, "deployment")


async def admin_document(up: Up, name: str) -> dict[str, Any]:
    """``GET /api/v1/NAME`` on gtm up's admin API (``fleet``, ``deployment``), as the
    operator."""
    url = f"http://127.0.0.1:{up.http_port + 1}/api/v1/{name}"
    async with (
        aiohttp.ClientSession(headers=up.admin_headers()) as session,
        session.get(url) as response,
    ):
        assert response.status == 200, await response.text()
        document: dict[str, Any] = await response.json()
    return document


def region_url(document: dict[str, Any], region: str) -> str:
    return str(next(r["url"] for r in document["regions"] if r["name"] == region))


async def ask(
    url: str,
    *,
    client: str | None = None,
    source: str = TRUSTED_SOURCE,
    headers: dict[str, str] | None = None,
    key: str = TENANT_KEY,
) -> Answer:
    """One chat completion sent straight to the regional LB at ``url`` from ``source``,
    for a client at ``client`` (in X-Forwarded-For) when given."""
    sent = {"Authorization": f"Bearer {key}", **(headers or {})}
    if client is not None:
        sent["X-Forwarded-For"] = client
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(url + "/v1/chat/completions", json=body, headers=sent) as response,
    ):
        text = await response.text()
        return Answer(
            response.status,
            response.headers.get("x-gtm-region"),
            response.headers.get("x-gtm-spilled-from"),
            json.loads(text) if text.startswith("{") else {"text": text},
        )


def audit_records(run_dir: str, region: str) -> list[dict[str, Any]]:
    """The residency audit records region ``region``'s regional LB wrote so far."""
    folder = Path(run_dir) / "audit" / f"regional-{region}"
    records = []
    for path in sorted(folder.glob("regional-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line)["record"])
    return records


@asynccontextmanager
async def zone_before_one_worker(
    server: str, log: Path, model: str = "meta-llama/Llama-3.1-8B-Instruct"
) -> AsyncIterator[GtmProcess]:
    """A ``gtm zone`` on loopback with ``--http-server server``, in front of one emulated
    H100 serving ``model``; yields the zone's process (its ``url``)."""
    async with AsyncExitStack() as stack:
        worker = await stack.enter_async_context(
            running(
                ["gpu-sim", "--port", "0", "--gpu-type", "H100", "--model", model,
                 "--speedup", "100", "--warmup-passes", "0"],
                stop_signal=signal.SIGKILL,
            )
        )  # fmt: skip
        yield await stack.enter_async_context(
            running(
                ["zone", "--zone", "zone-a", "--region", "region-1", "--listen",
                 "127.0.0.1:0", "--http-server", server,
                 "--worker", f"{worker.url},gpu=H100,id=gpu-a,model={model}"],
                log=log,
                stop_signal=signal.SIGINT,
            )
        )  # fmt: skip
