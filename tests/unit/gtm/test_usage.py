from __future__ import annotations

import json

from gtm.usage import USAGE_BODY_BYTES, Usage, UsageTap


def sse(*events: object) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def test_a_json_body_reports_its_usage() -> None:
    tap = UsageTap(streaming=False)
    assert not tap.relayed_any
    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}})
    tap.feed(body[:10].encode())
    tap.feed(body[10:].encode())
    assert tap.relayed_any
    assert tap.usage(100) == Usage(5, 9)


def test_a_stream_with_a_usage_chunk() -> None:
    data = sse(
        {"choices": [{"delta": {"content": "a"}}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    )
    tap = UsageTap(streaming=True)
    for i in range(0, len(data), 7):  # lines split across chunks
        tap.feed(data[i : i + 7])
    assert tap.usage(100) == Usage(3, 1)


def test_a_stream_without_usage_counts_its_chunks() -> None:
    tap = UsageTap(streaming=True)
    tap.feed(sse(*({"choices": [{"delta": {"content": "x"}}]} for _ in range(4))))
    assert tap.usage(42) == Usage(42, 4)
    assert UsageTap(streaming=True).usage(1) is None


def test_unusable_bodies_report_no_usage() -> None:
    for body in (b"not json", b'{"usage": "x"}', b'{"usage": {"prompt_tokens": "1"}}', b"[1]"):
        tap = UsageTap(streaming=False)
        tap.feed(body)
        assert tap.usage(1) is None
    big = UsageTap(streaming=False)
    big.feed(b" " * (USAGE_BODY_BYTES + 1))
    assert big.usage(1) is None
