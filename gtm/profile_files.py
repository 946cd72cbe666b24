"""Performance profiles as files: the format, its reader and the writer of the shipped ones.

A profile file is YAML (read safely, with lines: :mod:`policies.yamlsafe`), one
document per (GPU type, model) pair; a file may hold several documents (``---``), and
a directory holds any number of ``*.yaml`` / ``*.yml`` files. The fields are those of
:class:`gtm.gpu_profiles.GpuProfile`, grouped::

    format: gtm.gpu-profile/v1
    gpu_type: H100                     # as workers declare it (case-insensitive)
    model: meta-llama/Llama-3.1-8B-Instruct
    kind: generate                     # or embed (no decode, no prefix cache)
    tensor_parallel: 1                 # GPUs per worker (vLLM --tensor-parallel-size)
    source: "where the figures come from"
    prefill:
      tokens_per_s: 20322.4            # marginal (compute-bound) prefill rate
      attention_s_per_pair: 3.2e-10    # attention compute per (query, key) pair
    decode:
      weight_read_s: 0.00599           # weights read per forward pass (decode floor)
      kv_read_s_per_token: 4.9e-08     # KV read per context token attended to
    step_overhead_s: 0.002             # fixed cost of a forward pass
    kv_cache: {bytes_per_token: 131072, block_size: 16, num_gpu_blocks: 25730}
    batching: {max_num_seqs: 1024, max_num_batched_tokens: 8192}
    max_model_len: 131072
    cold_start_s: 28.0

A forward pass of ``n`` new tokens reading ``c`` context tokens with ``p`` attention
pairs takes ``step_overhead_s + max(weight_read_s + c·kv_read_s_per_token,
n/tokens_per_s + p·attention_s_per_pair)`` (:meth:`GpuProfile.forward_time_s`), so
prefill time by prompt length and decode step time by batch size both follow from these
figures; the shipped files list a few of each in comments. Measurements can be given
instead of the figures, and the figures are fitted to them (least squares)::

    prefill:
      measured:                        # one request alone: prompt tokens → seconds
        - {prompt_tokens: 1024, seconds: 0.055}
        - {prompt_tokens: 8192, seconds: 0.47}
    decode:
      measured:                        # one step: batch × context tokens → seconds
        - {batch: 1, context_tokens: 1024, step_s: 0.008}
        - {batch: 64, context_tokens: 1024, step_s: 0.0112}

Prefill points should be compute-bound (prompts of several hundred tokens or more:
shorter ones measure the weight reads); decode steps are taken as memory-bound.

Any field that is wrong is a :class:`gtm.errors.ConfigError` naming the file, the line
and the field; two files giving the same pair is one too (naming both).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from gtm.errors import ConfigError
from gtm.gpu_profiles import (
    ENGINE_INIT_S,
    GPUS,
    STEP_OVERHEAD_S,
    GpuProfile,
    ModelKind,
    ProfileCatalog,
    ProfileEntry,
    ProfileSource,
    roofline_profiles,
)
from gtm.models import Frozen
from policies.errors import ReadError
from policies.yamlsafe import format_path, parse_yaml

FORMAT = "gtm.gpu-profile/v1"
SUFFIXES = (".yaml", ".yml")
#: Largest profile file read (a file of every model on one GPU is a few kB).
MAX_FILE_BYTES = 1024 * 1024

Positive = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class PrefillPoint(Frozen):
    """One measured prefill: a request of ``prompt_tokens`` alone, first token after
    ``seconds`` (less any queueing)."""

    prompt_tokens: int = Field(ge=1)
    seconds: Positive


class DecodePoint(Frozen):
    """One measured decode step of ``batch`` sequences of ``context_tokens`` each."""

    batch: int = Field(ge=1)
    context_tokens: int = Field(ge=0)
    step_s: Positive


class PrefillFigures(Frozen):
    """The prefill rate and attention cost, or measurements they are fitted to."""

    tokens_per_s: Positive | None = None
    attention_s_per_pair: NonNegative | None = None
    measured: tuple[PrefillPoint, ...] = ()

    @model_validator(mode="after")
    def _one_way(self) -> PrefillFigures:
        if (self.tokens_per_s is None) == (not self.measured):
            raise ValueError("give either tokens_per_s or measured (a list of points)")
        if self.measured and self.attention_s_per_pair is not None:
            raise ValueError("attention_s_per_pair is fitted from measured; give one or other")
        return self


class DecodeFigures(Frozen):
    """The weight and KV read times, or measurements they are fitted to."""

    weight_read_s: Positive | None = None
    kv_read_s_per_token: NonNegative | None = None
    measured: tuple[DecodePoint, ...] = ()

    @model_validator(mode="after")
    def _one_way(self) -> DecodeFigures:
        given = self.weight_read_s is not None or self.kv_read_s_per_token is not None
        if given == bool(self.measured):
            raise ValueError(
                "give either weight_read_s and kv_read_s_per_token, or measured (a list of points)"
            )
        if given and (self.weight_read_s is None or self.kv_read_s_per_token is None):
            raise ValueError("give both weight_read_s and kv_read_s_per_token")
        return self


def _least_squares(rows: Sequence[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(p, q) minimising Σ (p·x + q·z − y)² over rows (x, z, y); None if singular."""
    sxx = sum(x * x for x, _, _ in rows)
    szz = sum(z * z for _, z, _ in rows)
    sxz = sum(x * z for x, z, _ in rows)
    sxy = sum(x * y for x, _, y in rows)
    szy = sum(z * y for _, z, y in rows)
    det = sxx * szz - sxz * sxz
    if abs(det) <= 1e-12 * max(sxx * szz, 1e-300):
        return None
    return (sxy * szz - szy * sxz) / det, (szy * sxx - sxy * sxz) / det


def fit_prefill(
    points: Sequence[PrefillPoint], overhead_s: float, chunk_tokens: int
) -> tuple[float, float]:
    """(tokens_per_s, attention_s_per_pair) of the roofline's compute term that best
    predicts ``points``: ``seconds = passes·overhead + n/rate + n(n+1)/2 · attention``
    (prompts long enough to be compute-bound; attention 0 when the points cannot tell)."""
    rows = [
        (
            float(p.prompt_tokens),
            p.prompt_tokens * (p.prompt_tokens + 1) / 2.0,
            p.seconds - math.ceil(p.prompt_tokens / chunk_tokens) * overhead_s,
        )
        for p in points
    ]
    fitted = _least_squares(rows) if len(rows) >= 2 else None
    if fitted is None or fitted[1] < 0 or fitted[0] <= 0:
        per_token = sum(x * y for x, _, y in rows) / sum(x * x for x, _, _ in rows)
        fitted = (per_token, 0.0)
    if fitted[0] <= 0:
        raise ValueError(
            "prefill.measured: the times are not longer than the per-pass overhead; "
            "no positive prefill rate fits them"
        )
    return 1.0 / fitted[0], fitted[1]


def fit_decode(points: Sequence[DecodePoint], overhead_s: float) -> tuple[float, float]:
    """(weight_read_s, kv_read_s_per_token) that best predict ``points``: a decode step
    is memory-bound, ``step_s = overhead + weights + batch·context · kv``."""
    rows = [(1.0, float(p.batch * p.context_tokens), p.step_s - overhead_s) for p in points]
    fitted = _least_squares(rows) if len(rows) >= 2 else None
    if fitted is None or fitted[1] < 0:
        fitted = (sum(y for _, _, y in rows) / len(rows), 0.0)
    if fitted[0] <= 0:
        raise ValueError(
            "decode.measured: the steps are not longer than the per-pass overhead; "
            "no positive weight read time fits them"
        )
    return fitted


class KvCacheFigures(Frozen):
    bytes_per_token: int = Field(ge=1)
    block_size: int = Field(default=16, ge=1, le=4096)
    num_gpu_blocks: int = Field(ge=1)


class BatchingFigures(Frozen):
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int = Field(default=2048, ge=1)


class ProfileDocument(Frozen):
    """One profile document, as written in a file."""

    format: Literal["gtm.gpu-profile/v1"]
    gpu_type: str = Field(min_length=1, max_length=63)
    model: str = Field(min_length=1, max_length=256)
    kind: ModelKind = ModelKind.GENERATE
    tensor_parallel: int = Field(default=1, ge=1, le=1024)
    source: str = ""
    prefill: PrefillFigures
    decode: DecodeFigures
    step_overhead_s: NonNegative = STEP_OVERHEAD_S
    kv_cache: KvCacheFigures
    batching: BatchingFigures = BatchingFigures()
    max_model_len: int = Field(ge=1)
    cold_start_s: NonNegative = ENGINE_INIT_S
    #: Default: on for generative models, off for encoders.
    prefix_caching: bool | None = None
    embedding_dim: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _fits(self) -> ProfileDocument:
        self._prefill_figures()
        self._decode_figures()
        return self

    def _prefill_figures(self) -> tuple[float, float]:
        if self.prefill.tokens_per_s is not None:
            return self.prefill.tokens_per_s, self.prefill.attention_s_per_pair or 0.0
        return fit_prefill(
            self.prefill.measured, self.step_overhead_s, self.batching.max_num_batched_tokens
        )

    def _decode_figures(self) -> tuple[float, float]:
        if self.decode.weight_read_s is not None and self.decode.kv_read_s_per_token is not None:
            return self.decode.weight_read_s, self.decode.kv_read_s_per_token
        return fit_decode(self.decode.measured, self.step_overhead_s)

    @model_validator(mode="after")
    def _context_fits(self) -> ProfileDocument:
        capacity = self.kv_cache.num_gpu_blocks * self.kv_cache.block_size
        if self.max_model_len > capacity and self.kind is ModelKind.GENERATE:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the KV cache "
                f"({self.kv_cache.num_gpu_blocks} blocks × {self.kv_cache.block_size} tokens)"
            )
        return self

    def profile(self) -> GpuProfile:
        rate, attention = self._prefill_figures()
        weights, kv_read = self._decode_figures()
        return GpuProfile(
            gpu_type=self.gpu_type,
            model=self.model,
            kind=self.kind,
            tensor_parallel=self.tensor_parallel,
            prefill_tokens_per_s=rate,
            weight_read_s=weights,
            kv_read_s_per_token=kv_read,
            attention_s_per_pair=attention,
            step_overhead_s=self.step_overhead_s,
            kv_bytes_per_token=self.kv_cache.bytes_per_token,
            block_size=self.kv_cache.block_size,
            num_gpu_blocks=self.kv_cache.num_gpu_blocks,
            max_num_seqs=self.batching.max_num_seqs,
            max_num_batched_tokens=self.batching.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            cold_start_s=self.cold_start_s,
            prefix_caching=(
                self.kind is ModelKind.GENERATE
                if self.prefix_caching is None
                else self.prefix_caching
            ),
            embedding_dim=self.embedding_dim,
        )


# ---------------------------------------------------------------------------- reading


def shipped_dir() -> Path:
    """The profiles shipped with gtm (package data)."""
    return Path(str(resources.files("gtm.data"))) / "profiles"


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
        if not found:
            raise ConfigError(f"{path}: no profile files (*.yaml, *.yml) in this directory")
        return found
    if path.is_file():
        return [path]
    raise ConfigError(f"{path}: no such profile file or directory")


def read_file(path: Path) -> list[GpuProfile]:
    """Every profile in one file; ConfigError naming the file, line and field."""
    try:
        raw = path.read_bytes()[: MAX_FILE_BYTES + 1]
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read profile file: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: profile file larger than {MAX_FILE_BYTES} bytes")
    try:
        documents = parse_yaml(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: profile file is not UTF-8") from None
    except ReadError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise ConfigError(f"{where}: {exc.message}") from None
    profiles = []
    for document in documents:
        if document.data is None:
            continue  # an empty document (a trailing ---)
        try:
            profiles.append(ProfileDocument.model_validate(document.data).profile())
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = tuple(first["loc"])
            line = document.line_of(loc) or document.start_line
            raise ConfigError(
                f"{path}:{line}: {format_path(loc)}: {first['msg']}"
                + (f" (got {first['input']!r})" if first["type"] != "missing" else "")
            ) from None
    return profiles


def load_catalog(paths: Sequence[Path], *, source: ProfileSource) -> ProfileCatalog:
    """Every profile under ``paths`` (files or directories), each pair at most once."""
    entries: dict[tuple[str, str], ProfileEntry] = {}
    for path in paths:
        for file in _files(path):
            for profile in read_file(file):
                key = (profile.gpu_type.casefold(), profile.model)
                if key in entries:
                    raise ConfigError(
                        f"{file}: profile of {profile.model!r} on {profile.gpu_type} is also "
                        f"in {entries[key].origin}; keep one"
                    )
                entries[key] = ProfileEntry(profile, source, str(file))
    return ProfileCatalog(entries.values())


def operator_catalog(paths: Sequence[Path]) -> ProfileCatalog:
    """The shipped profiles with an operator's files (``--profiles``) over them."""
    from gtm.gpu_profiles import shipped

    if not paths:
        return shipped()
    return shipped().overlaid(load_catalog(paths, source=ProfileSource.FILE))


# ---------------------------------------------------------------------------- writing


def _number(value: float | int) -> str:
    return repr(value)


def _comments(profile: GpuProfile) -> list[str]:
    """Prefill time by prompt length and decode step by batch, as the figures give."""
    if profile.kind is ModelKind.EMBED:
        return [
            "# prefill (one request alone): "
            + ", ".join(f"{n} tokens {1000 * profile.prefill_time_s(n):.1f} ms" for n in (128, 512))
        ]
    lengths = (512, 2048, 8192)
    batches = (1, 16, 64)
    return [
        "# prefill (one request alone): "
        + ", ".join(
            f"{n} tokens {1000 * profile.prefill_time_s(n):.1f} ms "
            f"({n / profile.prefill_time_s(n):,.0f} tok/s)"
            for n in lengths
        ),
        "# decode step at 1,024 context tokens per sequence: "
        + ", ".join(
            f"batch {b} {1000 * profile.decode_step_s(b, 1024):.1f} ms"
            for b in batches
            if b <= profile.max_num_seqs
        ),
    ]


def render(profile: GpuProfile, source: str) -> str:
    """One profile as a YAML document (floats written so they read back to the bit)."""
    p = profile
    lines = [
        *_comments(p),
        f"format: {FORMAT}",
        f"gpu_type: {json.dumps(p.gpu_type)}",
        f"model: {json.dumps(p.model)}",
        f"kind: {p.kind.value}",
        f"tensor_parallel: {p.tensor_parallel}",
        f"source: {json.dumps(source)}",
        "prefill:",
        f"  tokens_per_s: {_number(p.prefill_tokens_per_s)}",
        f"  attention_s_per_pair: {_number(p.attention_s_per_pair)}",
        "decode:",
        f"  weight_read_s: {_number(p.weight_read_s)}",
        f"  kv_read_s_per_token: {_number(p.kv_read_s_per_token)}",
        f"step_overhead_s: {_number(p.step_overhead_s)}",
        "kv_cache:",
        f"  bytes_per_token: {p.kv_bytes_per_token}",
        f"  block_size: {p.block_size}",
        f"  num_gpu_blocks: {p.num_gpu_blocks}",
        "batching:",
        f"  max_num_seqs: {p.max_num_seqs}",
        f"  max_num_batched_tokens: {p.max_num_batched_tokens}",
        f"max_model_len: {p.max_model_len}",
        f"cold_start_s: {_number(p.cold_start_s)}",
        f"prefix_caching: {'true' if p.prefix_caching else 'false'}",
        f"embedding_dim: {p.embedding_dim}",
    ]
    return "\n".join(lines) + "\n"


_HEADER = """\
# Performance profiles of {gpu} workers, one YAML document per model (format:
# gtm.profile_files). Derived, not measured: a roofline of one forward pass
# (gtm.gpu_profiles) from the GPU's datasheet and each model's config.json, with the
# efficiency assumptions stated in gtm/gpu_profiles.py.
# Datasheet: {datasheet}.
# Written by `python -m gtm.profile_files --write gtm/data/profiles`; do not edit by
# hand (a test checks these files equal the derivation). To price a fleet by its own
# measurements, give the zone agent a file of your own (--profiles DIR); the zone agent
# also calibrates every worker online from its metrics.
"""

_DATASHEETS = {
    "H100": "NVIDIA H100 SXM5: 80 GB HBM3, 3.35 TB/s, 989 dense BF16 TFLOPS",
    "H200": "NVIDIA H200 SXM: 141 GB HBM3e, 4.8 TB/s, 989 dense BF16 TFLOPS",
    "B200": "NVIDIA HGX B200 per GPU: 180 GB HBM3e, 8 TB/s, 2,250 dense BF16 TFLOPS",
    "A100-80GB": "NVIDIA A100 SXM 80GB: HBM2e 2,039 GB/s, 312 dense BF16 TFLOPS",
    "A100-40GB": "NVIDIA A100 SXM 40GB: HBM2 1,555 GB/s, 312 dense BF16 TFLOPS",
    "L40S": "NVIDIA L40S: 48 GB GDDR6, 864 GB/s, 362 dense BF16 TFLOPS, PCIe",
    "L4": "NVIDIA L4: 24 GB GDDR6, 300 GB/s, 121 dense BF16 TFLOPS, PCIe",
    "V100": "NVIDIA V100 SXM2 32GB: 900 GB/s, 125 FP16 tensor TFLOPS",
    "MI300X": "AMD Instinct MI300X: 192 GB HBM3, 5.3 TB/s, 1,307 dense BF16 TFLOPS",
}


def file_name(gpu_type: str) -> str:
    return gpu_type.lower() + ".yaml"


def render_shipped(profiles: Iterable[GpuProfile]) -> dict[str, str]:
    """File name → text of the shipped files (one per GPU type)."""
    by_gpu: dict[str, list[GpuProfile]] = {}
    for profile in profiles:
        by_gpu.setdefault(profile.gpu_type, []).append(profile)
    out = {}
    for gpu, group in by_gpu.items():
        sheet = _DATASHEETS[gpu]
        source = f"roofline from the {sheet.split(':')[0]} datasheet and the model's config.json"
        docs = [render(p, source) for p in group]
        out[file_name(gpu)] = _HEADER.format(gpu=gpu, datasheet=sheet) + "---\n".join(["", *docs])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the shipped GPU profile files.")
    parser.add_argument("--write", type=Path, required=True, help="directory to write into")
    args = parser.parse_args(argv)
    assert set(_DATASHEETS) == set(GPUS), "every GPU needs its datasheet line"
    args.write.mkdir(parents=True, exist_ok=True)
    for name, text in render_shipped(roofline_profiles()).items():
        (args.write / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
