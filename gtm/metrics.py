"""Prometheus helpers. Library code never touches the global default registry.

Every component takes a :class:`prometheus_client.CollectorRegistry` in its
constructor; :func:`new_registry` makes one for a process or a test. Metric names are
prefixed ``gtm_``.

Runtime collectors
    :func:`register_runtime` adds what every served ``/metrics`` carries besides the
    component's own metrics (``gtm.serve.add_service_routes`` calls it): the process
    (``process_*``: CPU, resident memory, open file descriptors, start time), the Python
    platform (``python_info``) and the garbage collector (``python_gc_*``) collectors of
    prometheus_client, and ``gtm_build_info{version,commit,python}`` = 1, which a
    dashboard joins on and an alert compares across the fleet (version skew). They stay
    out of :func:`new_registry`, so a test's registry holds only what it asserts.

Serving ``/metrics``
    :func:`exposition` is :func:`prometheus_client.generate_latest` a slice at a time:
    a zone agent of a thousand GPUs exposes ~8,000 series, whose collection and
    formatting held its event loop for ~45 ms in one go on every Prometheus scrape.

Model labels
    A ``model`` label is bounded (:class:`ModelLabel`). Its values are models the fleet
    serves: the tiers observe a labelled metric only for a request that was relayed and
    answered (a zone picks only a GPU that has the model loaded; a model no allowed
    region serves is refused before it is relayed), and at most
    :data:`MODEL_LABEL_LIMIT` distinct values per metric set are kept; past the limit,
    or where a caller knows the model is not served (``known=False``), the value is
    :data:`OTHER_MODEL`. A client's made-up model names never become series.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import time
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from gtm._version import __version__

# Latency buckets for in-process decisions, in seconds: routing plugins run in
# microseconds, so the default Prometheus buckets (5 ms .. 10 s) would put everything
# in the first bucket.
DECISION_LATENCY_BUCKETS: tuple[float, ...] = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1,
)  # fmt: skip

#: The ``model`` label of a model the view does not know, or past the limit.
OTHER_MODEL = "other"
#: Distinct ``model`` label values one metric set takes before folding into "other": a
#: fleet serves a handful of models; each value multiplies a histogram's series.
MODEL_LABEL_LIMIT = 32

#: Where a build's commit is given (a container build or a package sets it).
COMMIT_ENV = "GTM_BUILD_COMMIT"
BUILD_INFO = "gtm_build_info"


#: Loop time a slice of :func:`exposition` takes before the loop turns (a family is
#: never cut: a thousand samples take ~3 ms to format).
EXPOSITION_SLICE_S = 0.001


class _Families:
    """Families already collected, in the shape ``generate_latest`` reads a registry."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


async def exposition(registry: CollectorRegistry) -> bytes:
    """``generate_latest(registry)``, byte for byte (each family goes through it), with
    the event loop turning about every :data:`EXPOSITION_SLICE_S` between families.
    Families are collected one at a time, so a collector that yields its families as
    it makes them is sliced too (``zone_agent.metrics``)."""
    parts: list[bytes] = []
    started = time.perf_counter()
    for family in registry.collect():
        parts.append(generate_latest(_Families((family,))))
        if time.perf_counter() - started >= EXPOSITION_SLICE_S:
            await asyncio.sleep(0)
            started = time.perf_counter()
    return b"".join(parts)


def new_registry() -> CollectorRegistry:
    """A fresh registry without the process/platform collectors (tests assert exact samples)."""
    return CollectorRegistry(auto_describe=True)


def register_runtime(registry: CollectorRegistry) -> None:
    """Add the process, platform and GC collectors and ``gtm_build_info`` to ``registry``
    (once: a second call for the same registry adds nothing)."""
    makers = (
        lambda: ProcessCollector(registry=registry),
        lambda: PlatformCollector(registry=registry),
        lambda: GCCollector(registry=registry),
        lambda: _build_info(registry),
    )
    for make in makers:
        with contextlib.suppress(ValueError):  # already registered on this registry
            make()


def _build_info(registry: CollectorRegistry) -> None:
    gauge = Gauge(
        BUILD_INFO,
        "Always 1: the running build's version, source commit and Python version.",
        ["version", "commit", "python"],
        registry=registry,
    )
    gauge.labels(__version__, build_commit(), platform.python_version()).set(1)


def build_commit(env: dict[str, str] | None = None, root: Path | None = None) -> str:
    """The build's commit: ``GTM_BUILD_COMMIT``, else the checkout's ``HEAD`` when gtm
    runs from a git checkout (read from ``.git`` without running git), else
    ``"unknown"``."""
    given = (os.environ if env is None else env).get(COMMIT_ENV, "").strip()
    if given:
        return given
    git = (Path(__file__).resolve().parent.parent if root is None else root) / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:40] or "unknown"
        ref = head.removeprefix("ref: ")
        loose = git / ref
        if loose.is_file():
            return loose.read_text().strip()[:40]
        for line in (git / "packed-refs").read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha[:40]
    except OSError:
        pass
    return "unknown"


class ModelLabel:
    """The bounded ``model`` label value of one metric set (see the module docstring)."""

    __slots__ = ("_limit", "_seen")

    def __init__(self, limit: int = MODEL_LABEL_LIMIT) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, model: str, *, known: bool = True) -> str:
        """``model`` if ``known`` (the tier's view serves it) and within the limit, else
        :data:`OTHER_MODEL`."""
        if not known:
            return OTHER_MODEL
        seen = self._seen
        if model in seen:
            return model
        if len(seen) >= self._limit:
            return OTHER_MODEL
        seen.add(model)
        return model


__all__ = [
    "BUILD_INFO",
    "COMMIT_ENV",
    "DECISION_LATENCY_BUCKETS",
    "MODEL_LABEL_LIMIT",
    "OTHER_MODEL",
    "ModelLabel",
    "build_commit",
    "new_registry",
    "register_runtime",
]
