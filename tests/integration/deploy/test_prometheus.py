"""The dashboard and the alerts read series that a real deployment exports.

A real Prometheus (Debian's ``prometheus``, scripts/install-system-deps) scrapes every
tier of a real ``gtm up --processes --tls`` — the front door, each regional LB and each
zone agent, the latter over mutual TLS with the operators' certificate — every second,
with the target labels deploy/prometheus/README.md asks for (``tier``, ``region``,
``zone``) and the alert rules loaded. After a little load and one refused request of each
kind (residency at the front door and at a region, quota, a drained region's spill and
its 503), every query of every panel of deploy/grafana/gtm-overview.json (template
variables at "All") and every metric selector of every alert expression (its threshold
aside: the series it compares exist) returns data.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import ssl
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gtm.net import free_port
from policies.loader import examples_path
from tests.integration.gtmctl.up.helpers import Up, running_up
from tests.integration.users_paths.direct_clients import (
    BERLIN,
    MODEL,
    NEW_YORK,
    TENANT_KEY,
    deployment,
    region_url,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "gtm-overview.json"
ALERTS = ROOT / "deploy" / "prometheus" / "gtm-alerts.yaml"
REGIONS = ("us-east", "eu-west")
#: The healthcare tenant (US only): a Berlin client is refused at the front door (451).
US_ONLY_KEY = "gtm-acme-health-example"
#: The EU-resident demo tenant, given a quota of one request a minute here.
EU_KEY = "gtm-demo-eu"
#: Bounds on a loaded 2-core machine.
PROMETHEUS_START_S = 30.0
TARGETS_UP_S = 60.0
DATA_WITHIN_S = 60.0
#: Metrics the dashboard shows that a later change adds (the anycast front door): their
#: panel may be empty only while no target exports the metric at all.
PENDING_METRICS = frozenset({"gtm_anycast_announced"})
#: What Grafana would put for the template variables ("All", and a rate window of four
#: scrape intervals).
VARIABLES = {"$__rate_interval": "15s", "$region": ".*", "$model": ".*"}
#: A metric selector inside a PromQL expression: gtm's names, ``up`` and the runtime ones.
SELECTOR = re.compile(r"\b((?:gtm|process|python)_[a-z0-9_]+|up)\b(\{[^}]*\})?")


def policies_with_eu_quota(tmp_path: Path) -> Path:
    """The shipped policies, the EU demo tenant allowed one request a minute."""
    folder = tmp_path / "policies"
    shutil.copytree(examples_path(), folder)
    path = folder / "tenants.yaml"
    document = yaml.safe_load(path.read_text())
    for tenant in document["spec"]["tenants"]:
        if tenant["id"] == "demo-eu":
            tenant["quotas"]["requests_per_minute"] = 1
    path.write_text(yaml.safe_dump(document))
    return folder


def host_port(url: str) -> str:
    return url.split("://", 1)[1].rstrip("/")


def scrape_config(up: Up, document: dict[str, Any], tls_dir: Path) -> dict[str, Any]:
    """Every tier's /metrics, with the target labels the rules and the dashboard use."""
    tls = {
        "ca_file": str(tls_dir / "ca.pem"),
        "cert_file": str(tls_dir / "ops-gtm-up.pem"),
        "key_file": str(tls_dir / "ops-gtm-up-key.pem"),
    }
    regional = [
        {"targets": [host_port(r["url"])], "labels": {"tier": "regional", "region": r["name"]}}
        for r in document["regions"]
    ]
    zones = [
        {
            "targets": [host_port(z["url"])],
            "labels": {"tier": "zone", "region": z["region"], "zone": z["name"]},
        }
        for z in document["zones"]
    ]
    front = [{"targets": [host_port(up.base_url)], "labels": {"tier": "global"}}]
    scheme = "https"  # gtm up --tls: mutual TLS between the tiers (the front door stays http)
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": "gtm-global", "static_configs": front},
            {
                "job_name": "gtm-regional",
                "scheme": scheme,
                "tls_config": tls,
                "static_configs": regional,
            },
            {"job_name": "gtm-zone", "scheme": scheme, "tls_config": tls, "static_configs": zones},
        ],
    }


@contextlib.asynccontextmanager
async def prometheus(tmp_path: Path, config: dict[str, Any]) -> AsyncIterator[str]:
    """A Prometheus server on loopback with ``config``, storage in ``tmp_path``; its URL
    once it answers /-/ready."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus not found: install Debian's prometheus (scripts/install-system-deps)"
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port("127.0.0.1")
    log = (tmp_path / "prometheus.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await until(lambda: ready(url), PROMETHEUS_START_S, "Prometheus ready", process)
        yield url
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 20.0)
            except TimeoutError:
                process.kill()
                await process.wait()
        log.close()


async def until(check: Any, within: float, what: str, process: Any = None) -> None:
    """Poll ``check()`` (a coroutine function) until it holds; fail after ``within`` s."""
    deadline = time.monotonic() + within
    while not await check():
        if process is not None and process.returncode is not None:
            raise AssertionError(f"{what}: the process exited ({process.returncode})")
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.2)


async def ready(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(url + "/-/ready") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def api(url: str, path: str, **params: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url + path, params=params) as r:
        body = await r.json()
    assert body["status"] == "success", body
    return body["data"]


async def targets_down(url: str) -> list[str]:
    data = await api(url, "/api/v1/targets", state="active")
    return [
        f"{t['labels'].get('job')} {t['scrapeUrl']}: {t['health']} {t['lastError']}"
        for t in data["activeTargets"]
        if t["health"] != "up"
    ]


async def returns_data(url: str, query: str, since: float) -> bool:
    now = time.time()
    data = await api(
        url, "/api/v1/query_range", query=query, start=str(since), end=str(now), step="1"
    )
    return bool(data["result"])


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, query with the variables substituted) of every dashboard panel."""
    dashboard = json.loads(DASHBOARD.read_text("utf-8"))
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            query = target["expr"]
            for name, value in VARIABLES.items():
                query = query.replace(name, value)
            assert "$" not in query, (panel["title"], query)
            found.append((panel["title"], query))
    return found


def alert_selectors() -> list[tuple[str, str]]:
    """(alert name, metric selector) of every selector in every alert expression."""
    document = yaml.safe_load(ALERTS.read_text("utf-8"))
    found = []
    for group in document["groups"]:
        for rule in group["rules"]:
            for name, matchers in SELECTOR.findall(rule["expr"]):
                found.append((rule["alert"], name + matchers))
    return found


def ops_context(tls_dir: Path) -> ssl.SSLContext:
    """A client context with the operators' certificate (a regional LB admits ``ops/*``)."""
    context = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
    context.check_hostname = False  # gtm identities are URI SANs (gtm.tls), not host names
    context.load_cert_chain(tls_dir / "ops-gtm-up.pem", tls_dir / "ops-gtm-up-key.pem")
    return context


async def ask(
    url: str, client: str, *, key: str = TENANT_KEY, context: ssl.SSLContext | None = None
) -> tuple[int, str | None]:
    """One chat completion for a client at ``client``: its status and x-gtm-spilled-from."""
    headers = {"Authorization": f"Bearer {key}", "X-Forwarded-For": client}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url + "/v1/chat/completions", json=body, headers=headers, ssl=context or True
        ) as response,
    ):
        await response.read()
        return response.status, response.headers.get("x-gtm-spilled-from")


async def refused_requests(up: Up, document: dict[str, Any], context: ssl.SSLContext) -> None:
    """One refused request of each kind, and a drained region's spill and its 503."""
    front = up.base_url
    us_east = region_url(document, "us-east").replace("http://", "https://")
    eu_west = region_url(document, "eu-west").replace("http://", "https://")
    assert (await ask(front, BERLIN, key=US_ONLY_KEY))[0] == 451  # at the front door
    assert (await ask(us_east, BERLIN, context=context))[0] == 451  # at a region

    async def over_quota() -> bool:
        return (await ask(front, BERLIN, key=EU_KEY))[0] == 429

    await until(over_quota, DATA_WITHIN_S, "a 429 for the EU tenant's quota")
    drained = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "gtmctl", "drain", "region", "eu-west"),
        *("--api", f"http://127.0.0.1:{up.http_port + 1}"),
        *("--token-file", str(up.admin_dir / "operator.token")),
        stdout=asyncio.subprocess.DEVNULL,
    )
    assert await drained.wait() == 0

    async def spilled() -> bool:
        return (await ask(eu_west, NEW_YORK, context=context))[1] == "eu-west"

    await until(spilled, DATA_WITHIN_S, "a drained region's request spilled to its peer")

    async def unavailable() -> bool:  # a Berlin client: EEA only, its one EEA region drained
        return (await ask(eu_west, BERLIN, context=context))[0] == 503

    await until(unavailable, DATA_WITHIN_S, "a 503 for a Berlin client with no EEA region up")


async def load(up: Up, seconds: float) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "gtmctl", "load", "--trace", "synthetic", "--duration", str(seconds)),
        *("--url", up.base_url, "--model", MODEL),
        stdout=asyncio.subprocess.DEVNULL,
    )
    assert await asyncio.wait_for(process.wait(), 120.0) == 0


async def test_every_panel_and_alert_reads_series_a_real_deployment_exports(
    tmp_path: Path,
) -> None:
    tls_dir = tmp_path / "tls"
    policies = policies_with_eu_quota(tmp_path)
    async with running_up(
        tmp_path,
        *("--processes", "--speedup", "20", "--policies", str(policies)),
        *("--tls", "--tls-dir", str(tls_dir)),
        regions=REGIONS,
    ) as up:
        document = await deployment(up)
        config = scrape_config(up, document, tls_dir)
        async with prometheus(tmp_path, config) as url:

            async def all_up() -> bool:
                data = await api(url, "/api/v1/targets", state="active")
                expected = 1 + len(document["regions"]) + len(document["zones"])
                return len(data["activeTargets"]) == expected and not await targets_down(url)

            try:
                await until(all_up, TARGETS_UP_S, "every gtm target up")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {await targets_down(url)}") from None
            since = time.time()
            await load(up, 4.0)
            await refused_requests(up, document, ops_context(tls_dir))

            checks = [(f"panel {t}", q) for t, q in panel_queries()]
            checks += [(f"alert {a}", s) for a, s in alert_selectors()]
            pending = [
                (what, q)
                for what, q in checks
                if {n for n, _ in SELECTOR.findall(q)} <= PENDING_METRICS
            ]
            missing: list[str] = []
            deadline = time.monotonic() + DATA_WITHIN_S
            for what, query in checks:
                if (what, query) in pending:
                    continue
                while not await returns_data(url, query, since):
                    if time.monotonic() > deadline:
                        missing.append(f"{what}: {query}")
                        break
                    await asyncio.sleep(0.5)
            assert not missing, "no data:\n" + "\n".join(missing)
            groups = (await api(url, "/api/v1/rules", type="alert"))["groups"]
            rules = {r["name"]: r for g in groups for r in g["rules"]}
            assert set(rules) == {a for a, _ in alert_selectors()}
            assert all(r["health"] == "ok" for r in rules.values()), rules  # evaluated
            assert pending, "PENDING_METRICS names a metric no panel reads: drop it"
            for what, query in pending:  # empty only while no target exports the metric
                if not await returns_data(url, query, since):
                    for name, _ in SELECTOR.findall(query):
                        assert not await returns_data(url, f"count({name})", since), what
