"""Whatever the zone looks like, no profile picks an ejected, wrong-model or non-fitting GPU.

And a refusal is never a wrong refusal: a profile refuses only when no GPU satisfies the
hard rules (available, serves the model, context and KV capacity).
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gtm.errors import NoEligibleCandidate
from gtm.gpu_profiles import LLAMA_8B, LLAMA_70B
from gtm.models import WorkerState
from tests.unit.zone_agent.helpers import Gpu, make_request, make_view
from zone_agent.accounting import Accounting
from zone_agent.errors import ModelNotServed
from zone_agent.health import HealthStatus
from zone_agent.plugins.fits_filter import PromptTooLong
from zone_agent.profiles import BUILTIN_PROFILES, builtin_profile
from zone_agent.request import CanaryChoice, ZoneRequest
from zone_agent.router import ZoneProfile
from zone_agent.view import ZoneView

PROFILES = {name: builtin_profile(name) for name in BUILTIN_PROFILES}
MODELS = (LLAMA_8B, LLAMA_70B)


@st.composite
def gpus(draw: st.DrawFn, index: int) -> Gpu:
    scraped = draw(st.booleans())
    return Gpu(
        id=f"gpu-{index:02d}",
        gpu_type=draw(st.sampled_from(["H100", "A100-80GB", "L40S", "V100", "TPU"])),
        models=tuple(draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=2, unique=True))),
        state=draw(st.sampled_from([WorkerState.READY] * 4 + list(WorkerState))),
        health=draw(
            st.builds(
                HealthStatus,
                eligible=st.booleans() | st.just(True),
                reason=st.just("ejected (outlier)"),
                weight=st.floats(0.05, 1.0),
                half_open=st.booleans(),
            )
        ),
        drained=draw(st.booleans()) and draw(st.booleans()),
        running=draw(st.floats(0, 300)) if scraped else None,
        waiting=draw(st.floats(0, 50)),
        kv_usage=draw(st.floats(0, 1)),
        kv_blocks=draw(st.integers(10, 20_000)) if scraped and draw(st.booleans()) else None,
        block_size=draw(st.sampled_from([None, 16, 32])),
        scraped_age=draw(st.floats(0, 3)),
    )


@st.composite
def zones(draw: st.DrawFn) -> tuple[ZoneView, Accounting]:
    count = draw(st.integers(1, 10))
    acc = Accounting()
    view = make_view([draw(gpus(i)) for i in range(count)], acc)
    for _ in range(draw(st.integers(0, 10))):
        gpu = f"gpu-{draw(st.integers(0, count - 1)):02d}"
        acc.start(
            gpu, prefill_tokens=draw(st.integers(0, 50_000)), sequences=draw(st.integers(1, 4))
        )
    return view, acc


def hard_ok(view: ZoneView, model: str, position: int, needed: int, input_tokens: int) -> bool:
    index = view.by_model[model]
    busy_trial = (
        bool(index.half_open[position]) and view.accounting.streams[index.slots[position]] > 0
    )
    blocks = math.ceil(input_tokens / index.block_size[position]) + 1
    return (
        index.reasons[position] is None
        and not busy_trial
        and bool(index.loaded[position])
        and index.max_model_len[position] >= needed
        and index.kv_total[position] >= blocks
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    zone=zones(),
    model=st.sampled_from([*MODELS, "not-served"]),
    tokens=st.integers(1, 200_000),
    max_output=st.none() | st.integers(1, 8_000),
    profile=st.sampled_from(sorted(PROFILES)),
    seq=st.integers(0, 1000),
)
def test_never_a_bad_gpu_and_never_a_wrong_refusal(
    zone: tuple[ZoneView, Accounting],
    model: str,
    tokens: int,
    max_output: int | None,
    profile: str,
    seq: int,
) -> None:
    view, _ = zone
    request = make_request(
        tokens=tokens, model=model, max_output=max_output, seq=seq, text="p" * (tokens % 3000)
    )
    needed = tokens + (max_output or 1)
    index = view.by_model.get(model)
    eligible = (
        []
        if index is None
        else [i for i in range(len(index.ids)) if hard_ok(view, model, i, needed, tokens)]
    )
    try:
        decision = PROFILES[profile].decide(request, view)
    except (ModelNotServed, NoEligibleCandidate) as exc:
        refusal: Exception = exc
    else:
        assert index is not None
        assert decision.choice in eligible, (decision.gpu_id, decision.to_decision().trace)
        assert decision.gpu.unavailable_reason() is None
        assert model in decision.gpu.worker.models
        return
    if isinstance(refusal, ModelNotServed):
        assert index is None
    else:
        assert not eligible, refusal
    if isinstance(refusal, PromptTooLong):
        assert refusal.needed == needed


# ------------------------------------------------------------ fast paths = reference runner

REFERENCE = {name: p.without_fast_paths() for name, p in PROFILES.items()}
TEXTS = ("system prompt one " * 120, "system prompt two " * 90, "other " * 200)


@st.composite
def busy_zones(draw: st.DrawFn) -> ZoneView:
    """Up to 70 GPUs (the fast paths' sizes), some canaries and versions, with in-flight
    charges (KV blocks too, so the free-KV rule bites) and prefix blocks held."""
    count = draw(st.integers(1, 70))
    # Zone-wide odds, so that many zones have no half-open, ejected or canary GPU at all.
    rare = st.integers(0, draw(st.sampled_from([0, 20, 200])))
    gpus = []
    for i in range(count):
        gpu = draw(gpus_strategy(i))
        gpu.health = HealthStatus(
            draw(rare) != 1,
            "ejected (outlier)",
            weight=gpu.health.weight,
            half_open=draw(rare) == 1,
        )
        if draw(rare) != 1:
            gpu.state, gpu.drained = WorkerState.READY, False
        labels: tuple[tuple[str, str], ...] = ()
        if draw(rare) == 1:
            labels = (("canary", "true"),)
        if draw(rare) == 1:
            labels += (("version", draw(st.sampled_from(["v1", "v2"]))),)
        gpu.labels = labels
        gpus.append(gpu)
    acc = Accounting()
    view = make_view(gpus, acc)
    for _ in range(draw(st.integers(0, 3 * count))):
        text = draw(st.sampled_from(TEXTS))[: draw(st.integers(256, 2200))]
        acc.start(
            f"gpu-{draw(st.integers(0, count - 1)):02d}",
            prefill_tokens=draw(st.integers(0, 40_000)),
            sequences=draw(st.integers(1, 4)),
            kv_blocks=float(draw(st.integers(0, 3_000))),
            prefix_hashes=make_request(text=text).prefix_hashes,
            prefix_capacity=draw(st.sampled_from([4, 40, 5_000])),
        )
    return view


gpus_strategy = gpus


def outcome(profile: ZoneProfile, request: ZoneRequest, view: ZoneView) -> object:
    """Everything a decision says, down to the trace with every score (or the refusal)."""
    try:
        d = profile.decide(request, view)
    except (ModelNotServed, NoEligibleCandidate) as exc:
        trace = getattr(exc, "trace", None)
        return type(exc), str(exc), getattr(exc, "filter_name", None), trace
    scores = tuple(
        (name, column[d.outcome.batch.alive].tolist()) for name, column in d.outcome.scores
    )
    return (
        d.choice,
        d.gpu_id,
        d.predicted_ttft_ms,
        d.uncached_tokens,
        d.matched_blocks,
        d.outcome.batch.alive.tolist(),
        d.outcome.totals[d.outcome.batch.alive].tolist(),
        scores,
        d.to_decision(None),
    )


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    view=busy_zones(),
    model=st.sampled_from(MODELS),
    tokens=st.integers(1, 40_000),
    max_output=st.none() | st.integers(1, 8_000),
    profile=st.sampled_from(sorted(PROFILES)),
    seq=st.integers(0, 1000),
    text=st.sampled_from(("", *TEXTS)),
    version=st.none() | st.sampled_from(["v1", "v2"]),
    canary=st.sampled_from(list(CanaryChoice)),
    request_id=st.text(min_size=1, max_size=8),
)
def test_fast_paths_decide_exactly_as_the_reference_runner(
    view: ZoneView,
    model: str,
    tokens: int,
    max_output: int | None,
    profile: str,
    seq: int,
    text: str,
    version: str | None,
    canary: CanaryChoice,
    request_id: str,
) -> None:
    request = make_request(
        tokens=tokens,
        model=model,
        max_output=max_output,
        seq=seq,
        text=text[: 1 + tokens % 2200] if text else None,
        version=version,
        canary=canary,
        request_id=request_id,
    )
    fast, reference = PROFILES[profile], REFERENCE[profile]
    # Twice: the second decision over the same view uses what the first cached.
    for _ in range(2):
        assert outcome(fast, request, view) == outcome(reference, request, view)
