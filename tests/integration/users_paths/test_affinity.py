"""A multi-turn chat's next turn goes back to the GPU that holds its prompt, and hits.

``gtm up --processes`` on private loopback addresses, two EU regions of two zones of two
emulated GPUs each; the client talks to the front door with the openai SDK, as a chat
application does. It sends a long conversation, then — right after the answer, before
any summary or scrape could tell the tiers where that prompt now lives — the same
conversation again. The second request must be served by the same GPU (``x-gtm-gpu``)
and find its prompt in that GPU's prefix cache (``usage.prompt_tokens_details
.cached_tokens``, what the emulated vLLM reports). Each turn repeats with new words, so
no cache is warm from an earlier turn or test.

Before, each tier chose again as if nothing held the prompt: the front door's spread
draw and the regional LB's zone choice (its zone sketches arrive once a second) sent
the repeat elsewhere, where it was prefilled again from scratch.
"""

from __future__ import annotations

import random
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gtm.state.etcd_server import EtcdServer
from tests.integration.gtmctl.up.helpers import running_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CHAT = "meta-llama/Llama-3.1-8B-Instruct"
#: Conversations tried: each must come back to its GPU with a cache hit.
CONVERSATIONS = 6
#: Words of the conversation's history (one word = one token for the emulated workers):
#: a long prompt, whose prefill a cache hit saves.
HISTORY_WORDS = 3000


def _history(rng: random.Random) -> list[ChatCompletionMessageParam]:
    words = [f"w{rng.randrange(10**9)}" for _ in range(HISTORY_WORDS)]
    return [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": " ".join(words)},
    ]


async def test_the_next_turn_lands_on_the_same_gpu_and_hits_its_cache(
    tmp_path: Path, own_etcd_server: EtcdServer
) -> None:
    rng = random.Random()
    async with running_up(
        tmp_path,
        *("--processes", "--state", own_etcd_server.etcd_url, "--speedup", "10"),
        regions=("eu-west", "eu-central"),
    ) as up:
        client = openai.AsyncOpenAI(base_url=f"{up.base_url}/v1", api_key="gtm-demo-eu")
        async with client:
            for _ in range(CONVERSATIONS):
                messages = _history(rng)
                first = await client.chat.completions.with_raw_response.create(
                    model=CHAT, messages=messages, max_tokens=4
                )
                again = await client.chat.completions.with_raw_response.create(
                    model=CHAT, messages=messages, max_tokens=4
                )
                where = [r.headers["x-gtm-gpu"] for r in (first, again)]
                assert where[1] == where[0], f"the repeat moved: {where}"
                usage = again.parse().usage
                assert usage is not None
                assert usage.prompt_tokens_details is not None
                cached = usage.prompt_tokens_details.cached_tokens or 0
                assert cached >= HISTORY_WORDS // 2, f"cached {cached} of {usage.prompt_tokens}"
