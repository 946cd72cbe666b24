"""An operator's logs: JSON lines, one access line per request at each tier, and never a
prompt or a key.

``gtm --log-format json up --processes`` on private loopback addresses (the format is
given to ``gtm`` only: ``gtm up`` must pass it on to every process it starts). A client
sends requests with known API keys and a prompt no log could contain by chance — chat
and completions, streamed and not, a bad key (401), a residency refusal (451) and a bad
body (400) — each with its own ``x-request-id``. Then every process's log file in the
run directory is read:

* every line (``gtm up``'s own log's too) is one JSON object with ``ts``, ``level``,
  ``logger`` and ``msg``;
* each served request has one access line at the front door, the regional LB and the
  zone agent, with the request id the client saw, the tenant, the status and the region;
  each refused one has one at the front door only, with its status (and a client sent
  straight to the regional LB and refused there has one at the regional LB, with its
  tenant);
* no log file, and no audit file, contains the prompt or any key sent.

Before, ``gtm`` had no ``--log-format`` and no tier wrote a line per request.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gtm.state.etcd_server import EtcdServer
from tests.integration.gtmctl.up.helpers import Up, running_up
from tests.integration.users_paths.direct_clients import (
    BERLIN,
    MODEL,
    TENANT_KEY,
    ask,
    deployment,
    region_url,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: The healthcare tenant: US only, so a Berlin client (GDPR: EEA only) is refused (451).
US_ONLY_KEY = "gtm-acme-health-example"
#: A prompt no log line could hold by chance.
PROMPT = f"logs-test-prompt-{uuid.uuid4().hex}"
#: A key no tenant has (401), as a leaked one would look.
BAD_KEY = f"sk-logs-test-{uuid.uuid4().hex}"
TIERS = ("global", "regional", "zone")
#: Longest wait for the access lines of requests already answered.
LINES_WITHIN_S = 30.0
#: Longest start of the whole deployment (a shared 2-core machine under load).
START_TIMEOUT_S = 150.0


def json_up(tmp_path: Path, etcd: EtcdServer) -> AbstractAsyncContextManager[Up]:
    """``gtm --log-format json up --processes`` with one region (eu-west)."""
    return running_up(
        tmp_path,
        *("--processes", "--state", etcd.etcd_url, "--speedup", "20"),
        regions=("eu-west",),
        root_args=("--log-format", "json"),
        start_timeout_s=START_TIMEOUT_S,
    )


def _chat(stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 4,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _completion(stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "stream": stream}


#: name → (path, body, key, expected status); every request is sent from Berlin.
REQUESTS: dict[str, tuple[str, dict[str, Any], str, int]] = {
    "chat": ("/v1/chat/completions", _chat(False), TENANT_KEY, 200),
    "chat-stream": ("/v1/chat/completions", _chat(True), TENANT_KEY, 200),
    "completion": ("/v1/completions", _completion(False), TENANT_KEY, 200),
    "completion-stream": ("/v1/completions", _completion(True), TENANT_KEY, 200),
    "bad-key": ("/v1/chat/completions", _chat(False), BAD_KEY, 401),
    "refused": ("/v1/chat/completions", _chat(False), US_ONLY_KEY, 451),
    "bad-body": ("/v1/chat/completions", {**_chat(False), "max_tokens": -1}, TENANT_KEY, 400),
}
SERVED = {name for name, (*_, status) in REQUESTS.items() if status == 200}


async def _send(up: Up, run: str) -> dict[str, tuple[int, str, str]]:
    """Each request once; name → (status, request id, decision id) as the client saw them."""
    seen: dict[str, tuple[int, str, str]] = {}
    async with aiohttp.ClientSession() as session:
        for name, (path, body, key, _) in REQUESTS.items():
            headers = {
                "Authorization": f"Bearer {key}",
                "X-Forwarded-For": BERLIN,
                "x-request-id": f"{run}-{name}",
            }
            async with session.post(up.base_url + path, json=body, headers=headers) as response:
                await response.read()  # streams to their end
                seen[name] = (
                    response.status,
                    response.headers.get("x-request-id", ""),
                    response.headers.get("x-gtm-decision-id", ""),
                )
    return seen


def _log_lines(run_dir: Path) -> dict[str, list[str]]:
    return {p.name: p.read_text().splitlines() for p in sorted((run_dir / "logs").glob("*.log"))}


def _access(run_dir: Path, run: str) -> dict[str, list[dict[str, Any]]]:
    """Access lines of this run's requests, by tier."""
    found: dict[str, list[dict[str, Any]]] = {tier: [] for tier in TIERS}
    for lines in _log_lines(run_dir).values():
        for line in lines:
            if '"gtm.access.' not in line or run not in line:
                continue
            record = json.loads(line)
            found[record["logger"].removeprefix("gtm.access.")].append(record)
    return found


async def _all_lines(run_dir: Path, run: str) -> dict[str, list[dict[str, Any]]]:
    """Wait for the access lines every tier owes (a line is written as its handler ends,
    just after the client read the last byte)."""
    deadline = time.monotonic() + LINES_WITHIN_S
    while True:
        found = _access(run_dir, run)
        if len(found["global"]) >= len(REQUESTS) and all(
            len(found[tier]) >= len(SERVED) for tier in ("regional", "zone")
        ):
            return found
        if time.monotonic() > deadline:
            return found  # the assertions say what is missing
        await asyncio.sleep(0.1)


async def _one_line(run_dir: Path, request_id: str, tier: str) -> dict[str, Any]:
    deadline = time.monotonic() + LINES_WITHIN_S
    while not (found := _access(run_dir, request_id)[tier]):
        assert time.monotonic() < deadline, f"no {tier} access line for {request_id}"
        await asyncio.sleep(0.1)
    (line,) = found
    return line


async def test_json_logs_have_one_access_line_per_request_per_tier_and_no_prompt_or_key(
    tmp_path: Path, own_etcd_server: EtcdServer
) -> None:
    run = f"logs-{uuid.uuid4().hex[:12]}"
    run_dir = tmp_path / "run"
    async with json_up(tmp_path, own_etcd_server) as up:
        seen = await _send(up, run)
        assert {name: s[0] for name, s in seen.items()} == {
            name: status for name, (*_, status) in REQUESTS.items()
        }
        found = await _all_lines(run_dir, run)
        # Straight to the regional LB, as a cached DNS answer sends a client: its own
        # residency refusal names the tenant too.
        direct = f"direct-{uuid.uuid4().hex[:12]}"
        url = region_url(await deployment(up), "eu-west")
        refused = await ask(url, client=BERLIN, key=US_ONLY_KEY, headers={"x-request-id": direct})
        assert refused.status == 451
        regional_refusal = await _one_line(run_dir, direct, "regional")

    for tier in TIERS:
        by_id: dict[str, list[dict[str, Any]]] = {}
        for record in found[tier]:
            by_id.setdefault(record["request_id"], []).append(record)
        expected = REQUESTS if tier == "global" else SERVED
        assert sorted(by_id) == sorted(f"{run}-{name}" for name in expected), tier
        for name in expected:
            status, request_id, decision_id = seen[name]
            assert request_id == f"{run}-{name}", name  # every answer names its request
            (record,) = by_id[request_id]
            assert record["status"] == status, (tier, name)
            assert record["method"] == "POST", (tier, name)
            assert record["path"] == REQUESTS[name][0], (tier, name)
            assert record["end"] == "ok", (tier, name)
            assert record["duration_ms"] >= 0, (tier, name)
            for field in ("ts", "level", "msg", "peer"):
                assert record[field], (tier, name, field)
            if tier == "global" and decision_id:
                assert record["decision_id"] == decision_id, name
            if name in SERVED:
                assert record["region"] == "eu-west", (tier, name)
                assert record["zone"], (tier, name)
                assert record["gpu"], (tier, name)
                assert record["model"] == MODEL, (tier, name)
                assert record["ttft_ms"] is not None, (tier, name)
                assert record["tokens_in"] > 0, (tier, name)
                assert record["tenant"] == (None if tier == "zone" else "demo-global"), tier
    assert regional_refusal["status"] == 451
    assert regional_refusal["tenant"] == "acme-health"
    assert regional_refusal["country"] == "DE"
    front = {r["request_id"].removeprefix(f"{run}-"): r for r in found["global"]}
    assert front["refused"]["tenant"] == "acme-health"
    assert front["bad-body"]["tenant"] == "demo-global"
    assert front["bad-key"]["tenant"] is None
    for name in SERVED:  # the front door located the client; the region believed it
        assert front[name]["country"] == "DE"
        assert front[name]["location_source"] == "trusted-proxy-xff"
        assert front[name]["client"] == BERLIN
    regional = {r["request_id"].removeprefix(f"{run}-"): r for r in found["regional"]}
    assert {regional[name]["location_source"] for name in SERVED} == {"signed-upstream"}
    for name in ("chat", "chat-stream", "completion"):  # the answer reported its usage
        assert front[name]["tokens_source"] == regional[name]["tokens_source"] == "usage"
        assert front[name]["tokens_out"] == regional[name]["tokens_out"] > 0

    logs = _log_lines(run_dir)
    kinds = {name.partition("-")[0] for name in logs}
    assert {"global", "regional", "zone", "gpu"} <= kinds, sorted(logs)
    logs["gtm-up.log"] = (run_dir / "gtm-up.log").read_text().splitlines()  # gtm up's own
    for name, lines in logs.items():
        for line in lines:
            record = json.loads(line)  # every line is one JSON object
            assert isinstance(record, dict), (name, line)
            assert {"ts", "level", "logger", "msg"} <= record.keys(), (name, line)
            assert record["ts"].endswith("Z"), (name, line)
    secrets = (PROMPT, BAD_KEY, TENANT_KEY, US_ONLY_KEY)
    written = [p for p in run_dir.rglob("*") if p.is_file() and p.suffix in (".log", ".jsonl")]
    audits = [p for p in written if p.suffix == ".jsonl"]
    assert audits, "no audit file was written"
    for path in [*written, tmp_path / "up.stderr"]:
        text = path.read_text(errors="replace")
        for secret in secrets:
            assert secret not in text, f"{secret} in {path}"
