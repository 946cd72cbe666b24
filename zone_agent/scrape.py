"""Reading a worker's load from its Prometheus ``/metrics``, whichever engine it runs.

The names are the engines' own, one plugin per engine in ``zone_agent.engines`` (vLLM,
SGLang, TGI, TensorRT-LLM behind Triton, llama.cpp's server, Dynamo workers; each module
cites where its names come from, and ARCHITECTURE §7 has the table). What the router
needs from each: running and waiting requests, the KV-cache usage fraction, the KV
geometry (block size, blocks) where exposed, prefix-cache hits and queries where exposed,
and an inter-token latency sum and count for throughput-regression detection. A figure
an engine does not expose is None in ``ModelMetrics``; the view treats it as unknown.

Only the lines of the families the engines declare are read (a worker exposes hundreds of
histogram lines we do not need), by ``zone_agent.exposition.SampleReader``: one compiled
expression per line, labels split out only where a table needs one. Where it steps aside
(a line of unusual but legal shape, or garbage) prometheus_client's own text parser reads
the same lines, as it did before the reader: the same figures or the same ScrapeError,
and the result says which parser read it (``GpuMetrics.parsed_by``). Every result
carries the monotonic time it was taken, so a reader knows its age.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from types import MappingProxyType

from prometheus_client.parser import text_string_to_metric_families

from gtm.clock import Clock
from gtm.tasks import Turns
from zone_agent.engines import ENGINES, ConfigInfo, EngineNames, LabelledFamily, Row
from zone_agent.engines import Flavor as Flavor  # the flavours live with the engines
from zone_agent.errors import ScrapeError as ScrapeError  # raised here; re-exported
from zone_agent.errors import UpstreamError
from zone_agent.exposition import Sample, SampleReader, relevant
from zone_agent.upstream import UpstreamPool

log = logging.getLogger(__name__)

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


class Parser(StrEnum):
    """Which parser read a worker's exposition (``zone_agent.exposition`` has both)."""

    #: ``SampleReader``: the usual path.
    READER = "reader"
    #: prometheus_client's text parser: the reader stepped aside (``GpuMetrics.aside``).
    REFERENCE = "reference"


@dataclass(frozen=True, slots=True)
class GpuMetrics:
    """Everything scraped from one worker at monotonic time ``scraped_at``."""

    scraped_at: float
    flavor: Flavor
    models: Mapping[str, ModelMetrics] = field(default_factory=lambda: MappingProxyType({}))
    parsed_by: Parser = Parser.READER
    #: Why the reader stepped aside (the line and the reason); empty when it did not.
    aside: str = ""

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


#: Every sample name read → whether its labels are read (a model label, a labelled
#: family's label, an info gauge's geometry): the reader splits no other label block.
_WANTED: Mapping[str, bool] = MappingProxyType(
    {
        **{name: engine.model_label is not None for name, (engine, _) in _SAMPLES.items()},
        **{name: True for name in (*_LABELLED, *_CONFIG_INFO)},
    }
)
_READER = SampleReader(_PREFIXES, _WANTED)


def _relevant(text: str) -> str:
    """Only the sample and metadata lines of the families we read (the reference's input)."""
    return relevant(text, _PREFIXES)


def _int_label(labels: Mapping[str, str], name: str) -> int | None:
    try:
        value = int(labels.get(name, ""))
    except ValueError:
        return None
    return value if value >= 0 else None


def parse_metrics(
    text: str, *, scraped_at: float, default_model: str = "", parser: Parser = Parser.READER
) -> GpuMetrics:
    """Parse a /metrics body. Samples without a model label go to ``default_model``.

    Every engine's names are read in the one pass; the flavour is the engine whose names
    filled the most fields (ties: ``ENGINES`` order), and only its figures are kept — a
    Dynamo worker that also passes its backend's names through is read as one engine,
    never as a blend of two. No known name at all: ``Flavor.UNKNOWN`` and no models.
    A field the flavour does not expose is None (absent), never zero.

    ``parser=Parser.REFERENCE`` reads with prometheus_client's parser alone (tests and
    the benchmark compare the two). Raises ScrapeError if the text is not Prometheus
    exposition format.
    """
    read = _READER.read(text) if parser is Parser.READER else None
    if isinstance(read, list):
        samples, parsed_by, aside = read, Parser.READER, ""
    else:  # the reader stepped aside, or was not asked
        aside = "" if read is None else f"{read.reason}: {read.line[:200]!r}"
        samples, parsed_by = reference_samples(text), Parser.REFERENCE
    rows: dict[Flavor, dict[str, Row]] = {}
    for name, labels, value in samples:
        _read_sample(rows, name, labels, value, default_model)
    if not rows:
        return GpuMetrics(scraped_at, Flavor.UNKNOWN, MappingProxyType({}), parsed_by, aside)
    flavor = min(rows, key=lambda f: (-sum(len(r) for r in rows[f].values()), _RANK[f]))
    try:
        models = {m: _model_metrics(flavor, m, row) for m, row in rows[flavor].items()}
    except (ValueError, OverflowError) as exc:  # an engine's derive step, on NaN or infinity
        raise ScrapeError(f"impossible values: {exc}") from None
    return GpuMetrics(scraped_at, flavor, MappingProxyType(models), parsed_by, aside)


def reference_samples(text: str) -> list[Sample]:
    """The samples of the families read, by prometheus_client's parser (the reference
    form of ``SampleReader.read``; raises ScrapeError where it rejects the text)."""
    try:
        return [
            (sample.name, sample.labels, float(sample.value))
            for family in text_string_to_metric_families(_relevant(text))
            for sample in family.samples
            if sample.name in _WANTED
        ]
    except (ValueError, TypeError, IndexError, OverflowError) as exc:
        raise ScrapeError(f"not Prometheus text exposition format: {exc}") from None


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
    pool: UpstreamPool,
    url: str,
    *,
    clock: Clock,
    timeout_s: float,
    default_model: str = "",
    turns: Turns | None = None,
) -> GpuMetrics:
    """GET ``{url}/metrics`` and parse it; any failure is a ScrapeError (never hangs).

    Over the lean client the data path uses (:class:`~zone_agent.upstream.UpstreamPool`,
    a pool of the scrapes' own, so a busy data path never holds a scrape back): a scrape
    through aiohttp's client cost ~400 µs of the agent's CPU besides its parsing, the
    larger part of a scrape round at a thousand workers (bench/scrape_parse.py).

    With ``turns``, the answer waits for a turn before it is parsed: answers that arrive
    together are then parsed a few per loop iteration (:class:`gtm.tasks.Turns`)."""
    try:
        async with asyncio.timeout(timeout_s):
            status, body = await pool.get(url.rstrip("/"), "/metrics", limit=MAX_METRICS_BYTES)
    except TimeoutError:
        raise ScrapeError(f"/metrics did not answer within {timeout_s} s") from None
    except (UpstreamError, OSError) as exc:
        raise ScrapeError(f"/metrics failed: {exc!r}") from None
    if turns is not None:
        await turns.take()  # the parse (and the caller's work after it) in bounded bursts
    if status != 200:
        raise ScrapeError(f"/metrics answered HTTP {status}")
    if len(body) > MAX_METRICS_BYTES:
        raise ScrapeError(f"/metrics is larger than {MAX_METRICS_BYTES} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ScrapeError("/metrics is not UTF-8") from None
    parsed = parse_metrics(text, scraped_at=clock.monotonic(), default_model=default_model)
    if parsed.parsed_by is not Parser.READER:
        log.debug("%s/metrics read by the reference parser: %s", url, parsed.aside)
    return parsed
