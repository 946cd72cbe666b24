"""What checking an OpenAI body's parameters costs each tier, against named peers timed
in the same run: ``json.loads`` of the same body (the parse every tier does anyway) and
:func:`gtm.openai_request.read_prompt` without the check (the rest of the body's
reading: token counts, the fingerprint text).

:func:`gtm.openai_params.check_params` runs once per request at each tier a request
crosses, before its decision. Printed per body: µs per check, per ``json.loads`` and per
read, and the check's share of the whole reading (parse + check + read).

    python bench/openai_params.py            # 20,000 calls per figure
    python bench/openai_params.py --smoke    # a second (CI)
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
from collections.abc import Callable

from gtm.openai_params import CHAT, COMPLETIONS, check_params
from gtm.openai_request import read_prompt

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: (name, path, body): what ``gtm load`` sends, a 20-turn chat with the usual sampling
#: parameters and a tool, and a completions request with a stop list and a logit bias.
BODIES: list[tuple[str, str, bytes]] = [
    (
        "load chat",
        CHAT,
        json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "word " * 200}],
                "max_tokens": 64,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode(),
    ),
    (
        "20-turn chat",
        CHAT,
        json.dumps(
            {
                "model": MODEL,
                "messages": [
                    {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 4}
                    for i in range(20)
                ],
                "max_tokens": 64,
                "temperature": 0.7,
                "top_p": 0.9,
                "n": 1,
                "stop": ["\n\n"],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "tool_choice": "auto",
            }
        ).encode(),
    ),
    (
        "completion",
        COMPLETIONS,
        json.dumps(
            {
                "model": MODEL,
                "prompt": "word " * 200,
                "max_tokens": 16,
                "temperature": 0,
                "stop": ["a", "b", "c", "d"],
                "logit_bias": {str(t): -100 for t in range(8)},
                "seed": 7,
            }
        ).encode(),
    ),
]


def _per_call_us(call: Callable[[], object], count: int) -> float:
    """The best of three timings in CPU time (less disturbed by a busy machine), µs per
    call."""
    return min(timeit.repeat(call, timer=time.process_time, number=count, repeat=3)) / count * 1e6


def figures(count: int) -> None:
    print(f"{'body':14s} {'bytes':>6s} {'check µs':>9s} {'loads µs':>9s} {'read µs':>8s} share")
    for name, path, raw in BODIES:
        check, loads, checked_read = _timings(path, raw, count)
        read = max(0.0, checked_read - check)
        share = check / (loads + checked_read)
        print(f"{name:14s} {len(raw):6d} {check:9.2f} {loads:9.2f} {read:8.2f} {share:5.1%}")


def _timings(path: str, raw: bytes, count: int) -> tuple[float, float, float]:
    """µs per check, per ``json.loads`` and per ``read_prompt`` (which checks) of ``raw``."""
    body = json.loads(raw)
    check_params(body, path)  # valid: the figure is the cost of letting it through
    return (
        _per_call_us(lambda: check_params(body, path), count),
        _per_call_us(lambda: json.loads(raw), count),
        _per_call_us(lambda: read_prompt(body, path), count),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a second (CI)")
    args = parser.parse_args()
    figures(1_000 if args.smoke else 20_000)


if __name__ == "__main__":
    main()
