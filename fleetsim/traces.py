"""Real LLM-inference request traces: arrival times and token counts to replay.

Readers for the traces shipped in ``gtm/data/traces`` (xz-compressed, licences beside
them; :mod:`gtm.data`), used by ``gtm load`` (live replay through a deployment), the game
days and the fleet simulator:

* **Azure LLM inference 2023** (Patel et al., "Splitwise", ISCA'24; CC BY 4.0):
  ``AzureLLMInferenceTrace_conv.csv`` / ``_code.csv`` — ``TIMESTAMP,ContextTokens,
  GeneratedTokens``, wall-clock timestamps without a zone, 100 ns resolution.
* **Mooncake** (Qin et al., FAST'25; Apache-2.0): ``conversation_trace.jsonl`` — one JSON
  object per line, ``timestamp`` (ms from the start), ``input_length``,
  ``output_length`` and ``hash_ids``: prefix-chained hashes of 512-token blocks (equal
  leading ids mean a shared prefix).

Every reader returns a :class:`Trace` whose requests arrive at offsets from the first
one, sorted; a malformed row is an error naming the file and line, never skipped
silently (a trace with holes would misstate the load it claims to replay).

``synthetic`` needs no file: arrivals and sizes are drawn from a model fitted on the
Azure conversation trace (:mod:`fleetsim.synthetic`), deterministic for a seed.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from gtm import data
from gtm.data import DATA_DIR_ENV as DATA_DIR_ENV  # its home; kept here for callers
from gtm.errors import ConfigError

#: Tokens per Mooncake hash block (its README: ``len(hash_ids) == ceil(input_length/512)``).
MOONCAKE_BLOCK_TOKENS = 512


class TraceKind(StrEnum):
    AZURE_CONV = "azure-conv"
    AZURE_CODE = "azure-code"
    MOONCAKE = "mooncake"
    #: Drawn from :data:`fleetsim.synthetic.AZURE_CONV_FIT`; no file.
    SYNTHETIC = "synthetic"


#: Each file-backed kind's file under the data directory (stored compressed; named plain,
#: :func:`gtm.data.read_text` finds the ``.xz``).
TRACE_FILES = {
    TraceKind.AZURE_CONV: "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
    TraceKind.AZURE_CODE: "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv",
    TraceKind.MOONCAKE: "traces/mooncake/conversation_trace.jsonl",
}


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request: when it arrives (s after the trace's first) and its sizes."""

    at_s: float
    input_tokens: int
    output_tokens: int
    #: Prefix-chained block hashes (Mooncake), block size :data:`MOONCAKE_BLOCK_TOKENS`.
    prefix_hashes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Trace:
    kind: TraceKind
    source: str
    requests: tuple[TraceRequest, ...]

    @property
    def duration_s(self) -> float:
        return self.requests[-1].at_s if self.requests else 0.0

    @property
    def rate_per_s(self) -> float:
        """The trace's native arrival rate (requests over its span)."""
        span = self.duration_s
        return len(self.requests) / span if span > 0 else float(len(self.requests))

    def window(self, duration_s: float, rate_scale: float = 1.0) -> tuple[TraceRequest, ...]:
        """The requests that arrive within ``duration_s`` once arrivals are sped up
        ``rate_scale`` times (inter-arrival times divided by it)."""
        if rate_scale <= 0:
            raise ValueError("rate_scale must be positive")
        limit = duration_s * rate_scale
        return tuple(r for r in self.requests if r.at_s < limit)


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$GTM_DATA_DIR``, else the data shipped with gtm (:func:`gtm.data.data_dir`)."""
    return data.data_dir(environ)


def _parse_azure_time(text: str) -> datetime:
    # "2023-11-16 18:15:46.6805900": 7 fractional digits, one more than %f takes.
    head, _, fraction = text.strip().partition(".")
    return datetime.strptime(f"{head}.{(fraction + '000000')[:6]}", "%Y-%m-%d %H:%M:%S.%f")


def read_azure(text: str, source: str, kind: TraceKind = TraceKind.AZURE_CONV) -> Trace:
    """An Azure 2023 trace from its CSV text."""
    rows: list[tuple[datetime, int, int]] = []
    reader = csv.DictReader(io.StringIO(text))
    for line, row in enumerate(reader, start=2):
        try:
            rows.append(
                (
                    _parse_azure_time(row["TIMESTAMP"]),
                    _count(row["ContextTokens"]),
                    _count(row["GeneratedTokens"]),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: line {line}: not an Azure trace row ({exc})") from None
    rows.sort(key=lambda r: r[0])
    if not rows:
        raise ConfigError(f"{source}: no requests")
    start = rows[0][0]
    requests = tuple(
        TraceRequest((at - start).total_seconds(), tokens_in, tokens_out)
        for at, tokens_in, tokens_out in rows
    )
    return Trace(kind, source, requests)


def read_mooncake(lines: Iterable[str], source: str) -> Trace:
    """A Mooncake trace from its JSON lines."""
    requests: list[TraceRequest] = []
    for line, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
            hashes = tuple(int(h) for h in item.get("hash_ids", ()))
            requests.append(
                TraceRequest(
                    float(item["timestamp"]) / 1000.0,
                    _count(item["input_length"]),
                    _count(item["output_length"]),
                    hashes,
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{source}: line {line}: not a Mooncake record ({exc})") from None
    if not requests:
        raise ConfigError(f"{source}: no requests")
    requests.sort(key=lambda r: r.at_s)
    start = requests[0].at_s
    return Trace(
        TraceKind.MOONCAKE,
        source,
        tuple(
            TraceRequest(r.at_s - start, r.input_tokens, r.output_tokens, r.prefix_hashes)
            for r in requests
        ),
    )


def _count(value: object) -> int:
    number = int(str(value).strip())
    if number < 0:
        raise ValueError(f"negative token count {number}")
    return number


def load_trace(kind: TraceKind, path: str | Path | None = None, *, seed: int = 0) -> Trace:
    """Read the trace of ``kind`` from ``path`` (default: the data directory); a
    ``synthetic`` one is drawn with ``seed`` instead (``path`` must be None)."""
    if kind is TraceKind.SYNTHETIC:
        if path is not None:
            raise ConfigError("the synthetic trace is drawn, not read: pass no trace file")
        from fleetsim.synthetic import synthetic_trace

        return synthetic_trace(seed=seed)
    file = Path(path) if path is not None else data_dir() / TRACE_FILES[kind]
    try:
        text = data.read_text(file)
    except OSError as exc:
        hint = "" if path is not None else f" (data folder: {data.origin()})"
        raise ConfigError(
            f"{data.find(file)}: cannot read the {kind.value} trace: {exc.strerror or exc}{hint}"
        ) from None
    if kind is TraceKind.MOONCAKE:
        return read_mooncake(text.splitlines(), str(file))
    return read_azure(text, str(file), kind)
