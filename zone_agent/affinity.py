"""Keep a conversation on the GPU that answered its prefix, while that GPU can take it.

The agent's prefix index (:class:`zone_agent.prefix.PrefixIndex`) is its dispatch-side
placement memory: :meth:`zone_agent.accounting.Accounting.start` inserts a prompt's
blocks when the request is sent, so the next turn of a conversation, which repeats the
whole previous prompt, finds them at once. The profile's predicted TTFT credits those
cached tokens, but only on a GPU within a tight bounded load (ε = 0.25 of its share of
the zone's streams, :mod:`zone_agent.costs.ttft`), and its KV-room score prefers the
emptier GPUs: on a zone with a few streams per GPU, one or two streams more than the
mean cost the cached GPU its credit, and a second turn lands elsewhere, paying its
whole prefill again.

:func:`sticky_gpu` is the agent's edge rule after the profile's decision (the simulator
applies it where the agent does): the surviving GPU that *answered* the deepest prefix of
the prompt (the cheapest of them when several did; none when the profile's choice holds
as much) replaces the choice when

* it is within a looser load bound, :data:`STICKY_EPSILON` (twice its capacity-weighted
  share of the zone's streams, counting this request) — SGLang's cache-aware policy
  leaves the cache for the shortest queue once the load is imbalanced past a relative
  threshold (1.5 by default) and an absolute one; and
* its predicted TTFT, with the prompt's cached blocks credited, is at most
  :data:`STICKY_PENALTY_MS` above the choice's (the zone's cost,
  :func:`zone_agent.costs.ttft.cost_at`, both priced the same way) — llm-d's
  prefix-affinity filter breaks stickiness when the warm endpoint's TTFT penalty is too
  high.

The built-in baseline profiles (:data:`zone_agent.profiles.BUILTIN_PROFILES` other than
gtm's own, :data:`GTM_PROFILES`) run without it (:func:`keeps_affinity`), as they do in
the simulator, so a side-by-side run compares them as published.

Only an answer makes a home (the accounting's ``answered`` index: the blocks of the
prompts a GPU sent a first byte for, so prefilled), and a GPU silent since (a request
left it without a first byte: a deadline, a reset) is no home until it answers again.
A GPU that takes requests and never answers (a black hole) would otherwise hold every
prefix sent to it, and look idle once their deadlines release its charges: the rule
would pull each repeat back into it, as routers that pin a session to a backend keep
pinning it to one that has stopped answering until outlier detection ejects it.

A saturated GPU never holds a request here: the profile's filters (health, model, KV
fit) ran first and the rule only picks among their survivors. Sans-io: it reads the
decision's batch (the view and the charges read when the decision started) alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from zone_agent.batch import ZoneBatch
from zone_agent.costs.ttft import cost_at, load_scale, within_cap
from zone_agent.prefix import set_bits
from zone_agent.profiles import BUILTIN_PROFILES
from zone_agent.router import ZoneDecision, ZoneProfile

#: ε of the stickiness bound: a GPU may hold up to (1 + ε) × its capacity-weighted share
#: of the zone's streams and keep a conversation (the profile's credit stops at 1.25×).
STICKY_EPSILON = 1.0
#: Extra predicted TTFT the cached GPU may cost over the choice and keep the request
#: (llm-d's prefix-affinity filter has such a bound, ``maxTTFTPenaltyMs``): half the
#: goodput SLO's TTFT bound (2 s, the default profile's TTFT scale). A GPU whose queue
#: is that much longer is busy enough to leave; a shorter wait buys a prefill the
#: cache saves for the whole zone. Chosen on the simulator's Mooncake runs
#: (bench/prefix_affinity.py): 300 ms kept too few second turns, 2 s cost goodput.
STICKY_PENALTY_MS = 1000.0


#: gtm's own built-in profiles: the default, its goodput form, and the ablation before
#: KV-cache room.
GTM_PROFILES = frozenset({"default", "goodput", "ttft-only"})


def keeps_affinity(profile: ZoneProfile) -> bool:
    """Whether the agent applies :func:`sticky_gpu` to ``profile``'s decisions: every
    profile but the built-in baselines."""
    return profile.name in GTM_PROFILES or profile.name not in BUILTIN_PROFILES


def sticky_gpu(
    decision: ZoneDecision,
    *,
    epsilon: float = STICKY_EPSILON,
    penalty_ms: float = STICKY_PENALTY_MS,
) -> ZoneDecision:
    """``decision``, or the same decision on the surviving GPU that holds the deepest
    prefix of the prompt when that GPU may keep it (see the module docstring)."""
    outcome = decision.outcome
    batch = outcome.batch
    # A prompt shorter than a block has no prefix hashes, so no GPU can hold it.
    if outcome.runner.cost_model is None or not batch.request.prefix_hashes or not batch.any_match:
        return decision
    homes, depth = _deepest_survivors(_answered(batch), batch.alive)
    choice = outcome.choice
    if not homes or batch.blocks_at(choice) >= depth:
        return decision
    home = min(homes, key=lambda p: (_cost(batch, p), p))
    index = batch.index
    request = batch.request
    streams = batch.view.accounting.streams
    scale = load_scale(epsilon, batch.streams_sum(), float(request.sequences), batch.rate_sum)
    if not within_cap(
        float(streams[index.slots[home]]), request.sequences, scale, index.rate[home]
    ):
        return decision
    warm = _cost(batch, home)
    if not warm <= _cost(batch, choice) + penalty_ms:
        return decision
    predicted = warm if warm < math.inf else None
    uncached, blocks = batch.prefill_at(home)
    return decision._replace(
        outcome=outcome._replace(choice=home, predicted_ttft_ms=predicted),
        gpu=batch.view.gpus[index.positions.item(home)],
        uncached_tokens=uncached,
        matched_blocks=blocks,
        gpu_id=index.ids[home],
        choice=home,
        predicted_ttft_ms=predicted,
    )


def _cost(batch: ZoneBatch, position: int) -> float:
    """The zone's predicted TTFT at ``position`` with its cached blocks credited."""
    index = batch.index
    tokens = float(batch.queued[position]) + batch.uncached_at(position)
    return cost_at(
        tokens,
        float(index.ms_per_token[position]),
        float(index.inv_max_batched[position]),
        float(index.step_extra_ms[position]),
        True,
    )


def _answered(batch: ZoneBatch) -> list[tuple[int, int]]:
    """(position, leading blocks) of the candidates that answered a prompt starting as
    this one does, and are not silent since (see :mod:`zone_agent.accounting`)."""
    acc = batch.view.accounting
    silent = acc.silent
    where = batch.index.position_of_slot.get
    return [
        (position, depth)
        for depth, mask in acc.answered.match_groups(batch.request.prefix_hashes)
        for slot in set_bits(mask)
        if slot not in silent and (position := where(slot)) is not None
    ]


def _deepest_survivors(
    held: Iterable[tuple[int, int]], alive: npt.NDArray[np.bool_]
) -> tuple[list[int], int]:
    """The alive positions holding the most leading blocks, and how many (none, 0: no
    alive position holds any)."""
    found: list[int] = []
    most = 0
    for position, blocks in held:
        if not alive[position] or blocks < most:
            continue
        if blocks > most:
            found, most = [], blocks
        found.append(position)
    return found, most
