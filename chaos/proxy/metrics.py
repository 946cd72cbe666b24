"""Prometheus metrics of the fault proxy, on an injected registry.

``gtm_chaos_proxy_*`` series are updated live. The two ``toxiproxy_proxy_*`` counters
reproduce Toxiproxy's ``-proxy-metrics`` (METRICS.md) — same names and labels
``{direction, proxy, listener, upstream}``, added once when each link ends, as the
reference does — so dashboards built for Toxiproxy keep working.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge

from chaos.proxy.models import Direction


class ProxyMetrics:
    """All series of one fault-proxy server."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connections = Counter(
            "gtm_chaos_proxy_connections_total",
            "Client connections accepted by a proxy (dial failures included).",
            ["proxy"],
            registry=registry,
        )
        self.upstream_failures = Counter(
            "gtm_chaos_proxy_upstream_dial_failures_total",
            "Client connections closed at once because the upstream could not be dialed.",
            ["proxy"],
            registry=registry,
        )
        self.active_connections = Gauge(
            "gtm_chaos_proxy_active_connections",
            "Proxied connections currently open.",
            ["proxy"],
            registry=registry,
        )
        self.received = Counter(
            "gtm_chaos_proxy_received_bytes_total",
            "Bytes read by a proxy, by direction (upstream = from clients).",
            ["proxy", "direction"],
            registry=registry,
        )
        self.sent = Counter(
            "gtm_chaos_proxy_sent_bytes_total",
            "Bytes written by a proxy after toxics, by direction.",
            ["proxy", "direction"],
            registry=registry,
        )
        self.active_toxics = Gauge(
            "gtm_chaos_proxy_active_toxics",
            "Toxics configured on a proxy, by direction.",
            ["proxy", "direction"],
            registry=registry,
        )
        labels = ["direction", "proxy", "listener", "upstream"]
        self.compat_received = Counter(
            "toxiproxy_proxy_received_bytes_total",
            "Toxiproxy-compatible: bytes received on a link, added when the link ends.",
            labels,
            registry=registry,
        )
        self.compat_sent = Counter(
            "toxiproxy_proxy_sent_bytes_total",
            "Toxiproxy-compatible: bytes sent on a link, added when the link ends.",
            labels,
            registry=registry,
        )

    def forget_proxy(self, proxy: str) -> None:
        """Drop the gauges of a deleted proxy (counters keep their history)."""
        for direction in Direction:
            self._remove(self.active_toxics, proxy, direction.value)
        self._remove(self.active_connections, proxy)

    @staticmethod
    def _remove(gauge: Gauge, *labels: str) -> None:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)


class ConnectionMeter:
    """A :class:`~chaos.proxy.link.LinkMeter` for the links of one proxy.

    The labelled children are looked up once per connection, not once per chunk.
    """

    def __init__(self, metrics: ProxyMetrics, proxy: str, listener: str, upstream: str) -> None:
        self._received = {d: metrics.received.labels(proxy, d.value) for d in Direction}
        self._sent = {d: metrics.sent.labels(proxy, d.value) for d in Direction}
        self._compat_received = {
            d: metrics.compat_received.labels(d.value, proxy, listener, upstream) for d in Direction
        }
        self._compat_sent = {
            d: metrics.compat_sent.labels(d.value, proxy, listener, upstream) for d in Direction
        }

    def received(self, direction: Direction, size: int) -> None:
        self._received[direction].inc(size)

    def sent(self, direction: Direction, size: int) -> None:
        self._sent[direction].inc(size)

    def finished(self, direction: Direction, received: int, sent: int) -> None:
        self._compat_received[direction].inc(received)
        self._compat_sent[direction].inc(sent)
