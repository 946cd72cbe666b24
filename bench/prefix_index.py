"""The zone agent's prefix index: the compiled form (``zone_agent/_prefix.c``) against the
dict form it replaced (:class:`zone_agent.prefix.DictPrefixIndex`), in one run.

A zone of GPUs, each remembering up to its KV capacity in 256-byte blocks, gets 16-block
prompts on random GPUs until every GPU's LRU has turned over twice. Printed per form:
µs per inserted block, µs per ``match_groups`` of a prompt it holds, the bytes the index
holds when empty and when full (traced Python allocations for the dict form, in a
pass of its own; the C form's own count for the compiled one), and whether both forms
end holding the same blocks.

    python bench/prefix_index.py            # 16 GPUs × 7,200 blocks (an 8B model on H100s)
    python bench/prefix_index.py --smoke    # 4 GPUs × 500 blocks (CI)
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tracemalloc
from collections.abc import Callable

from zone_agent.prefix import COMPILED, DictPrefixIndex, PrefixIndex

BLOCKS_PER_PROMPT = 16


def _run(
    make: Callable[[], DictPrefixIndex], gpus: int, capacity: int, seed: int, traced: bool
) -> tuple[float, float, int, int, DictPrefixIndex]:
    rng = random.Random(seed)
    prompts = [
        (rng.randrange(gpus), tuple(rng.getrandbits(64) for _ in range(BLOCKS_PER_PROMPT)))
        for _ in range(2 * gpus * capacity // BLOCKS_PER_PROMPT)
    ]
    if traced:
        tracemalloc.start()
    index = make()
    for gpu in range(gpus):  # every GPU gets its slot (the compiled form allocates here)
        index.insert(gpu, (), capacity)
    empty = _size(index, traced)
    started = time.perf_counter()
    for gpu, hashes in prompts:
        index.insert(gpu, hashes, capacity)
    insert_us = (time.perf_counter() - started) / (len(prompts) * BLOCKS_PER_PROMPT) * 1e6
    full = _size(index, traced)
    if traced:
        tracemalloc.stop()
    recent = [hashes for _, hashes in prompts[-min(len(prompts), 5_000) :]]
    match_us = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for hashes in recent:
            index.match_groups(hashes)
        match_us = min(match_us, (time.perf_counter() - started) / len(recent) * 1e6)
    return insert_us, match_us, empty, full, index


def _size(index: DictPrefixIndex, traced: bool) -> int:
    if traced:
        return tracemalloc.get_traced_memory()[0]
    nbytes = getattr(index, "nbytes", None)  # the compiled form's own count
    return nbytes if isinstance(nbytes, int) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a small zone, for CI")
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--capacity", type=int, default=7_200, help="blocks per GPU")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs per form (best taken)")
    args = parser.parse_args(argv)
    gpus, capacity = (4, 500) if args.smoke else (args.gpus, args.capacity)
    if not COMPILED:
        print("prefix_index: zone_agent._prefix is not compiled: run `pip install -e .`")
        return 1
    print(f"prefix index: {gpus} GPUs × {capacity} blocks, {BLOCKS_PER_PROMPT}-block prompts")
    rows = []
    for name, make, traced in (
        ("dict (reference)", DictPrefixIndex, True),
        ("compiled", PrefixIndex, False),
    ):
        # Best of three fresh runs: the machine's other load only ever adds time.
        runs = [_run(make, gpus, capacity, args.seed, False) for _ in range(args.repeat)]
        insert_us = min(run[0] for run in runs)
        match_us = min(run[1] for run in runs)
        _, _, empty, full, index = runs[-1]
        if traced:  # tracing slows every allocation: its own pass, for the sizes only
            _, _, empty, full, index = _run(make, gpus, capacity, args.seed, True)
        rows.append(index)
        print(
            f"  {name:17s} insert {insert_us:6.3f} µs/block   match {match_us:6.2f} µs/prompt"
            f"   memory empty {empty / 1e6:6.2f} MB, full {full / 1e6:6.2f} MB"
            f" ({full / max(1, len(index)):.0f} B per block held)"
        )
    reference, compiled = rows
    same = len(reference) == len(compiled) and all(
        reference.blocks(gpu) == compiled.blocks(gpu) for gpu in range(gpus)
    )
    print(f"  same blocks held by both forms: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
