"""The zone agent's Prometheus metrics (on an injected registry; names ``gtm_zone_*``).

Counters and histograms are updated on the request path (those updated on every request
are :mod:`gtm.fastmetrics`' lock-free ones, the same exposition); per-GPU gauges (in-flight
requests, pending tokens, scrape age, weight, availability) and the sizes of the
agent's prefix indexes, sketch and ledgers (``gtm_zone_*_entries``) are read from the
current view and the accounting when ``/metrics`` is scraped, so they cost nothing in
between.
Per-plugin decision latency is the routing framework's
``gtm_routing_plugin_duration_seconds{tier="zone"}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gtm.clock import Clock
from gtm.fastmetrics import FastCounter, FastHistogram
from gtm.metrics import ModelLabel
from gtm.models import Tier
from gtm.relay import StreamBreaks
from gtm.routing.metrics import RoutingMetrics
from zone_agent.accounting import Accounting
from zone_agent.view import ZoneView

#: Proxy overhead and first-byte latency buckets (s): sub-millisecond to minutes.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip


class _GpuGauges(Collector):
    def __init__(self, view: Callable[[], ZoneView], clock: Clock) -> None:
        self._view = view
        self._clock = clock

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # One family made per step: ``gtm.metrics.exposition`` lets the loop turn
        # between them (a thousand GPUs' families, made at once, took ~15 ms).
        view = self._view()
        acc = view.accounting
        now = self._clock.monotonic()
        gpus = view.gpus
        loads = [acc.at(gpu.id) for gpu in gpus]
        yield _family(
            "gtm_zone_in_flight",
            "Sequences in flight from this agent.",
            ((gpu.id, load.streams) for gpu, load in zip(gpus, loads, strict=True)),
        )
        yield _family(
            "gtm_zone_pending_prefill_tokens",
            "Uncached prompt tokens sent and not yet prefilled.",
            ((gpu.id, load.pending) for gpu, load in zip(gpus, loads, strict=True)),
        )
        yield _family(
            "gtm_zone_scrape_age_seconds",
            "Age of the last successful /metrics scrape (staleness).",
            ((gpu.id, gpu.metrics.age(now)) for gpu in gpus if gpu.metrics is not None),
        )
        yield _family(
            "gtm_zone_gpu_weight",
            "Health weight (slow start × throughput).",
            ((gpu.id, gpu.health.weight) for gpu in gpus),
        )
        yield _family(
            "gtm_zone_gpu_slowdown",
            "Measured decode slowness vs the zone's median or the GPU's own best (1 = normal).",
            ((gpu.id, gpu.health.slowdown) for gpu in gpus),
        )
        yield _family(
            "gtm_zone_gpu_available",
            "1 if the GPU may take requests now.",
            ((gpu.id, 1.0 if gpu.unavailable_reason() is None else 0.0) for gpu in gpus),
        )
        yield from _profiles(view)
        yield from _sizes(acc)


def _family(
    name: str, documentation: str, values: Iterable[tuple[str, float]]
) -> GaugeMetricFamily:
    """A gauge family labelled by ``gpu``."""
    family = GaugeMetricFamily(name, documentation, labels=["gpu"])
    for gpu_id, value in values:
        family.add_metric([gpu_id], value)
    return family


def _profiles(view: ZoneView) -> Iterator[GaugeMetricFamily]:
    """Where each GPU's profile comes from, and the prefill rate it is priced at."""
    source = GaugeMetricFamily(
        "gtm_zone_profile_source",
        "1 for where the GPU's performance profile for the model comes from: shipped, "
        "file (--gpu-profiles), calibrated (its own metrics) or prior (unknown pair, "
        "conservative until calibrated).",
        labels=["gpu", "model", "source"],
    )
    rate = GaugeMetricFamily(
        "gtm_zone_profile_prefill_tokens_per_second",
        "Prefill rate the GPU is priced at for the model (its profile's, before health).",
        labels=["gpu", "model"],
    )
    for model, index in view.by_model.items():
        for gpu_id, src, profile in zip(index.ids, index.sources, index.profiles, strict=True):
            source.add_metric([gpu_id, model, src.value], 1.0)
            rate.add_metric([gpu_id, model], profile.prefill_tokens_per_s)
    yield from (source, rate)


def _sizes(acc: Accounting) -> Iterator[GaugeMetricFamily]:
    """How many entries the agent's long-lived structures hold: each is bounded (the
    prefix indexes by their GPUs' KV caches, the sketch by its counters, the ledgers by
    the requests in flight), so in a steady load these level off."""
    index = GaugeMetricFamily(
        "gtm_zone_prefix_index_entries",
        "Prefix blocks in the agent's indexes: sent to a GPU, answered by one "
        "(each GPU's share bounded by its KV cache).",
        labels=["index"],
    )
    index.add_metric(["sent"], len(acc.prefix))
    index.add_metric(["answered"], len(acc.answered))
    hot = GaugeMetricFamily(
        "gtm_zone_hot_blocks_entries", "Counters of the hot-prefix sketch (bounded)."
    )
    hot.add_metric([], len(acc.hot))
    ledger = GaugeMetricFamily(
        "gtm_zone_ledger_entries",
        "Requests the accounting holds: open tickets, and assignments held until they expire.",
        labels=["ledger"],
    )
    ledger.add_metric(["open"], acc.open_tickets)
    ledger.add_metric(["held"], acc.held_tickets)
    yield from (index, hot, ledger)


class ZoneMetrics:
    """Every collector of one zone agent."""

    def __init__(
        self, registry: CollectorRegistry, view: Callable[[], ZoneView], clock: Clock
    ) -> None:
        # The agent decides on its event loop only (no thread of its own decides).
        self.routing = RoutingMetrics(registry, loop_only=True)
        # Updated on every request, from the loop only: gtm.fastmetrics (no lock).
        self.requests = FastCounter(
            "gtm_zone_requests",
            "Requests answered by the zone agent, by endpoint and HTTP status.",
            ["endpoint", "status"],
            registry=registry,
        )
        self.assignments = FastCounter(
            "gtm_zone_assignments",
            "Requests assigned to each GPU (proxied or via /v1/assign).",
            ["gpu", "profile"],
            registry=registry,
        )
        self.retries = Counter(
            "gtm_zone_retries",
            "Attempts retried on another GPU before the first byte, by reason.",
            ["reason"],
            registry=registry,
        )
        self.ejections = Counter(
            "gtm_zone_ejections",
            "GPUs ejected by passive outlier detection.",
            ["gpu"],
            registry=registry,
        )
        self.upstream_failures = Counter(
            "gtm_zone_upstream_failures",
            "Proxied requests that failed at a worker, by outcome.",
            ["gpu", "outcome"],
            registry=registry,
        )
        #: Streams from a GPU worker that broke after the first byte, by cause.
        self.stream_breaks = StreamBreaks(registry, Tier.ZONE)
        self.scrape_failures = Counter(
            "gtm_zone_scrape_failures",
            "Failed /metrics scrapes.",
            ["gpu"],
            registry=registry,
        )
        #: Flow control's early scrape rounds (zone_agent.flow: held requests waiting on
        #: other clients' queued work seen in the last scrape).
        #: Scrape rounds (every worker), by how each ended: every worker answered, or
        #: the interval ran out with a scrape still going (a slow or silent worker,
        #: whose scrape goes on alone: zone_agent.app).
        self.scrape_rounds = Counter(
            "gtm_zone_scrape_rounds",
            "Scrape rounds of every worker, by how each ended: ended=answered (every "
            "worker answered), ended=interval (--scrape-interval ran out with a worker's "
            "scrape still going; the view was rebuilt without waiting for it).",
            ["ended"],
            registry=registry,
        )
        for ended in ("answered", "interval"):
            self.scrape_rounds.labels(ended)  # shown at 0 before the first such round
        #: Views swapped in while a GPU's last scrape was missing or distrusted (older
        #: than ZoneConfig.stale_after_s): the agent priced that GPU from its own
        #: charges alone, blind to other clients' load on it (zone_agent.view).
        self.blind_views = Counter(
            "gtm_zone_blind_views",
            "Views of the zone built while the GPU's last /metrics scrape was missing or "
            "too old to trust (its load then known from the agent's own requests alone).",
            ["gpu"],
            registry=registry,
        )
        self.scrapes_early = Counter(
            "gtm_zone_scrapes_early",
            "Scrapes run before --scrape-interval was up, of the workers where flow control "
            "held requests on other clients' queued work (--admission-rescrape).",
            registry=registry,
        )
        #: Scrapes the fast reader stepped aside from (zone_agent.exposition): read by
        #: prometheus_client's parser instead, the same figures at the old cost.
        self.scrape_reference_parses = Counter(
            "gtm_zone_scrape_reference_parses",
            "Successful /metrics scrapes read by the reference parser (the fast reader "
            "stepped aside: a line of unusual shape).",
            ["gpu"],
            registry=registry,
        )
        self.first_byte = FastHistogram(
            "gtm_zone_first_byte_seconds",
            "Time from receiving a request to its first response byte from the worker, by "
            "model (bounded: gtm.metrics.ModelLabel).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._model_label = ModelLabel()
        #: Each model's first-byte ``observe`` (:meth:`observe_first_byte` fills it; a
        #: caller may look a model up here first and save that call). Per-request lookups
        #: cached: a labelled child costs a lock and a tuple per ``.labels()`` call.
        #: Bounded by the models asked for.
        self.first_byte_of: dict[str, Callable[[float], None]] = {}
        self.decision = FastHistogram(
            "gtm_zone_request_overhead_seconds",
            "Agent time before a request is sent upstream (parse, count, decide).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.view_build = FastHistogram(
            "gtm_zone_view_build_seconds",
            "Time the agent's loop is held rebuilding its view of the zone (after each "
            "scrape round and each health or inventory change); it grows with the zone.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        registry.register(_GpuGauges(view, clock))

    def observe_first_byte(self, model: str, seconds: float) -> None:
        """One request's first-byte latency, under its (bounded) model label."""
        observe = self.first_byte_of.get(model)
        if observe is None:
            label = self._model_label(model)
            observe = self.first_byte_of[model] = self.first_byte.labels(label).observe
        observe(seconds)
