"""The relay's header rules and failure bookkeeping (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from gtm.errors import AttemptFailed, GtmError, RelayError, UpstreamError
from gtm.metrics import new_registry
from gtm.models import Tier
from gtm.relay import (
    HOP_BY_HOP,
    AiohttpUpstream,
    BreakCause,
    Ending,
    Failure,
    StreamBreaks,
    all_busy,
    cut_event,
    describe,
    end_to_end,
    is_event_stream,
    skip_set,
)


def test_the_hop_by_hop_set_holds_rfc_9110_and_the_classic_names() -> None:
    for name in (
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "transfer-encoding",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
        "trailer",
        "trailers",
        "host",
        "content-length",
    ):
        assert name in HOP_BY_HOP


def test_end_to_end_drops_hop_by_hop_and_connection_listed_names() -> None:
    headers = CIMultiDict(
        [
            ("Connection", "keep-alive, X-Private"),
            ("Keep-Alive", "timeout=5"),
            ("Trailers", "x"),
            ("TE", "trailers"),
            ("X-Private", "secret"),
            ("Authorization", "Bearer k"),
            ("X-Gtm-Hops", "1"),
            ("X-Gtm-Hops", "2"),
        ]
    )
    kept = end_to_end(headers)
    assert kept == [("Authorization", "Bearer k"), ("X-Gtm-Hops", "1"), ("X-Gtm-Hops", "2")]


def test_a_skip_set_drops_what_the_tier_sets_itself_case_blind() -> None:
    skip = skip_set("X-Request-Id")
    assert skip >= HOP_BY_HOP
    assert "x-request-id" in skip
    headers = CIMultiDict([("x-REQUEST-id", "client"), ("Accept", "text/event-stream")])
    assert end_to_end(headers, skip) == [("Accept", "text/event-stream")]


def test_the_skip_set_is_not_widened_in_place_by_a_connection_header() -> None:
    skip = skip_set()
    end_to_end(CIMultiDict([("Connection", "X-Once")]), skip)
    assert "x-once" not in skip


_SPELLINGS = st.sampled_from(
    [
        *("Host", "host", "HOST", "Content-Type", "content-type", "Content-Length"),
        *("content-length", "CONTENT-LENGTH", "Connection", "X-Request-Id", "x-request-id"),
        *("X-REQUEST-ID", "Keep-Alive", "keep-alive", "Date", "date", "X-Other", "x-other"),
        *("Transfer-Encoding", "TE", "Te", "te", "Server", "Authorization", "Upgrade"),
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(_SPELLINGS, st.sampled_from(["v", "x-other", "close", "X-Other, te"]))),
    st.sampled_from([HOP_BY_HOP, skip_set("X-Request-Id"), skip_set("Date") | {"x-other"}]),
)
def test_end_to_end_keeps_what_the_lower_cased_rule_keeps(
    fields: list[tuple[str, str]], skip: frozenset[str]
) -> None:
    # Common spellings are judged by set lookups: the same as lower-casing each name.
    headers = CIMultiDict(fields)
    named = headers.get("connection")
    rule = skip | {t.strip().lower() for t in named.split(",")} if named else skip
    expected = [(n, v) for n, v in fields if n.lower() not in rule]
    assert end_to_end(headers, skip) == expected
    assert end_to_end(headers, skip, fields) == expected  # the fields as a list: the same


def test_relay_errors_are_in_the_gtm_tree() -> None:
    failure = AttemptFailed(Failure.STATUS, "HTTP 503", status=503, body=b"busy")
    assert isinstance(failure, RelayError)
    assert isinstance(failure, GtmError)
    assert issubclass(UpstreamError, RelayError)
    assert failure.reason == "http_503"
    assert AttemptFailed(Failure.CONNECT, "refused").reason == "connect"


def test_all_busy_only_when_every_attempt_was_turned_away_for_capacity() -> None:
    busy = AttemptFailed(Failure.STATUS, "HTTP 429", status=429)
    full = AttemptFailed(Failure.STATUS, "HTTP 503", status=503)
    broken = AttemptFailed(Failure.STATUS, "HTTP 500", status=500)
    refused = AttemptFailed(Failure.CONNECT, "refused")
    assert all_busy([busy, full])
    assert not all_busy([busy, broken])
    assert not all_busy([busy, refused])
    assert not all_busy([])


def test_describe_names_each_target_and_detail() -> None:
    first = AttemptFailed(Failure.TIMEOUT, "no first byte in time")
    first.target = "gpu-1"
    second = AttemptFailed(Failure.STATUS, "HTTP 502", status=502)
    second.target = "gpu-2"
    assert describe([first, second]) == "gpu-1: no first byte in time; gpu-2: HTTP 502"
    assert describe([first], lambda t: f"zone {t}") == "zone gpu-1: no first byte in time"


class _Content:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def readany(self) -> bytes:
        raise self.error


class _Response:
    status = 200
    reason = "OK"
    headers: CIMultiDict[str] = CIMultiDict()
    content_length = None

    def __init__(self, error: BaseException) -> None:
        self.content = _Content(error)


async def test_aiohttp_errors_are_translated_at_the_seam_and_timeouts_stay_timeouts() -> None:
    late = AiohttpUpstream(cast(aiohttp.ClientResponse, _Response(aiohttp.ServerTimeoutError())))
    with pytest.raises(TimeoutError) as timed_out:
        await late.readany()
    assert not isinstance(timed_out.value, UpstreamError)
    broken = AiohttpUpstream(
        cast(aiohttp.ClientResponse, _Response(aiohttp.ClientPayloadError("truncated")))
    )
    with pytest.raises(UpstreamError, match="ClientPayloadError"):
        await broken.readany()


def test_no_tier_keeps_a_hop_by_hop_set_of_its_own() -> None:
    """The tiers drifted once (the front door lacked ``trailers``): the set lives here."""
    root = Path(__file__).resolve().parents[3]
    for tier in ("global_lb", "regional_lb", "zone_agent"):
        for module in (root / tier).rglob("*.py"):
            assert '"proxy-authenticate"' not in module.read_text(), module


def test_every_early_ending_has_a_break_cause_and_completion_has_none() -> None:
    assert Ending.COMPLETED.cause is None
    assert Ending.CUT_RESET.cause is BreakCause.UPSTREAM_RESET
    assert Ending.CUT_TIMEOUT.cause is BreakCause.UPSTREAM_TIMEOUT
    assert Ending.CLIENT_GONE.cause is BreakCause.CLIENT_DISCONNECT
    assert Ending.CANCELLED.cause is BreakCause.CANCELLED
    assert Ending.CUT_AFTER_DONE.cause is BreakCause.AFTER_DONE
    assert {e.cause for e in Ending} - {None} == set(BreakCause)


def test_the_cut_event_is_one_sse_event_in_openais_error_shape() -> None:
    event = cut_event(BreakCause.UPSTREAM_TIMEOUT)
    assert event.startswith(b"data: ")
    assert event.endswith(b"\n\n")
    assert event.count(b"\n") == 2
    body = json.loads(event[len(b"data: ") :])
    assert body == {
        "error": {
            "message": body["error"]["message"],
            "type": "server_error",
            "param": None,
            "code": "upstream_timeout",
        }
    }
    assert "stopped sending" in body["error"]["message"]


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("text/event-stream", True),
        ("Text/Event-Stream; charset=utf-8", True),
        ("application/json", False),
        ("", False),
    ],
)
def test_event_streams_are_told_by_their_content_type(content_type: str, expected: bool) -> None:
    assert is_event_stream(CIMultiDict({"Content-Type": content_type})) is expected


def test_stream_breaks_start_at_zero_for_every_cause_and_count_per_tier() -> None:
    registry = new_registry()
    breaks = StreamBreaks(registry, Tier.REGIONAL)
    for cause in BreakCause:
        labels = {"tier": "regional", "cause": cause.value}
        assert registry.get_sample_value("gtm_stream_breaks_total", labels) == 0.0
    breaks.count(BreakCause.CLIENT_DISCONNECT)
    breaks.count(BreakCause.CLIENT_DISCONNECT)
    labels = {"tier": "regional", "cause": "client_disconnect"}
    assert registry.get_sample_value("gtm_stream_breaks_total", labels) == 2.0
