"""What a streaming request holds while it is in flight (issue 25: the worker's memory
crept up at every new peak of streams in flight).

A prompt's token ids are an int object each; past planning nothing needs them (the
engine request keeps the length and the block hashes), so a stream in flight must not
hold them: Python's small-object arenas that a peak of held ids takes are never given
back.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import httpx
import pytest

from gtm import tokens
from gtm.gpu_profiles import LLAMA_8B

from .conftest import SimFactory

#: About 6,000 tokens: 190 KB of int objects if the stream held them.
PROMPT = " ".join(f"word{k}" for k in range(3000))


@pytest.fixture
def tracing() -> Iterator[None]:
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start(4)
    yield
    if not was:
        tracemalloc.stop()


def held_by_tokenizer(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes still alive that gtm.tokens allocated (token ids, their tuples)."""
    only = snapshot.filter_traces([tracemalloc.Filter(True, tokens.__file__)])
    return sum(stat.size for stat in only.statistics("filename"))


async def test_a_stream_in_flight_holds_no_token_ids(make_sim: SimFactory, tracing: None) -> None:
    sim = await make_sim(speedup=1.0)  # real time: the stream stays in flight
    body = {
        "model": LLAMA_8B,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 2000,
        "stream": True,
    }
    async with (
        httpx.AsyncClient(timeout=20.0) as client,
        client.stream("POST", sim.url + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.aiter_lines()
        first = await anext(lines)
        assert first.startswith("data: ")
        in_flight = held_by_tokenizer(tracemalloc.take_snapshot())
    # The ids of a 6,000-token prompt alone take 190 KB; what is left is the block
    # hashes the engine keeps (one per 16 tokens) and the tokenizer's own caches.
    assert in_flight < 64 * 1024, f"{in_flight} bytes of token ids held by a stream"
