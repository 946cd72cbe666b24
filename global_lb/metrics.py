"""The global tier's Prometheus metrics, on an injected registry (never the global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gtm.metrics import DECISION_LATENCY_BUCKETS, ModelLabel
from gtm.models import Tier
from gtm.relay import StreamBreaks

#: Client-facing latencies (first byte, whole request), s: milliseconds to minutes.
REQUEST_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


class GlobalMetrics:
    """Every metric of the global tier (one instance per registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "gtm_global_decisions_total",
            "Region decisions, by channel (http, route, dns) and outcome (region id or refusal).",
            ["channel", "outcome"],
            registry=registry,
        )
        self.decision_seconds = Histogram(
            "gtm_global_decision_duration_seconds",
            "Time to choose a region (residency verdict + profile, or a cache hit).",
            ["channel", "cached"],
            buckets=DECISION_LATENCY_BUCKETS,
            registry=registry,
        )
        self.refusals = Counter(
            "gtm_global_refusals_total",
            "Requests and DNS answers refused, by channel and reason.",
            ["channel", "reason"],
            registry=registry,
        )
        self.dns_responses = Counter(
            "gtm_global_dns_responses_total",
            "DNS responses, by name kind (api, jurisdiction, region, apex, ns, other), "
            "answered region ('' if none) and rcode.",
            ["kind", "region", "rcode"],
            registry=registry,
        )
        self.dns_dropped = Counter(
            "gtm_global_dns_dropped_total",
            "DNS packets not answered: malformed beyond a header, responses, rate-limited.",
            ["reason"],
            registry=registry,
        )
        self.dns_truncated = Counter(
            "gtm_global_dns_truncated_total",
            "UDP responses sent truncated (TC=1) because they did not fit, or RRL slips.",
            ["reason"],
            registry=registry,
        )
        self.ecs_scope = Counter(
            "gtm_global_dns_ecs_scope_total",
            "Answers to queries carrying EDNS Client Subnet, by family and the SCOPE "
            "PREFIX-LENGTH answered (0: valid for every client).",
            ["family", "scope"],
            registry=registry,
        )
        self.dns_rebuilds = Counter(
            "gtm_global_dns_answer_rebuilds_total",
            "Times the precomputed DNS answers were dropped for a new view revision.",
            registry=registry,
        )
        self.geoip_reloads = Counter(
            "gtm_global_geoip_reloads_total",
            "Changes of the --geoip-db file seen, by outcome: reloaded (the new database "
            "serves) or failed (it did not open; the previous one keeps serving). Each "
            "process follows the file: with --dns-workers N a change counts N times.",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("reloaded", "failed"):
            self.geoip_reloads.labels(outcome)
        self.region_healthy = Gauge(
            "gtm_global_region_healthy",
            "1 if the region is available for new traffic (healthy, not drained), else 0.",
            ["region"],
            registry=registry,
        )
        self.health_changes = Counter(
            "gtm_global_region_health_changes_total",
            "Region health transitions seen by the active checks, by new state.",
            ["region", "state"],
            registry=registry,
        )
        self.health_fail_open = Gauge(
            "gtm_global_health_fail_open",
            "1 while every active check fails at once and all regions are treated as up.",
            registry=registry,
        )
        self.forward_attempts = Counter(
            "gtm_global_forward_attempts_total",
            "Front-door forwards to a regional LB, by region and result.",
            ["region", "result"],
            registry=registry,
        )
        #: Streams to a regional LB that broke after the first byte, by cause.
        self.stream_breaks = StreamBreaks(registry, Tier.GLOBAL)
        self.retries = Counter(
            "gtm_global_retries_total",
            "Front-door retries on another allowed region, by the region that failed.",
            ["from_region", "to_region"],
            registry=registry,
        )
        self.first_byte = Histogram(
            "gtm_global_first_byte_seconds",
            "Front door: from a request's arrival to its first response byte, s, by the "
            "region that served it and model (bounded: gtm.metrics.ModelLabel).",
            ["region", "model"],
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self.request_seconds = Histogram(
            "gtm_global_request_duration_seconds",
            "Front door end to end: from a request's arrival to the end of its relayed "
            "response (a stream's last byte), s, by the region that served it and model.",
            ["region", "model"],
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "gtm_global_tokens",
            "Tokens of the requests the front door relayed, by the region that served them, "
            "model and kind (prompt, completion): the response's usage when it reports one, "
            "else the estimates (prompt: the front door's count; completion: one per "
            "streamed content chunk).",
            ["region", "model", "kind"],
            registry=registry,
        )
        #: The ``model`` label of the request metrics above (bounded).
        self.model_label = ModelLabel()
        self.view_revision = Gauge(
            "gtm_global_view_snapshot_revision",
            "Fleet snapshot revision of the view region choice reads.",
            registry=registry,
        )
