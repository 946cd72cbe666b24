"""An operator's traces: one trace per request — the client's — with one span per hop,
parented hop by hop, and a spill visible in the spans.

``gtm up --processes`` with eu-central and eu-west on private loopback addresses, every
daemon told by the environment to trace into one file (``GTM_TRACE_EXPORTER=file``,
``GTM_TRACE_FILE``: ``gtm up`` passes its environment on to the processes it starts). A
client sends requests that carry its own W3C ``traceparent``:

* through the front door: the spans of the request are exactly three, the front door's,
  a regional LB's and a zone agent's, all in the client's trace; the front door's parent
  is the client's span, the regional LB's the front door's, the zone agent's the regional
  LB's; they name the decision (tenant id, model, region, zone, GPU, decision id) and the
  response's usage, never the prompt or the key;
* straight to eu-central once the operator drained it (as a cached DNS answer sends a
  client): eu-central spills to eu-west, and the spans say so — eu-central's span has
  ``gtm.spill.from``/``gtm.spill.to``, eu-west's regional span is its child and names
  where the request was spilled from, and eu-west's zone agent served it.

The file is read after ``gtm up`` stopped, so every span is in it. Before, no tier made a
span and the client's ``traceparent`` crossed the tiers untouched.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.gtmctl.up.helpers import running_up
from tests.integration.gtmctl.up.test_up import eventually
from tests.integration.users_paths.direct_clients import (
    BERLIN,
    MODEL,
    TENANT_KEY,
    ask,
    deployment,
    region_url,
)

pytestmark = [pytest.mark.integration, pytest.mark.etcd, pytest.mark.timeout(300)]

#: A prompt no span could hold by chance.
PROMPT = f"traces-test-prompt-{uuid.uuid4().hex}"
#: Longest start of the whole deployment (a shared 2-core machine under load).
START_TIMEOUT_S = 150.0

Span = dict[str, Any]


def traceparent() -> tuple[str, str, str]:
    """A client's ``traceparent`` (sampled) and its trace and span ids."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def gtm(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gtmctl", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def _through_front_door(base_url: str, header: str, request_id: str) -> dict[str, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
    headers = {
        "Authorization": f"Bearer {TENANT_KEY}",
        "X-Forwarded-For": BERLIN,
        "x-request-id": request_id,
        "traceparent": header,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(base_url + "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        await response.read()
        assert response.status == 200, await response.text()
        return dict(response.headers)


def _spans(path: Path) -> list[Span]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _hex(value: str | None) -> str | None:
    return None if value is None else value.removeprefix("0x")


def _of_trace(spans: list[Span], trace_id: str) -> list[Span]:
    return [s for s in spans if _hex(s["context"]["trace_id"]) == trace_id]


def _service(span: Span) -> str:
    return str(span["resource"]["attributes"]["service.name"])


def _by_tier(spans: list[Span]) -> dict[str, list[Span]]:
    tiers: dict[str, list[Span]] = {}
    for span in spans:
        tiers.setdefault(span["attributes"]["gtm.tier"], []).append(span)
    return tiers


def _parent_of(child: Span, parent: Span) -> bool:
    return _hex(child["parent_id"]) == _hex(parent["context"]["span_id"])


async def test_one_trace_per_request_one_span_per_hop_parents_right_and_the_spill_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    monkeypatch.setenv("GTM_TRACE_EXPORTER", "file")
    monkeypatch.setenv("GTM_TRACE_FILE", str(spans_file))
    front_header, front_trace, client_span = traceparent()
    front_request = f"traces-{uuid.uuid4().hex[:12]}"
    spilled: list[tuple[str, str]] = []  # (trace id, request id) of the request that spilled

    async with running_up(
        tmp_path,
        *("--processes", "--speedup", "20"),
        regions=("eu-central", "eu-west"),
        start_timeout_s=START_TIMEOUT_S,
    ) as up:
        answer = await _through_front_door(up.base_url, front_header, front_request)
        document = await deployment(up)
        done = await asyncio.to_thread(
            gtm, "drain", "region", "eu-central", "--state", document["state"]
        )
        assert done.returncode == 0, done.stderr
        eu_central = region_url(document, "eu-central")

        async def spilled_to_eu_west() -> bool:
            header, trace_id, _ = traceparent()
            request_id = f"spill-{uuid.uuid4().hex[:12]}"
            sent = {"traceparent": header, "x-request-id": request_id}
            got = await ask(eu_central, client=BERLIN, headers=sent)
            if got.status == 200 and got.spilled_from == "eu-central":
                assert got.region == "eu-west", got
                spilled.append((trace_id, request_id))
                return True
            return False

        await eventually(spilled_to_eu_west, "a direct client spilled from drained eu-central")

    spans = _spans(spans_file)
    text = spans_file.read_text()
    assert PROMPT not in text
    assert TENANT_KEY not in text

    # Through the front door: the client's trace, one span per hop, parented hop by hop.
    mine = [s for s in spans if s["attributes"].get("gtm.request.id") == front_request]
    assert {_hex(s["context"]["trace_id"]) for s in mine} == {front_trace}
    assert len(_of_trace(spans, front_trace)) == len(mine) == 3, mine
    tiers = _by_tier(mine)
    ((front,), (regional,), (zone,)) = (tiers["global"], tiers["regional"], tiers["zone"])
    assert [_service(s) for s in (front, regional, zone)] == [
        "gtm-global",
        "gtm-regional",
        "gtm-zone",
    ]
    assert _hex(front["parent_id"]) == client_span
    assert _parent_of(regional, front)
    assert _parent_of(zone, regional)
    assert all(s["kind"] == "SpanKind.SERVER" for s in mine)
    served_region, served_zone = answer["x-gtm-region"], answer["x-gtm-zone"]
    for span in mine:
        attributes = span["attributes"]
        assert attributes["http.response.status_code"] == 200, span
        assert attributes["gen_ai.operation.name"] == "chat", span
        assert attributes["gen_ai.request.model"] == MODEL, span
        assert attributes["gtm.region"] == served_region, span
        assert attributes["gtm.zone"] == served_zone, span
        assert attributes["gtm.gpu"] == answer["x-gtm-gpu"], span
        assert "gtm.spill.from" not in attributes, span
    assert front["attributes"]["gtm.decision.reasons"][0].startswith("residency:allowed")
    assert set(front["attributes"]["gtm.decision.allowed_regions"]) == {"eu-central", "eu-west"}
    assert front["attributes"]["gtm.decision.predicted_ttft_ms"] >= 0
    assert regional["attributes"]["gtm.decision.route"] in ("local", "queue")
    assert zone["attributes"]["gtm.decision.profile"]
    assert zone["attributes"]["gtm.decision.predicted_ttft_ms"] >= 0
    decided = front["attributes"]
    assert decided["gtm.decision.id"] == answer["x-gtm-decision-id"]
    assert decided["gtm.tenant.id"] == regional["attributes"]["gtm.tenant.id"] == "demo-global"
    assert decided["gtm.client.country"] == "DE"
    assert decided["gtm.tokens.source"] == "usage"
    assert decided["gen_ai.usage.output_tokens"] > 0
    assert decided["gen_ai.usage.input_tokens"] > 0

    # Straight to drained eu-central: spilled to eu-west, and the spans say so.
    ((spill_trace, spill_request),) = spilled
    trace = [s for s in _of_trace(spans, spill_trace)]
    assert {s["attributes"].get("gtm.request.id") for s in trace} == {spill_request}
    tiers = _by_tier(trace)
    assert sorted(tiers) == ["regional", "zone"]
    assert len(tiers["zone"]) == 1, trace
    (zone,) = tiers["zone"]
    first, second = sorted(tiers["regional"], key=lambda s: s["start_time"])
    assert first["resource"]["attributes"]["gtm.region"] == "eu-central"
    assert second["resource"]["attributes"]["gtm.region"] == "eu-west"
    assert _parent_of(second, first)
    assert _parent_of(zone, second)
    assert zone["resource"]["attributes"]["gtm.region"] == "eu-west"
    spilling = first["attributes"]
    assert spilling["gtm.decision.route"] == "spill"
    assert spilling["gtm.decision.reasons"] == ["region-drained"]
    assert (spilling["gtm.spill.from"], spilling["gtm.spill.to"]) == ("eu-central", "eu-west")
    assert spilling["gtm.region"] == "eu-west"
    receiving = second["attributes"]
    assert (receiving["gtm.spill.from"], receiving["gtm.region"]) == ("eu-central", "eu-west")
