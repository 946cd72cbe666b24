"""Prometheus metrics of an emulated worker, under the names of the engine it emulates.

Routers scrape real workers for these exact names (GIE's model-server protocol, llm-d's
``extractor/metrics``): vLLM ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` (a fraction in [0, 1] despite the name),
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (tokens),
``vllm:cache_config_info`` (labels ``block_size``, ``num_gpu_blocks``); SGLang
``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``,
``sglang:cache_config_info`` (``page_size``, ``num_pages``). Latency histograms use
vLLM V1's names and buckets (vllm/v1/metrics/loggers.py).

The other flavours write what those engines write, from the same engine state: TGI's
``tgi_*`` (text-generation-inference docs/source/reference/metrics.md), TensorRT-LLM's
families behind Triton (``nv_trt_llm_*``, label-selected; NVIDIA/TensorRT-LLM
triton_backend/.../custom_metrics_reporter.cc), llama.cpp server's ``llamacpp:*`` (its
tools/server and, for the KV gauges, examples/server README) and a Dynamo frontend's
``dynamo_frontend_*`` with the workers' ``dynamo_component_kvstats_*``
(ai-dynamo/dynamo lib/runtime/src/metrics/prometheus_names.rs). ``zone_agent.engines``
holds the reading side, one module per engine, with the same citations. Engines whose
samples carry no model label (TGI, llama.cpp, Triton's ``model`` is its own model name)
serve one model: with several, their figures are summed.

Every flavour also writes ``gtm_gpusim_engine_state{model_name,figure}``, the engine's
own running, waiting, KV usage and geometry in the same collection as the engine's
names: what a reader of any flavour must recover (the contract tests compare the two).

Gauges and counters are read from the engines when scraped (a custom collector), so
they are exact and cost nothing between scrapes. Latencies are in *engine time*: what a
real GPU of the profiled type would show, equal to wall time at ``--speedup 1``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
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
    TGI = "tgi"
    TRTLLM = "trtllm"
    LLAMACPP = "llamacpp"
    DYNAMO = "dynamo"


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
        yield _engine_state(snapshots)
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

    def _sglang_only(
        self, snapshots: list[ModelSnapshot]
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
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

    def __init__(
        self, name: str, documentation: str, label: str | None, buckets: tuple[float, ...]
    ):
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
        labels = [] if self._label is None else [self._label]
        family = HistogramMetricFamily(self._name, self._documentation, labels=labels)
        for label_value, (counts, total) in self._series.items():
            cumulative, buckets = 0, []
            for bound, count in zip((*self._bounds, math.inf), counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if math.isinf(bound) else repr(bound), cumulative))
            family.add_metric([label_value] if labels else [], buckets, total[0])
        yield family


def _engine_state(snapshots: list[ModelSnapshot]) -> GaugeMetricFamily:
    """The engine's own figures, under gtm's name (see the module docstring)."""
    family = GaugeMetricFamily(
        "gtm_gpusim_engine_state",
        "The emulated engine's own load and KV geometry (what any flavour's names encode).",
        labels=["model_name", "figure"],
    )
    for snap in snapshots:
        stats = snap.stats
        for figure, value in (
            ("running", stats.running),
            ("waiting", stats.waiting),
            ("kv_usage", stats.kv_usage),
            ("kv_blocks_total", stats.kv_blocks_total),
            ("block_size", snap.profile.block_size),
        ):
            family.add_metric([snap.model, figure], value)
    return family


@dataclass(frozen=True, slots=True)
class _Totals:
    """A worker's load summed over its models, for engines without a model label."""

    running: int
    waiting: int
    used_blocks: int
    blocks: int
    used_tokens: int
    capacity_tokens: int

    @classmethod
    def of(cls, snapshots: list[ModelSnapshot]) -> _Totals:
        used = [s.stats.kv_blocks_total - s.stats.kv_blocks_free for s in snapshots]
        return cls(
            running=sum(s.stats.running for s in snapshots),
            waiting=sum(s.stats.waiting for s in snapshots),
            used_blocks=sum(used),
            blocks=sum(s.stats.kv_blocks_total for s in snapshots),
            used_tokens=sum(u * s.profile.block_size for u, s in zip(used, snapshots, strict=True)),
            capacity_tokens=sum(s.stats.kv_blocks_total * s.profile.block_size for s in snapshots),
        )

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.blocks if self.blocks else 0.0


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class _FlavorWriter(Collector):
    """An engine's names other than vLLM's and SGLang's: gauges at scrape time, and the
    histograms and counters that engine keeps, fed from the same observations."""

    def __init__(self, source: Callable[[], Iterable[ModelSnapshot]]) -> None:
        self._source = source

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[Metric]:
        snapshots = list(self._source())
        yield _engine_state(snapshots)
        yield from self._families(snapshots)

    def _families(self, snapshots: list[ModelSnapshot]) -> Iterator[Metric]:
        raise NotImplementedError

    def observe_step(self, model: str, result: StepResult) -> None:
        """A pass ended (its first tokens and inter-token gaps)."""

    def observe_finished(self, model: str, finished: FinishedRequest) -> None:
        """A request left the engine."""


#: TGI's duration buckets: 35 geometric steps from 0.00015 s by 1.5 (router/src/server.rs).
TGI_DURATION_BUCKETS = tuple(0.0001 * 1.5**k for k in range(1, 36))


class _TgiWriter(_FlavorWriter):
    """TGI v3 (no model label). KV: the tokens the batch holds over the KV capacity. A
    pass that prefills is a ``prefill`` call, one that only decodes a ``decode`` call."""

    def __init__(self, source: Callable[[], Iterable[ModelSnapshot]]) -> None:
        super().__init__(source)
        self._calls = _BatchedHistogram(
            "tgi_batch_inference_duration", "Batch inference duration", "method",
            TGI_DURATION_BUCKETS,
        )  # fmt: skip
        self._per_token = _BatchedHistogram(
            "tgi_request_mean_time_per_token_duration",
            "Mean time per token per request (inter-token latency)",
            None,
            TGI_DURATION_BUCKETS,
        )
        self._queue = _BatchedHistogram(
            "tgi_request_queue_duration", "Time spent in the queue per request", None,
            TGI_DURATION_BUCKETS,
        )  # fmt: skip
        self._input = _BatchedHistogram(
            "tgi_request_input_length", "Input token length per request", None,
            tuple(float(b) for b in TOKEN_COUNT_BUCKETS),
        )  # fmt: skip

    def _families(self, snapshots: list[ModelSnapshot]) -> Iterator[Metric]:
        totals = _Totals.of(snapshots)
        yield _gauge("tgi_batch_current_size", "Current batch size", totals.running)
        yield _gauge("tgi_queue_size", "Current queue size", totals.waiting)
        yield _gauge(
            "tgi_batch_current_max_tokens", "Maximum tokens for the current batch",
            totals.used_tokens,
        )  # fmt: skip
        yield _gauge(
            "tgi_batch_max_total_tokens", "Maximum amount of tokens in total.",
            totals.capacity_tokens,
        )  # fmt: skip
        for histogram in (self._calls, self._per_token, self._queue, self._input):
            yield from histogram.collect()

    def observe_step(self, model: str, result: StepResult) -> None:
        method = "prefill" if result.prefill_tokens else "decode"
        self._calls.observe_many(method, (result.duration,))

    def observe_finished(self, model: str, finished: FinishedRequest) -> None:
        # TGI: inference time (from the batch's start) over the tokens generated.
        if finished.scheduled_at is not None and finished.output_tokens > 0:
            inference = finished.finished_at - finished.scheduled_at
            self._per_token.observe_many("", (inference / finished.output_tokens,))
        if finished.queue_time is not None:
            self._queue.observe_many("", (finished.queue_time,))
        self._input.observe_many("", (float(finished.prompt_tokens),))


class _TrtLlmWriter(_FlavorWriter):
    """TensorRT-LLM's families in Triton, labelled ``model="tensorrt_llm"`` (Triton's
    model, not the served one) when the worker serves one model, else by model."""

    def _families(self, snapshots: list[ModelSnapshot]) -> Iterator[Metric]:
        requests = GaugeMetricFamily(
            "nv_trt_llm_request_metrics", "TRT LLM request metrics",
            labels=["model", "request_type", "version"],
        )  # fmt: skip
        kv = GaugeMetricFamily(
            "nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics",
            labels=["kv_cache_block_type", "model", "version"],
        )  # fmt: skip
        for snap in snapshots:
            model = "tensorrt_llm" if len(snapshots) == 1 else snap.model
            stats = snap.stats
            for kind, count in (
                ("waiting", stats.waiting),
                ("scheduled", stats.running),
                ("max", snap.profile.max_num_seqs),
                ("active", stats.running),
            ):
                requests.add_metric([model, kind, "1"], count)
            used = stats.kv_blocks_total - stats.kv_blocks_free
            for kind, value in (
                ("fraction", stats.kv_usage),
                ("tokens_per", snap.profile.block_size),
                ("used", used),
                ("free", stats.kv_blocks_free),
                ("max", stats.kv_blocks_total),
            ):
                kv.add_metric([kind, model, "1"], value)
        yield from (requests, kv)


class _LlamaCppWriter(_FlavorWriter):
    """llama.cpp's server with ``--metrics`` (no model label), including the KV gauges of
    the releases that export them. Generation time is the pass gaps between a
    sequence's tokens, summed over sequences, as llama.cpp sums it over slots."""

    def __init__(self, source: Callable[[], Iterable[ModelSnapshot]]) -> None:
        super().__init__(source)
        self._prompt_tokens = 0
        self._prompt_seconds = 0.0
        self._predicted_tokens = 0
        self._predicted_seconds = 0.0

    def _families(self, snapshots: list[ModelSnapshot]) -> Iterator[Metric]:
        totals = _Totals.of(snapshots)
        for name, documentation, value in (
            ("prompt_tokens", "Number of prompt tokens processed.", self._prompt_tokens),
            ("prompt_seconds", "Prompt process time", self._prompt_seconds),
            ("tokens_predicted", "Number of generation tokens processed.",
             self._predicted_tokens),
            ("tokens_predicted_seconds", "Predict process time", self._predicted_seconds),
        ):  # fmt: skip
            yield CounterMetricFamily("llamacpp:" + name, documentation, value=value)
        for name, documentation, value in (
            ("kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.",
             totals.kv_usage),
            ("kv_cache_tokens", "KV-cache tokens.", totals.used_tokens),
            ("requests_processing", "Number of requests processing.", totals.running),
            ("requests_deferred", "Number of requests deferred.", totals.waiting),
        ):  # fmt: skip
            yield _gauge("llamacpp:" + name, documentation, value)

    def observe_step(self, model: str, result: StepResult) -> None:
        gaps = result.inter_token_latencies
        if gaps:
            self._predicted_tokens += len(gaps)
            self._predicted_seconds += math.fsum(gaps)

    def observe_finished(self, model: str, finished: FinishedRequest) -> None:
        if finished.scheduled_at is not None and finished.first_token_at is not None:
            self._prompt_tokens += finished.prompt_tokens - finished.cached_tokens
            self._prompt_seconds += finished.first_token_at - finished.scheduled_at


class _DynamoWriter(_FlavorWriter):
    """A Dynamo frontend with its KV router: the frontend's families by ``model``, and the
    workers' ``kvstats`` (labelled ``model`` as Dynamo's backends label their metrics).
    Queued counts the requests not yet scheduled, so inflight minus queued is running."""

    def __init__(self, source: Callable[[], Iterable[ModelSnapshot]]) -> None:
        super().__init__(source)
        self._itl = _BatchedHistogram(
            "dynamo_frontend_inter_token_latency_seconds", "Inter-token latency in seconds",
            "model", ITL_BUCKETS,
        )  # fmt: skip
        self._ttft = _BatchedHistogram(
            "dynamo_frontend_time_to_first_token_seconds", "Time to first token in seconds",
            "model", TTFT_BUCKETS,
        )  # fmt: skip
        token_buckets = tuple(float(b) for b in TOKEN_COUNT_BUCKETS)
        self._input = _BatchedHistogram(
            "dynamo_frontend_input_sequence_tokens", "Input sequence length in tokens",
            "model", token_buckets,
        )  # fmt: skip
        self._cached = _BatchedHistogram(
            "dynamo_frontend_cached_tokens",
            "Number of cached tokens (prefix cache hits) per request", "model", token_buckets,
        )  # fmt: skip

    _FRONTEND = (
        ("inflight_requests", "Number of inflight requests"),
        ("queued_requests", "Number of requests in HTTP processing queue"),
        ("model_total_kv_blocks", "Total KV blocks available for a worker serving the model"),
        ("model_kv_cache_block_size", "KV cache block size for a worker serving the model"),
    )
    _KVSTATS = (
        ("active_blocks", "Number of active KV cache blocks currently in use"),
        ("total_blocks", "Total number of KV cache blocks available"),
        ("gpu_cache_usage_percent", "GPU cache usage as a percentage (0.0-1.0)"),
    )

    def _families(self, snapshots: list[ModelSnapshot]) -> Iterator[Metric]:
        values: dict[str, list[tuple[str, float]]] = {}
        for snap in snapshots:
            stats = snap.stats
            for name, value in (
                ("inflight_requests", stats.running + stats.waiting),
                ("queued_requests", stats.waiting),
                ("model_total_kv_blocks", stats.kv_blocks_total),
                ("model_kv_cache_block_size", snap.profile.block_size),
                ("active_blocks", stats.kv_blocks_total - stats.kv_blocks_free),
                ("total_blocks", stats.kv_blocks_total),
                ("gpu_cache_usage_percent", stats.kv_usage),
            ):
                values.setdefault(name, []).append((snap.model, float(value)))
        for name, documentation in self._FRONTEND:
            family = GaugeMetricFamily("dynamo_frontend_" + name, documentation, labels=["model"])
            for model, value in values.get(name, []):
                family.add_metric([model], value)
            yield family
        for name, documentation in self._KVSTATS:
            family = GaugeMetricFamily(
                "dynamo_component_kvstats_" + name, documentation,
                labels=["dynamo_component", "dynamo_namespace", "model"],
            )  # fmt: skip
            for model, value in values.get(name, []):
                family.add_metric(["backend", "dynamo", model], value)
            yield family
        for histogram in (self._itl, self._ttft, self._input, self._cached):
            yield from histogram.collect()

    def observe_step(self, model: str, result: StepResult) -> None:
        if result.inter_token_latencies:
            self._itl.observe_many(model, result.inter_token_latencies)
        if result.first_token_latencies:
            self._ttft.observe_many(model, result.first_token_latencies)

    def observe_finished(self, model: str, finished: FinishedRequest) -> None:
        self._input.observe_many(model, (float(finished.prompt_tokens),))
        self._cached.observe_many(model, (float(finished.cached_tokens),))


_WRITERS: Mapping[MetricsFlavor, type[_FlavorWriter]] = MappingProxyType(
    {
        MetricsFlavor.TGI: _TgiWriter,
        MetricsFlavor.TRTLLM: _TrtLlmWriter,
        MetricsFlavor.LLAMACPP: _LlamaCppWriter,
        MetricsFlavor.DYNAMO: _DynamoWriter,
    }
)


class EngineMetrics:
    """The worker's engine metrics in one registry, in the chosen flavor."""

    def __init__(
        self,
        registry: CollectorRegistry,
        flavor: MetricsFlavor,
        source: Callable[[], Iterable[ModelSnapshot]],
    ) -> None:
        self.flavor = flavor
        #: The writer of an engine other than vLLM and SGLang (their names share a shape).
        self._other: _FlavorWriter | None = None
        writer = _WRITERS.get(flavor)
        if writer is not None:
            self._other = writer(source)
            registry.register(self._other)
            return
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
        if self._other is not None:
            self._other.observe_step(model, result)
            return
        if result.first_token_latencies:
            ttft = self._ttft.labels(model)
            for value in result.first_token_latencies:
                ttft.observe(value)
        if result.inter_token_latencies:
            self._itl.observe_many(model, result.inter_token_latencies)

    def observe_finished(self, model: str, finished: FinishedRequest, reason: str) -> None:
        """A request left the engine; ``reason`` is the API's (stop, length, abort)."""
        if self._other is not None:
            self._other.observe_finished(model, finished)
            return
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
