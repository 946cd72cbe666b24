"""``tenant-affinity-scorer``: keep a tenant (or conversation) on one home region, within
a load bound, so its prefix caches stay warm.

The home region is found by rendezvous hashing (highest random weight, Thaler & Ravishankar
1998) of the affinity key over the surviving regions, so a region leaving or joining
moves only the keys it owned. Bounded loads (Mirrokni, Thorup & Zadimoghaddam, "Consistent
Hashing with Bounded Loads", SODA 2018): a region is skipped while its utilisation with
this request would exceed ``(1 + epsilon)`` × the candidates' mean utilisation, and the
key moves on to its next region in hash order. The home scores 1, every other region 0;
the profile's weight says how much TTFT the operator trades for locality.

The key is the tenant, or with ``per_conversation`` the tenant plus the hash of the
prompt's first prefix block (a conversation shares its first block across turns).

**Where a prefix was just sent** (:func:`sticky_region`). The front door remembers
which region it sent each prompt's blocks to (:class:`gtm.routing.placement.
PlacementMemory`, updated when it forwards), so the next turn of a conversation, which
repeats the last prompt, can go back to the region whose caches hold it before any
summary says so. The region decision is made as always; the recalled region then
replaces its choice when it may serve the request (allowed, available, serving the
model), is within the same bounded load as the tenant home above, and its predicted
TTFT with the recalled prefix credited (those tokens need no prefill there) is no worse
than the choice's — affinity yields to load, as llm-d's prefix-affinity filter breaks
stickiness when the warm endpoint's TTFT penalty is too high.

**The home is priced without the conversation's previous turn**, by the same per-class
terms as every region (:func:`global_lb.view.model_terms`). The client sends the next
turn after the answer, so that turn no longer waits nor holds a GPU there, yet the
home's numbers may still count it twice over: a region summary published after it was
sent counts it as queued, on the GPU class that took it (no longer free), when it was
prefilling then; a summary published before it leaves it to the front door's in-flight
ledger, whose charge takes the home's fastest free GPU and queues its tokens until the
next summary. Either way the home lost its free fast GPU — the very GPU holding the
prefix — and was priced by its pooled backlog at its average GPU, while a peer was
priced by an idle fast GPU: the repeat left for the peer. So the home is priced from
its summary (not the ledger's overlay): one published after the turn was sent, with
that turn taken out of its queue and its GPU class given back the GPU
(:func:`gtm.routing.cost.without_turn`); one published before, by the GPU that took
the turn, free, when the front door's ledger shows nothing else sent there since —
whatever that summary shows queued was ahead of the turn, and that GPU prefilled its
share of it before the turn, whose answer the client has (first come, first served);
with other charges there, by that summary as it is (the ledger cannot tell which
charges followed the turn).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from enum import StrEnum
from typing import ClassVar

import numpy as np
from pydantic import Field

from global_lb.batch import GlobalCap, RegionBatch, remember
from global_lb.plugins.ttft import cost_ms, cost_terms
from global_lb.view import GlobalView, RegionState, model_terms
from gtm.models import Frozen, GeoPoint, ModelLoad, RouteRequest
from gtm.routing import Capability, Plugin
from gtm.routing.cost import without_turn
from gtm.routing.framework import Floats
from gtm.routing.placement import PlacementMemory, Recall

TYPE_NAME = "tenant-affinity-scorer"

#: ε = 0.25 lets a home region run 25 % above the mean before keys move; the paper's
#: experiments (and Vimeo's production use of the scheme) sit between 0.25 and 1.
DEFAULT_EPSILON = 0.25


#: Utilisation (running + waiting over running capacity) below which a region keeps the
#: conversations it holds whatever the others' load: on a quiet fleet one request more
#: is many times the mean, and the bounded load alone would move every second turn.
#: SGLang's cache-aware policy likewise calls the load imbalanced only past an absolute
#: threshold as well as a relative one.
STICKY_FLOOR = 0.5
#: ε of the bounded load a region keeps its conversations within.
STICKY_EPSILON = DEFAULT_EPSILON


class Params(Frozen):
    epsilon: float = Field(default=DEFAULT_EPSILON, gt=0.0, le=100.0, allow_inf_nan=False)
    per_conversation: bool = False


def affinity_key(request: RouteRequest, *, per_conversation: bool) -> str:
    """What the home region is hashed from: the tenant, or the tenant and conversation."""
    if per_conversation and request.prefix_hashes:
        return f"{request.tenant}/{request.prefix_hashes[0]}"
    return request.tenant


class TenantAffinityScorer(Plugin):
    capabilities: ClassVar[frozenset[StrEnum]] = frozenset(
        {Capability.PREPARE, Capability.SCORES_IN_RANGE, GlobalCap.SURVIVOR_SCORES}
    )

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        params = params or Params()
        self._epsilon = params.epsilon
        self.per_conversation = params.per_conversation

    def prepare(self, view: GlobalView, /) -> dict[object, int | None]:
        """The view's homes, found on first use: (key, model, survivors) → position."""
        return {}

    def key(self, request: RouteRequest) -> str:
        return affinity_key(request, per_conversation=self.per_conversation)

    def home_position(self, batch: RegionBatch, /) -> int | None:
        """The position of the request's home among the batch's survivors."""
        mask = batch.survivor_mask()
        request: RouteRequest = batch.request  # type: ignore[assignment]
        key = (self.key(request), batch.model, mask)
        memo: dict[object, int | None] | None = batch.prepared.get(self)
        if memo is None:
            memo = {}
        if key in memo:
            return memo[key]
        regions = batch.regions
        home = self.home(request, [regions[i] for i in batch.layout.positions(mask)])
        return remember(memo, key, None if home is None else batch.layout.ids.index(home))

    def scores(self, batch: RegionBatch, /) -> Floats:
        column = np.zeros(len(batch), dtype=np.float64)
        at = self.home_position(batch)
        if at is not None:
            column[at] = 1.0
        return column

    def survivor_scores(self, batch: RegionBatch, positions: Sequence[int], /) -> list[float]:
        at = self.home_position(batch)
        return [1.0 if i == at else 0.0 for i in positions]

    def home(self, request: RouteRequest, candidates: Sequence[RegionState]) -> str | None:
        """The first region in the key's hash order that is within the load bound."""
        key = self.key(request)
        ordered = sorted(candidates, key=lambda c: _weight(key, c.id), reverse=True)
        bound = (1.0 + self._epsilon) * _mean_utilisation(request.model, candidates)
        for region in ordered:
            if _utilisation_with_one_more(request.model, region) <= bound:
                return region.id
        return ordered[0].id if ordered else None


def sticky_region(
    recall: Recall | None,
    chosen: str | None,
    request: RouteRequest,
    view: GlobalView,
    allowed: frozenset[str],
    *,
    point: GeoPoint | None,
    country: str | None,
    tokens_per_block: float,
    epsilon: float = STICKY_EPSILON,
) -> str | None:
    """The region for ``request``: the recalled one (where its prefix was last sent)
    when it may take it and pays for itself, else ``chosen`` (the decision's).

    ``tokens_per_block``: prompt tokens per prefix block, to price the recalled prefix.
    Sans-io: reads the recall, the request and the immutable view alone."""
    if recall is None or chosen is None or recall.target == chosen:
        return chosen
    home = view.by_id.get(recall.target)
    best = view.by_id.get(chosen)
    if home is None or best is None or home.id not in allowed or not home.available:
        return chosen
    model = request.model
    if home.summary is not None:
        terms = home.terms.get(model)
        if terms is None or not terms.serves:
            return chosen
    candidates = [r for r in view.regions if r.id in allowed and r.available]
    bound = max(STICKY_FLOOR, (1.0 + epsilon) * _mean_utilisation(model, candidates))
    if _utilisation_with_one_more(model, home) > bound:
        return chosen
    tokens = request.input_tokens
    # The recalled blocks, or the previous prompt when they are the whole fingerprint.
    credit = int(recall.held_tokens(tokens, len(request.prefix_hashes), tokens_per_block))
    rtt = view.latency.rtt_ms(point, country, home)
    warm = cost_ms(rtt, *_home_terms(home, model, recall), tokens - credit)
    cold = _cost(view, best, model, point, country, tokens)
    return home.id if warm <= cold else chosen


def _home_terms(region: RegionState, model: str, recall: Recall) -> tuple[float, float]:
    """``(base, per_token)`` of the recalled region without the conversation's previous
    turn (see the module docstring): its summary's load, that turn taken out."""
    summary = region.summary
    load = region.loads.get(model)
    if summary is None or load is None:
        return cost_terms(region, model)
    if summary.published_at >= recall.at:
        terms = model_terms(without_turn(load, recall.tokens))
        return terms.queue_ms, terms.ms_per_token
    shown = region.terms.get(model)
    if shown is None or shown in (model_terms(load), model_terms(load, 1, recall.tokens)):
        # Everything this summary shows was there before the turn was sent, and the
        # front door sent nothing there since but the turn: the GPU that took the turn
        # prefilled its share of that backlog first (first come, first served), then
        # the turn, whose answer the client has. That GPU is free.
        return 0.0, _prefix_gpu_ms_per_token(load)
    terms = model_terms(load)
    return terms.queue_ms, terms.ms_per_token


def _prefix_gpu_ms_per_token(load: ModelLoad) -> float:
    """Prefill time per token on the GPU that took a conversation's previous turn: one
    of the fastest class (the tiers place a request on the fastest free GPU); a load
    without classes, one GPU at its average rate."""
    for gpu_class in load.classes:  # fastest first
        if gpu_class.healthy_gpus > 0 and gpu_class.prefill_tokens_per_s > 0.0:
            return gpu_class.ms_per_token
    return model_terms(load.model_copy(update={"queued_prefill_tokens": 0})).ms_per_token


class RegionMemory:
    """The front door's part of stickiness: its :class:`PlacementMemory` of regions and
    :func:`sticky_region` over it. :meth:`place` is called when a request is forwarded
    (the front door's ``_decide``, the simulator's global tier), with the decision's
    region: it returns the region to forward to and remembers it; :meth:`served`
    corrects that when another region served the request. ``now`` is on the
    region summaries' clock (wall time live, simulated time in the simulator)."""

    __slots__ = ("memory",)

    def __init__(self, memory: PlacementMemory | None = None) -> None:
        self.memory = memory if memory is not None else PlacementMemory()

    def place(
        self,
        chosen: str | None,
        request: RouteRequest,
        view: GlobalView,
        allowed: frozenset[str],
        *,
        point: GeoPoint | None,
        country: str | None,
        tokens_per_block: float,
        now: float,
    ) -> str | None:
        hashes = request.prefix_hashes
        if chosen is None or not hashes:
            return chosen
        memory = self.memory
        region = sticky_region(
            memory.recall(hashes, now),
            chosen,
            request,
            view,
            allowed,
            point=point,
            country=country,
            tokens_per_block=tokens_per_block,
        )
        if region is not None:
            memory.remember(hashes, region, now, request.input_tokens)
        return region

    def served(self, hashes: Sequence[int], region: str, *, sent_at: float, tokens: int) -> None:
        """The prompt of ``hashes`` (``tokens`` tokens), forwarded at ``sent_at`` (the
        ``now`` :meth:`place` had), was served by ``region``, not the region it was
        forwarded to: that region's regional LB spilled it to a peer (or the front door
        retried it there). Its prefix is cached where it was served, so that is where
        the next turn goes back to; the region that spilled it holds nothing of it."""
        self.memory.remember(hashes, region, sent_at, tokens)


def _cost(
    view: GlobalView,
    region: RegionState,
    model: str,
    point: GeoPoint | None,
    country: str | None,
    tokens: int,
) -> float:
    base, per_token = cost_terms(region, model)
    return cost_ms(view.latency.rtt_ms(point, country, region), base, per_token, tokens)


def _weight(key: str, region_id: str) -> int:
    # BLAKE2b, not hash(): the same key must pick the same region in every process.
    digest = hashlib.blake2b(f"{key}\x00{region_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _mean_utilisation(model: str, candidates: Sequence[RegionState]) -> float:
    used = capacity = 0
    for region in candidates:
        load = region.loads.get(model)
        if load is None:
            continue
        used += load.running_requests + load.waiting_requests
        capacity += load.max_running_requests
    # The request being placed counts, so the bound is never 0 on an idle fleet.
    return (used + 1) / capacity if capacity else 1.0


def _utilisation_with_one_more(model: str, region: RegionState) -> float:
    load = region.loads.get(model)
    if region.summary is None:
        return 0.0
    if load is None or load.max_running_requests == 0:
        return float("inf")
    return (load.running_requests + load.waiting_requests + 1) / load.max_running_requests
