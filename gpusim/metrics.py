"""Prometheus metrics of an emulated worker, under vLLM's names or SGLang's.

Routers scrape real workers for these exact names (GIE's model-server protocol, llm-d's
``extractor/metrics``): vLLM ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` (a fraction in [0, 1] despite the name),
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (tokens),
``vllm:cache_config_info`` (labels ``block_size``, ``num_gpu_blocks``); SGLang
``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``,
``sglang:cache_config_info`` (``page_size``, ``num_pages``). Latency histograms use
vLLM V1's names and buckets (vllm/v1/metrics/loggers.py).

Gauges and counters are read from the engines when scraped (a custom collector), so
they are exact and cost nothing between scrapes. Latencies are in *engine time*: what a
real GPU of the profiled type would show, equal to wall time at ``--speedup 1``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from gpusim.engine import EngineStats, FinishedRequest, StepResult
from gtm.gpu_profiles import GpuProfile

# vLLM V1's histogram buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


class MetricsFlavor(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


@dataclass(frozen=True, slots=True)
class ModelSnapshot:
    """What the collector reads for one served model at scrape time."""

    model: str
    profile: GpuProfile
    stats: EngineStats
    generation_throughput: float  # output tokens/s, recent


@dataclass(frozen=True, slots=True)
class _Names:
    running: str
    waiting: str
    kv_usage: str
    ttft: str
    itl: str
    e2e: str
    queue: str
    prompt_tokens: str
    generation_tokens: str
    prefix: str  # metric-name prefix, with the colon


_VLLM = _Names(
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    e2e="vllm:e2e_request_latency_seconds",
    queue="vllm:request_queue_time_seconds",
    prompt_tokens="vllm:prompt_tokens",
    generation_tokens="vllm:generation_tokens",
    prefix="vllm:",
)
_SGLANG = _Names(
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    e2e="sglang:e2e_request_latency_seconds",
    queue="sglang:queue_time_seconds",
    prompt_tokens="sglang:prompt_tokens",
    generation_tokens="sglang:generation_tokens",
    prefix="sglang:",
)


class _EngineCollector(Collector):
    def __init__(
        self, names: _Names, flavor: MetricsFlavor, source: Callable[[], Iterable[ModelSnapshot]]
    ):
        self._names = names
        self._flavor = flavor
        self._source = source

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []  # values exist only at scrape time; do not call collect() at registration

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        n = self._names
        snapshots = list(self._source())
        running = GaugeMetricFamily(
            n.running, "Requests in the running batch.", labels=["model_name"]
        )
        waiting = GaugeMetricFamily(
            n.waiting, "Requests waiting to be scheduled.", labels=["model_name"]
        )
        usage = GaugeMetricFamily(
            n.kv_usage, "KV-cache usage (fraction of blocks in use).", labels=["model_name"]
        )
        prompt = CounterMetricFamily(
            n.prompt_tokens, "Prefilled prompt tokens.", labels=["model_name"]
        )
        generated = CounterMetricFamily(
            n.generation_tokens, "Generated tokens.", labels=["model_name"]
        )
        # Not vLLM's: the size of the emulator's own prefix-cache index (one entry per
        # cached block, bounded by the KV cache), so a soak sees it level off.
        cached = GaugeMetricFamily(
            "gtm_gpusim_prefix_cache_entries",
            "Blocks registered in the prefix cache (at most the KV cache's blocks).",
            labels=["model_name"],
        )
        for snap in snapshots:
            label = [snap.model]
            cached.add_metric(label, snap.stats.prefix_cache_blocks)
            running.add_metric(label, snap.stats.running)
            waiting.add_metric(label, snap.stats.waiting)
            usage.add_metric(label, snap.stats.kv_usage)
            prompt.add_metric(label, snap.stats.prompt_tokens_total)
            generated.add_metric(label, snap.stats.generation_tokens_total)
        yield from (running, waiting, usage, prompt, generated, cached)
        if self._flavor is MetricsFlavor.VLLM:
            yield from self._vllm_only(snapshots)
        else:
            yield from self._sglang_only(snapshots)

    def _vllm_only(
        self, snapshots: list[ModelSnapshot]
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        queries = CounterMetricFamily(
            "vllm:prefix_cache_queries", "Prefix-cache queries, in tokens.", labels=["model_name"]
        )
        hits = CounterMetricFamily(
            "vllm:prefix_cache_hits", "Prefix-cache hits, in tokens.", labels=["model_name"]
        )
        preemptions = CounterMetricFamily(
            "vllm:num_preemptions", "Preempted requests (recompute).", labels=["model_name"]
        )
        config = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the KV cache configuration.",
            labels=["model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching"],
        )
        for snap in snapshots:
            label = [snap.model]
            queries.add_metric(label, snap.stats.prefix_cache_queries)
            hits.add_metric(label, snap.stats.prefix_cache_hits)
            preemptions.add_metric(label, snap.stats.preemptions_total)
            config.add_metric(
                [
                    snap.model,
                    str(snap.profile.block_size),
                    str(snap.stats.kv_blocks_total),
                    str(snap.profile.prefix_caching),
                ],
                1.0,
            )
        yield from (queries, hits, preemptions, config)

    def _sglang_only(self, snapshots: list[ModelSnapshot]) -> Iterator[GaugeMetricFamily]:
        hit_rate = GaugeMetricFamily(
            "sglang:cache_hit_rate", "Prefix-cache hit rate.", labels=["model_name"]
        )
        throughput = GaugeMetricFamily(
            "sglang:gen_throughput", "Generation throughput (tokens/s).", labels=["model_name"]
        )
        config = GaugeMetricFamily(
            "sglang:cache_config_info",
            "Information of the KV cache configuration.",
            labels=["model_name", "page_size", "num_pages"],
        )
        # Prompt tokens the device's prefix cache spared (SGLang labels them by source);
        # with ``prompt_tokens_total`` the computed ones, which profile calibration reads.
        cached = CounterMetricFamily(
            "sglang:cached_tokens",
            "Number of cached prompt tokens by source.",
            labels=["model_name", "cache_source"],
        )
        for snap in snapshots:
            queried = snap.stats.prefix_cache_queries
            hit_rate.add_metric(
                [snap.model], snap.stats.prefix_cache_hits / queried if queried else 0.0
            )
            throughput.add_metric([snap.model], snap.generation_throughput)
            config.add_metric(
                [snap.model, str(snap.profile.block_size), str(snap.stats.kv_blocks_total)], 1.0
            )
            cached.add_metric([snap.model, "device"], snap.stats.prefix_cache_hits)
        yield from (hit_rate, throughput, config, cached)


class _BatchedHistogram(Collector):
    """A labelled histogram that takes a whole pass's observations at once.

    A busy pass produces hundreds of inter-token latencies; ``Histogram.observe`` per
    token (a lock and a bucket walk each) costs more than the rest of the delivery. This
    keeps plain bucket counts (single-threaded: the event loop owns them) and exposes them
    as an ordinary Prometheus histogram at scrape time.
    """

    def __init__(self, name: str, documentation: str, label: str, buckets: tuple[float, ...]):
        self._name = name
        self._documentation = documentation
        self._label = label
        self._bounds = buckets
        self._series: dict[str, tuple[list[int], list[float]]] = {}

    def observe_many(self, label_value: str, values: Iterable[float]) -> None:
        series = self._series.get(label_value)
        if series is None:
            series = self._series[label_value] = ([0] * (len(self._bounds) + 1), [0.0])
        counts, total = series
        bounds = self._bounds
        for value in values:
            counts[bisect_left(bounds, value)] += 1
            total[0] += value

    def describe(self) -> Iterable[HistogramMetricFamily]:
        return []

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=[self._label])
        for label_value, (counts, total) in self._series.items():
            cumulative, buckets = 0, []
            for bound, count in zip((*self._bounds, math.inf), counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if math.isinf(bound) else repr(bound), cumulative))
            family.add_metric([label_value], buckets, total[0])
        yield family


class EngineMetrics:
    """The worker's engine metrics in one registry, in the chosen flavor."""

    def __init__(
        self,
        registry: CollectorRegistry,
        flavor: MetricsFlavor,
        source: Callable[[], Iterable[ModelSnapshot]],
    ) -> None:
        self.flavor = flavor
        names = _VLLM if flavor is MetricsFlavor.VLLM else _SGLANG
        registry.register(_EngineCollector(names, flavor, source))
        self._ttft = Histogram(
            names.ttft, "Time to first token (engine time).", ["model_name"],
            buckets=TTFT_BUCKETS, registry=registry,
        )  # fmt: skip
        self._itl = _BatchedHistogram(
            names.itl, "Inter-token latency (engine time).", "model_name", ITL_BUCKETS
        )
        registry.register(self._itl)
        self._e2e = Histogram(
            names.e2e, "End-to-end request latency (engine time).", ["model_name"],
            buckets=REQUEST_LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self._queue = Histogram(
            names.queue, "Time spent waiting before first scheduled.", ["model_name"],
            buckets=REQUEST_LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self._prompt_len = Histogram(
            names.prefix + "request_prompt_tokens", "Prompt tokens per request.", ["model_name"],
            buckets=TOKEN_COUNT_BUCKETS, registry=registry,
        )  # fmt: skip
        self._output_len = Histogram(
            names.prefix + "request_generation_tokens", "Output tokens per request.",
            ["model_name"],
            buckets=TOKEN_COUNT_BUCKETS, registry=registry,
        )  # fmt: skip
        self._success = Counter(
            names.prefix + "request_success", "Finished requests by finish reason.",
            ["model_name", "finished_reason"], registry=registry,
        )  # fmt: skip
        # vLLM V1's per-request prefill histograms, observed as a request finishes (what
        # profile calibration reads): first scheduled → first token, and the prompt
        # tokens computed (less prefix-cache hits).
        self._prefill: tuple[Histogram, Histogram] | None = None
        if flavor is MetricsFlavor.VLLM:
            self._prefill = (
                Histogram(
                    "vllm:request_prefill_time_seconds", "Time in the PREFILL phase.",
                    ["model_name"], buckets=REQUEST_LATENCY_BUCKETS, registry=registry,
                ),
                Histogram(
                    "vllm:request_prefill_kv_computed_tokens",
                    "New KV tokens computed during prefill (excluding cached tokens).",
                    ["model_name"], buckets=TOKEN_COUNT_BUCKETS, registry=registry,
                ),
            )  # fmt: skip

    def observe_step(self, model: str, result: StepResult) -> None:
        if result.first_token_latencies:
            ttft = self._ttft.labels(model)
            for value in result.first_token_latencies:
                ttft.observe(value)
        if result.inter_token_latencies:
            self._itl.observe_many(model, result.inter_token_latencies)

    def observe_finished(self, model: str, finished: FinishedRequest, reason: str) -> None:
        """A request left the engine; ``reason`` is the API's (stop, length, abort)."""
        self._e2e.labels(model).observe(finished.e2e)
        if finished.queue_time is not None:
            self._queue.labels(model).observe(finished.queue_time)
        self._prompt_len.labels(model).observe(finished.prompt_tokens)
        self._output_len.labels(model).observe(finished.output_tokens)
        self._success.labels(model, reason).inc()
        if (
            self._prefill is not None
            and finished.scheduled_at is not None
            and finished.first_token_at is not None
        ):
            self._prefill[0].labels(model).observe(finished.first_token_at - finished.scheduled_at)
            self._prefill[1].labels(model).observe(finished.prompt_tokens - finished.cached_tokens)
