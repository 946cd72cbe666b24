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
  free;
* ``classes``: the same by GPU class (GPU type × tensor-parallel degree), fastest first,
  with the GPUs that are **free** — available, nothing waiting to prefill, room for a
  sequence and :data:`FREE_KV_SHARE` of their KV cache — so upper tiers price the zone
  by the GPU that would take a request (:func:`gtm.routing.cost.prefill_options`), not
  by its average.

A regional LB derives the zone's predicted TTFT for a request of ``n`` uncached tokens
as ``ModelLoad.queue_delay_ms() + 1000·n / prefill_tokens_per_s`` (ARCHITECTURE §2).
``prefix_sketch`` lists the zone's hottest leading prefix blocks (Space-Saving top-k).

:class:`gtm.state.publisher.LeasedPublisher` writes it every ``interval`` seconds under a
lease of three intervals, so a dead agent's summary disappears by itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gtm.gpu_profiles import GpuProfile
from gtm.models import GpuClassLoad, ModelLoad, ZoneSummary
from gtm.routing.framework import Ints
from zone_agent.view import ModelIndex, ZoneView

#: Reference decode workload of ``decode_tokens_per_s`` (see the module docstring).
REFERENCE_BATCH = 64
REFERENCE_CONTEXT = 2048
#: Prefix blocks in the published sketch.
SKETCH_BLOCKS = 32
#: A GPU counts as free only with this share of its KV cache free: llm-d's saturation
#: detector calls a GPU at 80 % KV use saturated (regional_lb.view), and one near it
#: would make a new prompt wait for KV blocks, not start at once. (In the fleet
#: simulator, counting any GPU with a free block made overloaded regions look idle.)
FREE_KV_SHARE = 0.2


def _model_load(view: ZoneView, index: ModelIndex) -> ModelLoad:
    acc = view.accounting
    ok = index.available
    slots = index.slots
    pending = acc.pending[slots] + index.external_queued
    streams = acc.streams[slots]
    sent_since = np.maximum(0.0, acc.kv_blocks[slots] - index.kv_own_base)
    kv_free = np.maximum(0.0, index.kv_free_base - sent_since)
    static = _static_load(index)
    running = np.maximum(index.running, streams)
    room = kv_free >= FREE_KV_SHARE * index.kv_total
    free = ok & (pending <= 0.0) & (running < index.max_seqs) & room
    classes = tuple(
        GpuClassLoad(
            gpu_class=c.name,
            healthy_gpus=c.healthy_gpus,
            prefill_tokens_per_s=c.prefill_tokens_per_s,
            free_gpus=int(free[c.members].sum()),
            queued_prefill_tokens=int(pending[c.members].sum()),
            kv_blocks_free=int(kv_free[c.members].sum()),
        )
        for c in static.classes
    )
    return ModelLoad(
        model=index.model,
        gpus=len(index.ids),
        healthy_gpus=static.healthy_gpus,
        prefill_tokens_per_s=static.prefill_tokens_per_s,
        decode_tokens_per_s=static.decode_tokens_per_s,
        queued_prefill_tokens=int(pending[ok].sum()),
        running_requests=int(running[ok].sum()),
        waiting_requests=static.waiting_requests,
        max_running_requests=static.max_running_requests,
        kv_blocks_total=static.kv_blocks_total,
        kv_blocks_free=min(static.kv_blocks_total, int(kv_free[ok].sum())),
        classes=classes,
    )


@dataclass(frozen=True, slots=True)
class _Class:
    """The available GPUs of one class (``members``: positions in the model's index)."""

    name: str
    members: Ints
    healthy_gpus: int
    prefill_tokens_per_s: float


def class_name(profile: GpuProfile) -> str:
    """A GPU class's name: the GPU type, ``<n>x<type>`` for a tensor-parallel group."""
    tp = profile.tensor_parallel
    return profile.gpu_type if tp <= 1 else f"{tp}x{profile.gpu_type}"


def _classes(index: ModelIndex) -> tuple[_Class, ...]:
    """The available GPUs grouped by class, fastest first (ties by name)."""
    ok = index.available
    groups: dict[str, list[int]] = {}
    for i, profile in enumerate(index.profiles):
        if ok[i]:
            groups.setdefault(class_name(profile), []).append(i)
    found = [
        _Class(
            name, np.array(members, dtype=np.intp), len(members), float(index.rate[members].sum())
        )
        for name, members in groups.items()
    ]
    # The order ModelLoad requires: per-GPU time ascending (GpuClassLoad.ms_per_token).
    return tuple(
        sorted(found, key=lambda c: (_ms_per_token(c.healthy_gpus, c.prefill_tokens_per_s), c.name))
    )


def _ms_per_token(gpus: int, rate: float) -> float:
    return 1000.0 * gpus / rate if rate > 0.0 else float("inf")


@dataclass(frozen=True, slots=True)
class _StaticLoad:
    """The part of a model's load that only the view's scrapes and health change."""

    healthy_gpus: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    waiting_requests: int
    max_running_requests: int
    kv_blocks_total: int
    classes: tuple[_Class, ...]


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
        classes=_classes(index),
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
