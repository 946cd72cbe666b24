"""What an engine plugin declares: the metric names it exposes and what each one means.

An engine is a table, not code: which sample names carry which ``ModelMetrics`` field,
which label names the served model (llama.cpp's and TGI's have none: a worker serves one
model), which labelled families select a field by a label's value (Triton's
``nv_trt_llm_request_metrics{request_type="active"}``), which info gauges carry the KV
geometry in labels (vLLM's ``cache_config_info``), and an optional ``derive`` step for
figures an engine only gives in parts (used blocks and total blocks, not the fraction).

Field names are ``zone_agent.scrape.ModelMetrics``'s; a unit test checks every table
against it. A field an engine does not expose is simply not in its table: the scraper
then reports it as absent (``None``) and the view treats it as unknown, never as zero.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

#: One model's fields as they are read, before they become a ``ModelMetrics``. Keys
#: starting with ``_`` are an engine's intermediate figures, for its ``derive`` only.
Row = MutableMapping[str, float | int | None]


class Flavor(StrEnum):
    """Whose metric names a worker exposes (detected from the names, per scrape)."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TGI = "tgi"
    TRTLLM = "trtllm"
    LLAMACPP = "llamacpp"
    DYNAMO = "dynamo"
    UNKNOWN = "unknown"


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class LabelledFamily:
    """A family whose samples differ by one label: ``values`` maps its value to a field."""

    label: str
    values: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ConfigInfo:
    """An info gauge (value 1) carrying the KV block size and block count in labels."""

    block_size_label: str
    blocks_label: str


@dataclass(frozen=True, slots=True)
class EngineNames:
    """One engine's metric names (one plugin per module in this package)."""

    flavor: Flavor
    #: Sample name → field (``_sum``/``_count``/``_total`` names spelled out).
    samples: Mapping[str, str] = field(default_factory=_empty)
    #: Sample name → the label that selects the field.
    labelled: Mapping[str, LabelledFamily] = field(default_factory=lambda: MappingProxyType({}))
    #: Info-gauge sample name → the labels that carry the KV geometry.
    config_info: Mapping[str, ConfigInfo] = field(default_factory=lambda: MappingProxyType({}))
    #: The label naming the served model; None: the engine serves one, unlabelled.
    model_label: str | None = "model_name"
    #: Turns an engine's intermediate figures (``_``-keys) into fields, in place.
    derive: Callable[[Row], None] | None = None

    def families(self) -> frozenset[str]:
        """The family names this engine's samples belong to (for the line filter)."""
        names = set(self.config_info)
        for sample in (*self.samples, *self.labelled):
            stem, _, suffix = sample.rpartition("_")
            names.add(stem if suffix in {"sum", "count", "total"} else sample)
        return frozenset(names)
