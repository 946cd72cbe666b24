"""Reading a worker's load from its Prometheus ``/metrics`` (vLLM and SGLang names).

The names are those the Gateway API Inference Extension's model-server protocol and
llm-d's metric extractors read (ARCHITECTURE §7): vLLM ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (a fraction despite its name;
older releases call it ``vllm:gpu_cache_usage_perc``), ``vllm:prefix_cache_{hits,queries}``
and ``vllm:cache_config_info`` (labels ``block_size``, ``num_gpu_blocks``); SGLang
``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage`` and
``sglang:cache_config_info`` (``page_size``, ``num_pages``). The inter-token latency
histogram (``*:inter_token_latency_seconds``; vLLM before V1: ``time_per_output_token``)
feeds throughput-regression detection.

Parsing uses prometheus_client's own text parser, on only the lines of the families
above (a worker exposes hundreds of histogram lines we do not need). Every result
carries the monotonic time it was taken, so a reader knows its age.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gtm.clock import Clock
from zone_agent.errors import ScrapeError as ScrapeError  # raised here; re-exported

#: Largest /metrics body read (a vLLM worker with several LoRA adapters exposes ~200 kB).
MAX_METRICS_BYTES = 4 * 1024 * 1024


class Flavor(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    """One served model's load on one worker, as last scraped."""

    running: float = 0.0
    waiting: float = 0.0
    #: Fraction of KV-cache blocks in use, in [0, 1].
    kv_usage: float = 0.0
    block_size: int | None = None
    kv_blocks_total: int | None = None
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    itl_sum: float | None = None
    itl_count: float | None = None


@dataclass(frozen=True, slots=True)
class GpuMetrics:
    """Everything scraped from one worker at monotonic time ``scraped_at``."""

    scraped_at: float
    flavor: Flavor
    models: Mapping[str, ModelMetrics] = field(default_factory=lambda: MappingProxyType({}))

    def age(self, now: float) -> float:
        return max(0.0, now - self.scraped_at)


# Sample name → (ModelMetrics field, flavor).
_GAUGES: Mapping[str, tuple[str, Flavor]] = MappingProxyType(
    {
        "vllm:num_requests_running": ("running", Flavor.VLLM),
        "vllm:num_requests_waiting": ("waiting", Flavor.VLLM),
        "vllm:kv_cache_usage_perc": ("kv_usage", Flavor.VLLM),
        "vllm:gpu_cache_usage_perc": ("kv_usage", Flavor.VLLM),
        "vllm:prefix_cache_hits_total": ("prefix_hits", Flavor.VLLM),
        "vllm:prefix_cache_queries_total": ("prefix_queries", Flavor.VLLM),
        "vllm:inter_token_latency_seconds_sum": ("itl_sum", Flavor.VLLM),
        "vllm:inter_token_latency_seconds_count": ("itl_count", Flavor.VLLM),
        "vllm:time_per_output_token_seconds_sum": ("itl_sum", Flavor.VLLM),
        "vllm:time_per_output_token_seconds_count": ("itl_count", Flavor.VLLM),
        "sglang:num_running_reqs": ("running", Flavor.SGLANG),
        "sglang:num_queue_reqs": ("waiting", Flavor.SGLANG),
        "sglang:token_usage": ("kv_usage", Flavor.SGLANG),
        "sglang:inter_token_latency_seconds_sum": ("itl_sum", Flavor.SGLANG),
        "sglang:inter_token_latency_seconds_count": ("itl_count", Flavor.SGLANG),
    }
)
_CONFIG_INFO: Mapping[str, tuple[str, str, Flavor]] = MappingProxyType(
    {
        "vllm:cache_config_info": ("block_size", "num_gpu_blocks", Flavor.VLLM),
        "sglang:cache_config_info": ("page_size", "num_pages", Flavor.SGLANG),
    }
)
_PREFIXES = tuple(
    {
        name.rsplit("_", 1)[0] if name.endswith(("_sum", "_count", "_total")) else name
        for name in _GAUGES
    }
    | set(_CONFIG_INFO)
)


def _relevant(text: str) -> str:
    """Only the sample and metadata lines of the families we read."""
    keep: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[2].startswith(_PREFIXES):
                keep.append(line)
        elif line.startswith(_PREFIXES) and "_bucket" not in line and "_created" not in line:
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
    """Parse a /metrics body. Samples without a ``model_name`` label go to ``default_model``.

    Raises ScrapeError if the text is not Prometheus exposition format.
    """
    fields: dict[str, dict[str, float | int | None]] = {}
    flavor = Flavor.UNKNOWN
    try:
        for family in text_string_to_metric_families(_relevant(text)):
            for sample in family.samples:
                model = sample.labels.get("model_name", default_model)
                row = fields.setdefault(model, {})
                gauge = _GAUGES.get(sample.name)
                if gauge is not None:
                    row[gauge[0]] = float(sample.value)
                    flavor = gauge[1]
                    continue
                config = _CONFIG_INFO.get(sample.name)
                if config is not None:
                    row["block_size"] = _int_label(sample.labels, config[0])
                    row["kv_blocks_total"] = _int_label(sample.labels, config[1])
                    flavor = config[2]
    except (ValueError, TypeError, IndexError) as exc:
        raise ScrapeError(f"not Prometheus text exposition format: {exc}") from None
    models = {
        model: ModelMetrics(**{k: v for k, v in row.items()})  # type: ignore[arg-type]
        for model, row in fields.items()
    }
    for model, metrics in models.items():
        if not 0.0 <= metrics.kv_usage <= 1.0 or metrics.running < 0 or metrics.waiting < 0:
            raise ScrapeError(f"impossible values for model {model!r}: {metrics}")
    return GpuMetrics(scraped_at, flavor, MappingProxyType(models))


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
