"""Counters and histograms updated on the request path without a lock.

:class:`FastCounter` and :class:`FastHistogram` are prometheus_client's ``Counter`` and
``Histogram`` (same constructor, ``labels()``, registration, ``describe``/``collect`` and
therefore the same ``/metrics`` exposition, ``_created`` series included) whose children
keep their value in plain attributes: ``inc`` is one ``+=``, ``observe`` one ``bisect`` and
an index increment plus the sum; ``labels()`` of a child that exists is one dict lookup.
prometheus_client's own take a lock per value (a histogram observation: one for the sum,
one for the bucket) and check the metric is observable on every call, and ``labels()``
checks and converts every value under a lock; on a path that runs once per request those
calls cost as much as the work they count.

Why no lock is safe: these are for metrics updated only from one thread, the event loop's
(the zone agent serves requests and decides on its loop; no thread of its own touches
them). An ``+=`` on an attribute is a read, an add and a write; a second thread between
them would lose an update, the loop alone never does. A scrape from another thread
(none today) would read each value whole: a float attribute, a list copied in one call;
a histogram's buckets and sum may then be one observation apart, as prometheus_client's,
whose per-bucket locks do not make a histogram consistent either. Anything updated from
another thread keeps prometheus_client's locked ``Counter``/``Histogram`` (the global LB's
routing metrics: it also decides in its DNS UDP thread; see
:class:`gtm.routing.metrics.RoutingMetrics`).

Differences, none visible at scrape time: exemplars are refused (nobody here passes one);
bucket counts are kept as ints and summed as floats when collected; values live in the
process only, never in prometheus_client's multiprocess files (``PROMETHEUS_MULTIPROC_DIR``,
which gtm does not use: each process serves its own ``/metrics``).
"""

from __future__ import annotations

import contextlib
import time
from bisect import bisect_left
from collections.abc import Iterable
from typing import Any, NoReturn, Self

from prometheus_client import Counter, Histogram
from prometheus_client import metrics as _prometheus_metrics
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


def _created_series() -> bool:
    """Whether prometheus_client exports ``_created`` series (its switch, read at scrape)."""
    return bool(_prometheus_metrics._use_created)


class _CachedLabels(MetricWrapperBase):
    """``labels(*values)`` answered from a dict keyed by the values as given: no label
    checks, no ``str()`` of each value, no lock once a child exists. Safe from any thread
    (one dict read or write each; a race only asks prometheus_client twice, which returns
    its one child). Removing or clearing children empties the cache."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._by_values: dict[tuple[object, ...], Self] = {}
        super().__init__(*args, **kwargs)

    def labels(self, *labelvalues: object, **labelkwargs: object) -> Self:
        if not labelkwargs:
            try:
                return self._by_values[labelvalues]
            except (KeyError, TypeError):  # new, or a value that does not hash
                pass
        child = super().labels(*labelvalues, **labelkwargs)
        if not labelkwargs:
            with contextlib.suppress(TypeError):
                self._by_values[labelvalues] = child
        return child

    def remove(self, *labelvalues: Any) -> None:
        super().remove(*labelvalues)
        self._by_values = {}

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        super().remove_by_labels(labels)
        self._by_values = {}

    def clear(self) -> None:
        super().clear()
        self._by_values = {}


class FastCounter(_CachedLabels, Counter):
    """A :class:`prometheus_client.Counter` whose ``inc`` is one ``+=`` (loop thread only)."""

    _total: float

    def _metric_init(self) -> None:
        self._total = 0.0
        self._created = time.time()

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        if amount < 0 or exemplar:
            _refuse(self, amount, exemplar)
        try:
            self._total += amount
        except AttributeError:
            _refuse(self, amount, exemplar)

    def reset(self) -> None:
        self._total = 0.0
        self._created = time.time()

    def _child_samples(self) -> Iterable[Sample]:
        sample = Sample("_total", {}, self._total, None, None)
        if _created_series():
            return (sample, Sample("_created", {}, self._created, None, None))
        return (sample,)


class FastHistogram(_CachedLabels, Histogram):
    """A :class:`prometheus_client.Histogram` whose ``observe`` is a ``bisect`` and two
    ``+=`` (loop thread only). A value goes to the first bucket whose upper bound is at
    least the value (``le``), as prometheus_client's; a NaN to none, only to the sum."""

    _le: list[str]
    _counts: list[int]
    _sum_value: float

    def _metric_init(self) -> None:
        self._le = [floatToGoString(b) for b in self._upper_bounds]  # type: ignore[no-untyped-call]
        self._counts = [0] * len(self._upper_bounds)
        self._sum_value = 0.0
        self._created = time.time()

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if exemplar:
            _refuse(self, amount, exemplar)
        try:
            counts = self._counts
        except AttributeError:
            _refuse(self, amount, exemplar)
        if amount == amount:  # not NaN
            counts[bisect_left(self._upper_bounds, amount)] += 1
        self._sum_value += amount

    def _child_samples(self) -> Iterable[Sample]:
        counts = self._counts.copy()
        samples = []
        acc = 0.0
        for le, count in zip(self._le, counts, strict=True):
            acc += count
            samples.append(Sample("_bucket", {"le": le}, acc, None, None))
        samples.append(Sample("_count", {}, acc, None, None))
        if self._upper_bounds[0] >= 0:
            samples.append(Sample("_sum", {}, self._sum_value, None, None))
        if _created_series():
            samples.append(Sample("_created", {}, self._created, None, None))
        return tuple(samples)


def _refuse(
    metric: Counter | Histogram, amount: float, exemplar: dict[str, str] | None
) -> NoReturn:
    """Raise as prometheus_client would, or for an exemplar, which these do not keep."""
    if metric._labelnames and not metric._labelvalues:
        raise ValueError(f"{metric._type} metric is missing label values")
    if exemplar:
        raise ValueError(f"{metric._name}: exemplars are not kept by {type(metric).__name__}")
    raise ValueError("Counters can only be incremented by non-negative amounts.")
