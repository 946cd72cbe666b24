"""What a busy emulated worker's ``/metrics`` holds, without running a server: for the
zone agent's parser tests and the scrape benchmark (``bench/scrape_parse.py``), which
read exactly what ``gtm gpu-sim --metrics-flavor F`` serves.

The engine runs real passes on an H100 × Llama-3.1-8B profile (no warm-up), and every
pass and finished request is observed as the driver observes them, so histograms are
filled and some requests are still running when the text is taken."""

from __future__ import annotations

import dataclasses

from prometheus_client import generate_latest

from gpusim.engine import Engine, EngineConfig, EngineRequest
from gpusim.metrics import EngineMetrics, MetricsFlavor, ModelSnapshot
from gpusim.perfmodel import Degradation
from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.metrics import new_registry


def busy_exposition(
    flavor: MetricsFlavor, *, requests: int, finished: int, max_num_seqs: int
) -> str:
    """The exposition in ``flavor``'s names once ``finished`` of ``requests`` requests
    (request ``i``: ``200 + 37 i`` prompt tokens, ``20 + i mod 50`` output tokens) are
    done, at most ``max_num_seqs`` running at a time."""
    profile = dataclasses.replace(get_profile("H100", LLAMA_8B), max_num_seqs=max_num_seqs)
    engine = Engine(profile, EngineConfig(degradation=Degradation(warmup_passes=0)))
    registry = new_registry()
    metrics = EngineMetrics(
        registry,
        flavor,
        lambda: [ModelSnapshot(LLAMA_8B, profile, engine.stats(), 100.0)],
    )
    for index in range(requests):
        engine.add(EngineRequest(f"r{index}", 200 + 37 * index, 20 + index % 50), 0.0)
    now = 0.0
    while engine.stats().requests_finished_total < finished:
        result = engine.step(now)
        assert result is not None
        metrics.observe_step(LLAMA_8B, result)
        for done in result.finished:
            metrics.observe_finished(LLAMA_8B, done, "length")
        now += result.duration
    return generate_latest(registry).decode()
