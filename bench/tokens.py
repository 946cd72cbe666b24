"""Cost of counting and encoding a prompt's tokens, compiled kernel against the patterns.

Every request's prompt is counted by :func:`gtm.tokens.count_text_tokens` on every tier,
and the GPU emulator encodes it (:func:`gtm.tokens.encode_text_ids`); ASCII text takes
the compiled kernel (gtm/_tokens.c) when it is built, else the pre-tokenizer patterns.
This prints, for ASCII prompts of about 1k, 12k and 50k tokens (English prose with code,
numbers and identifiers mixed in), the µs of each form:

* ``count`` — ``count_text_tokens`` (kernel), ``count regex`` — the patterns a span at
  a time (``_count_text_regex``, what ran before the kernel), ``count reference`` —
  the Unicode pattern over the whole text with a Python loop;
* ``encode`` / ``encode regex`` — ``encode_text_ids`` by each form;
* ``zone_request`` — the zone agent's reading of a chat request carrying the prompt
  (``zone_agent.request.zone_request``: parameters, token count, fingerprint text, block
  hashes), with the kernel and with it switched off.

Each figure is the best of several repetitions (the machine's other load only ever
adds time). The forms' results are checked equal before anything is timed.

    python bench/tokens.py           # full run (a few seconds)
    python bench/tokens.py --smoke   # one small prompt (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
from array import array
from collections.abc import Callable, Iterator

from gtm import tokens
from zone_agent.request import Endpoint, zone_request

_PROSE = (
    "the request is routed to the GPU whose cache holds the longest prefix of its prompt "
    "unless that GPU is already busy so the router weighs queued tokens against cached "
    "blocks and the predicted time to first token of every candidate"
)
_WORDS = tuple(_PROSE.split(" "))
_OTHER = (
    "don't",
    "it's",
    "12345",
    "3.14159",
    "x_total",
    "f(x, y)",
    "{'key': [1, 2]}",
    "\n\n",
    "\tindent",
    "--flag=value",
    "HTTP/1.1",
    "we'll",
)


def prompt(target_tokens: int, seed: int = 1) -> str:
    """ASCII text of at least ``target_tokens`` tokens: prose with ~1 in 8 words from
    ``_OTHER`` (code, numbers, contractions, whitespace runs)."""
    rng = random.Random(seed)
    words: list[str] = []
    text = ""
    while tokens.count_text_tokens_reference(text) < target_tokens:
        for _ in range(max(16, target_tokens // 16)):
            words.append(rng.choice(_OTHER) if rng.random() < 0.125 else rng.choice(_WORDS))
        text = " ".join(words)
    return text


@contextlib.contextmanager
def patterns_only() -> Iterator[None]:
    """The module's kernel entry points switched off: every text takes the patterns."""
    saved = tokens._count_ascii, tokens._ascii_token_ids
    tokens._count_ascii = tokens._ascii_token_ids = None
    try:
        yield
    finally:
        tokens._count_ascii, tokens._ascii_token_ids = saved


def best_us(work: Callable[[], object], repeat: int) -> float:
    """Best per-call µs over ``repeat`` rounds of enough calls to last ~20 ms."""
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            work()
        if time.perf_counter() - start > 0.02 or calls >= 1 << 16:
            break
        calls *= 2
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            work()
        rounds.append((time.perf_counter() - start) / calls)
    return min(rounds) * 1e6


def _encode_regex(text: str) -> array[int]:
    out = array("I")
    tokens._extend_text_regex(out, text)
    return out


def measure(text: str, repeat: int) -> dict[str, float]:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 16}
    count = tokens.count_text_tokens(text)
    assert count == tokens._count_text_regex(text) == tokens.count_text_tokens_reference(text)
    assert tokens.encode_text_ids(text) == _encode_regex(text)

    def request() -> object:
        return zone_request(body, Endpoint.CHAT, request_id="r")

    with patterns_only():
        assert request() == zone_request(body, Endpoint.CHAT, request_id="r")
        request_regex = best_us(request, repeat)
    return {
        "tokens": count,
        "count": best_us(lambda: tokens.count_text_tokens(text), repeat),
        "count regex": best_us(lambda: tokens._count_text_regex(text), repeat),
        "count reference": best_us(lambda: tokens.count_text_tokens_reference(text), repeat),
        "encode": best_us(lambda: tokens.encode_text_ids(text), repeat),
        "encode regex": best_us(lambda: _encode_regex(text), repeat),
        "zone_request": best_us(request, repeat),
        "zone_request regex": request_regex,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="one small prompt, for CI")
    parser.add_argument("--repeat", type=int, default=5, help="rounds per figure (best taken)")
    args = parser.parse_args(argv)
    sizes, repeat = ((1_000,), 1) if args.smoke else ((1_000, 12_000, 50_000), args.repeat)
    print(f"gtm._tokens compiled: {tokens.COMPILED}")
    columns = [
        "count",
        "count regex",
        "count reference",
        "encode",
        "encode regex",
        "zone_request",
        "zone_request regex",
    ]
    print(f"{'tokens':>8} {'chars':>8} " + " ".join(f"{c:>18}" for c in columns) + "   (µs)")
    for size in sizes:
        text = prompt(size)
        row = measure(text, repeat)
        cells = " ".join(f"{row[c]:>18.1f}" for c in columns)
        print(f"{int(row['tokens']):>8} {len(text):>8} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
