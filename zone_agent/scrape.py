"""Reading a worker's load from its Prometheus ``/metrics``, whichever engine it runs.

The names are the engines' own, one plugin per engine in ``zone_agent.engines`` (vLLM,
SGLang, TGI, TensorRT-LLM behind Triton, llama.cpp's server, Dynamo workers; each module
cites where its names come from, and ARCHITECTURE §7 has the table). What the router
needs from each: running and waiting requests, the KV-cache usage fraction, the KV
geometry (block size, blocks) where exposed, prefix-cache hits and queries where exposed,
and an inter-token latency sum and count for throughput-regression detection. A figure
an engine does not expose is None in ``ModelMetrics``; the view treats it as unknown.

Parsing uses prometheus_client's own text parser, on only the lines of the families the
engines declare (a worker exposes hundreds of histogram lines we do not need). Every
result carries the monotonic time it was taken, so a reader knows its age.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gtm.clock import Clock
from zone_agent.engines import ENGINES, ConfigInfo, EngineNames, LabelledFamily, Row
from zone_agent.engines import Flavor as Flavor  # the flavours live with the engines
from zone_agent.errors import ScrapeError as ScrapeError  # raised here; re-exported

#: Largest /metrics body read (a vLLM worker with several LoRA adapters exposes ~200 kB).
MAX_METRICS_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    """One served model's load on one worker, as last scraped."""

    running: float = 0.0
    waiting: float = 0.0
    #: Fraction of KV-cache blocks in use, in [0, 1]; None: the engine does not say.
    kv_usage: float | None = 0.0
    block_size: int | None = None
    kv_blocks_total: int | None = None
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    itl_sum: float | None = None
    itl_count: float | None = None
    # Cumulative prefill figures that calibrate the worker's profile online
    # (zone_agent.calibration): per-request prefill time, or TTFT and queue time, and the
    # prompt tokens of the same requests with what the prefix cache spared.
    prefill_time_sum: float | None = None
    prefill_time_count: float | None = None
    ttft_sum: float | None = None
    ttft_count: float | None = None
    queue_time_sum: float | None = None
    prompt_tokens_sum: float | None = None
    computed_tokens_sum: float | None = None
    cached_tokens: float | None = None


@dataclass(frozen=True, slots=True)
class GpuMetrics:
    """Everything scraped from one worker at monotonic time ``scraped_at``."""

    scraped_at: float
    flavor: Flavor
    models: Mapping[str, ModelMetrics] = field(default_factory=lambda: MappingProxyType({}))

    def age(self, now: float) -> float:
        return max(0.0, now - self.scraped_at)


#: Every engine's names, flattened for the one-pass parse: sample name → (engine, field);
#: labelled family → (engine, its label and values); info gauge → (engine, its labels).
_SAMPLES: Mapping[str, tuple[EngineNames, str]] = MappingProxyType(
    {name: (engine, f) for engine in ENGINES for name, f in engine.samples.items()}
)
_LABELLED: Mapping[str, tuple[EngineNames, LabelledFamily]] = MappingProxyType(
    {name: (engine, fam) for engine in ENGINES for name, fam in engine.labelled.items()}
)
_CONFIG_INFO: Mapping[str, tuple[EngineNames, ConfigInfo]] = MappingProxyType(
    {name: (engine, info) for engine in ENGINES for name, info in engine.config_info.items()}
)
_PREFIXES = tuple(sorted(frozenset().union(*(engine.families() for engine in ENGINES))))
_FIELDS = frozenset(f.name for f in fields(ModelMetrics))
_RANK = {engine.flavor: rank for rank, engine in enumerate(ENGINES)}
_DERIVE = {engine.flavor: engine.derive for engine in ENGINES if engine.derive is not None}


def _relevant(text: str) -> str:
    """Only the sample and metadata lines of the families we read."""
    keep: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[2].startswith(_PREFIXES):
                keep.append(line)
        # Buckets first: most of an exposition's lines, dropped by one substring test
        # before they would be tried against every engine's prefixes.
        elif "_bucket" not in line and "_created" not in line and line.startswith(_PREFIXES):
            keep.append(line)
    keep.append("")
    return "\n".join(keep)


def _int_label(labels: Mapping[str, str], name: str) -> int | None:
    try:
        value = int(labels.get(name, ""))
    except ValueError:
        return None
    return value if value >= 0 else None


def parse_metrics(text: str, *, scraped_at: float, default_model: str = "") -> GpuMetrics:
    """Parse a /metrics body. Samples without a model label go to ``default_model``.

    Every engine's names are read in the one pass; the flavour is the engine whose names
    filled the most fields (ties: ``ENGINES`` order), and only its figures are kept — a
    Dynamo worker that also passes its backend's names through is read as one engine,
    never as a blend of two. No known name at all: ``Flavor.UNKNOWN`` and no models.
    A field the flavour does not expose is None (absent), never zero.

    Raises ScrapeError if the text is not Prometheus exposition format.
    """
    rows: dict[Flavor, dict[str, Row]] = {}
    try:
        for family in text_string_to_metric_families(_relevant(text)):
            for sample in family.samples:
                _read_sample(rows, sample.name, sample.labels, sample.value, default_model)
    except (ValueError, TypeError, IndexError) as exc:
        raise ScrapeError(f"not Prometheus text exposition format: {exc}") from None
    if not rows:
        return GpuMetrics(scraped_at, Flavor.UNKNOWN, MappingProxyType({}))
    flavor = min(rows, key=lambda f: (-sum(len(r) for r in rows[f].values()), _RANK[f]))
    models = {model: _model_metrics(flavor, model, row) for model, row in rows[flavor].items()}
    return GpuMetrics(scraped_at, flavor, MappingProxyType(models))


def _read_sample(
    rows: dict[Flavor, dict[str, Row]],
    name: str,
    labels: Mapping[str, str],
    value: float,
    default_model: str,
) -> None:
    found = _SAMPLES.get(name)
    if found is not None:
        engine, target = found
        _row(rows, engine, labels, default_model)[target] = float(value)
        return
    labelled = _LABELLED.get(name)
    if labelled is not None:
        engine, family = labelled
        target_or_none = family.values.get(labels.get(family.label, ""))
        if target_or_none is not None:
            _row(rows, engine, labels, default_model)[target_or_none] = float(value)
        return
    config = _CONFIG_INFO.get(name)
    if config is not None:
        engine, info = config
        row = _row(rows, engine, labels, default_model)
        row["block_size"] = _int_label(labels, info.block_size_label)
        row["kv_blocks_total"] = _int_label(labels, info.blocks_label)


def _row(
    rows: dict[Flavor, dict[str, Row]],
    engine: EngineNames,
    labels: Mapping[str, str],
    default_model: str,
) -> Row:
    label = engine.model_label
    model = labels.get(label, default_model) if label is not None else default_model
    return rows.setdefault(engine.flavor, {}).setdefault(model, {})


def _model_metrics(flavor: Flavor, model: str, row: Row) -> ModelMetrics:
    derive = _DERIVE.get(flavor)
    if derive is not None:
        derive(row)
    values = {k: v for k, v in row.items() if k in _FIELDS}
    values.setdefault("kv_usage", None)  # not exposed: unknown, not empty
    metrics = ModelMetrics(**values)  # type: ignore[arg-type]
    kv = metrics.kv_usage
    if (kv is not None and not 0.0 <= kv <= 1.0) or metrics.running < 0 or metrics.waiting < 0:
        raise ScrapeError(f"impossible values for model {model!r}: {metrics}")
    return metrics


async def scrape(
    session: aiohttp.ClientSession,
    url: str,
    *,
    clock: Clock,
    timeout_s: float,
    default_model: str = "",
) -> GpuMetrics:
    """GET ``{url}/metrics`` and parse it; any failure is a ScrapeError (never hangs)."""
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url.rstrip("/") + "/metrics") as response:
                if response.status != 200:
                    raise ScrapeError(f"/metrics answered HTTP {response.status}")
                body = await response.content.read(MAX_METRICS_BYTES + 1)
    except TimeoutError:
        raise ScrapeError(f"/metrics did not answer within {timeout_s} s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise ScrapeError(f"/metrics failed: {exc!r}") from None
    if len(body) > MAX_METRICS_BYTES:
        raise ScrapeError(f"/metrics is larger than {MAX_METRICS_BYTES} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ScrapeError("/metrics is not UTF-8") from None
    return parse_metrics(text, scraped_at=clock.monotonic(), default_model=default_model)
