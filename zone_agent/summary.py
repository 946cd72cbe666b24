"""The zone summary: what the regional LB needs to know about this zone, under a lease.

:func:`build_summary` is pure (a view in, a :class:`gtm.models.ZoneSummary` out).
Per model, over the GPUs that may take requests now:

* ``prefill_tokens_per_s``: the sum of their effective prefill rates (profile × health
  weight) — the denominator of every TTFT estimate upstream;
* ``decode_tokens_per_s``: the profiles' decode throughput at a batch of
  :data:`REFERENCE_BATCH` sequences of :data:`REFERENCE_CONTEXT` tokens (a convention,
  so zones compare on the same footing);
* ``queued_prefill_tokens``: uncached prompt tokens waiting (the agent's own in flight,
  plus other clients' queues from fresh scrapes);
* running / waiting requests, running capacity (``max_num_seqs``), KV blocks total and
  free.

A regional LB derives the zone's predicted TTFT for a request of ``n`` uncached tokens
as ``ModelLoad.queue_delay_ms() + 1000·n / prefill_tokens_per_s`` (ARCHITECTURE §2).
``prefix_sketch`` lists the zone's hottest leading prefix blocks (Space-Saving top-k).

:class:`gtm.state.publisher.LeasedPublisher` writes it every ``interval`` seconds under a
lease of three intervals, so a dead agent's summary disappears by itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gtm.models import ModelLoad, ZoneSummary
from zone_agent.view import ModelIndex, ZoneView

#: Reference decode workload of ``decode_tokens_per_s`` (see the module docstring).
REFERENCE_BATCH = 64
REFERENCE_CONTEXT = 2048
#: Prefix blocks in the published sketch.
SKETCH_BLOCKS = 32


def _model_load(view: ZoneView, index: ModelIndex) -> ModelLoad:
    acc = view.accounting
    ok = index.available
    slots = index.slots
    pending = acc.pending[slots] + index.external_queued
    streams = acc.streams[slots]
    sent_since = np.maximum(0.0, acc.kv_blocks[slots] - index.kv_own_base)
    kv_free = np.maximum(0.0, index.kv_free_base - sent_since)
    static = _static_load(index)
    return ModelLoad(
        model=index.model,
        gpus=len(index.ids),
        healthy_gpus=static.healthy_gpus,
        prefill_tokens_per_s=static.prefill_tokens_per_s,
        decode_tokens_per_s=static.decode_tokens_per_s,
        queued_prefill_tokens=int(pending[ok].sum()),
        running_requests=int(np.maximum(index.running, streams)[ok].sum()),
        waiting_requests=static.waiting_requests,
        max_running_requests=static.max_running_requests,
        kv_blocks_total=static.kv_blocks_total,
        kv_blocks_free=min(static.kv_blocks_total, int(kv_free[ok].sum())),
    )


@dataclass(frozen=True, slots=True)
class _StaticLoad:
    """The part of a model's load that only the view's scrapes and health change."""

    healthy_gpus: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    waiting_requests: int
    max_running_requests: int
    kv_blocks_total: int


def _static_load(index: ModelIndex) -> _StaticLoad:
    """Worked out once per view (a view outlives several summaries when nothing is
    scraped in between, as in the fleet simulator: ~1,000 profile evaluations a
    summary round at 1,000 GPUs)."""
    found = index.memo.get(_StaticLoad)
    if isinstance(found, _StaticLoad):
        return found
    ok = index.available
    decode = sum(
        profile.decode_tokens_per_s(min(REFERENCE_BATCH, profile.max_num_seqs), REFERENCE_CONTEXT)
        * float(index.weight[i])
        for i, profile in enumerate(index.profiles)
        if ok[i]
    )
    static = _StaticLoad(
        healthy_gpus=int(ok.sum()),
        prefill_tokens_per_s=float(index.rate[ok].sum()),
        decode_tokens_per_s=float(decode),
        waiting_requests=int(index.waiting[ok].sum()),
        max_running_requests=int(index.max_seqs[ok].sum()),
        kv_blocks_total=int(index.kv_total[ok].sum()),
    )
    index.memo[_StaticLoad] = static
    return static


def build_summary(view: ZoneView, published_at: float) -> ZoneSummary:
    """The zone's summary from its current view (``published_at``: wall-clock seconds)."""
    models = tuple(_model_load(view, index) for index in view.by_model.values())
    return ZoneSummary(
        zone_id=view.zone_id,
        region_id=view.region_id,
        published_at=published_at,
        healthy=any(m.healthy_gpus > 0 for m in models),
        models=models,
        prefix_sketch=view.accounting.hot.top(SKETCH_BLOCKS),
    )
