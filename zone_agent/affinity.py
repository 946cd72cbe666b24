"""Keep a conversation on the GPU its prefix was just sent to, while that GPU can take it.

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
applies it where the agent does): the surviving GPU holding the deepest prefix of the
prompt (the cheapest of them when several do; none when the profile's choice holds as
much) replaces the choice when

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


#: gtm's own built-in profiles: the default and the ablation before KV-cache room.
GTM_PROFILES = frozenset({"default", "ttft-only"})


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
    if outcome.runner.cost_model is None or not batch.any_match:
        return decision
    groups = batch.match_groups
    held = batch.matches.items() if groups is None else _by_position(groups)
    homes = _deepest_survivors(held, batch.alive)
    choice = outcome.choice
    if not homes or choice in homes:
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
    moved = outcome._replace(choice=home, predicted_ttft_ms=warm if warm < math.inf else None)
    return decision._replace(
        outcome=moved,
        gpu=batch.view.gpus[index.positions.item(home)],
        uncached_tokens=batch.uncached_at(home),
        matched_blocks=batch.blocks_at(home),
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


def _by_position(groups: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(position, leading blocks) of match groups (depth, mask of positions)."""
    return [(p, depth) for depth, mask in groups for p in set_bits(mask)]


def _deepest_survivors(held: Iterable[tuple[int, int]], alive: npt.NDArray[np.bool_]) -> list[int]:
    """The alive positions holding the most leading blocks (none: no alive position
    holds any)."""
    found: list[int] = []
    most = 0
    for position, blocks in held:
        if not alive[position] or blocks < most:
            continue
        if blocks > most:
            found, most = [], blocks
        found.append(position)
    return found
