"""What ``gtm gpu-sim`` is configured with, and the GPU profile it serves."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from pydantic import Field

from gpusim.lagprobe import PROBE_INTERVAL_S
from gpusim.metrics import MetricsFlavor
from gpusim.perfmodel import WARMUP_PASSES
from gpusim.registration import DEFAULT_LEASE_TTL_S
from gtm.errors import ConfigError
from gtm.gpu_profiles import LLAMA_8B, GpuProfile, UnknownProfile, get_profile
from gtm.http_limits import HttpLimits
from gtm.kv_events import KVEventsConfig
from gtm.models import Frozen, Identifier, ModelName


class GpuSimConfig(Frozen):
    """Everything ``gtm gpu-sim`` is configured with."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    #: The GPU type the worker declares (registration, worker id, what routers read).
    gpu_type: str = "A100-80GB"
    #: The GPU type whose profile it runs, when not ``gpu_type`` (``--emulate``): e.g. an
    #: H100's speed declared as a type gtm has no profile of, to test calibration.
    emulate: str | None = None
    models: tuple[ModelName, ...] = Field(default=(LLAMA_8B,), min_length=1)
    speedup: float = Field(default=1.0, gt=0.0, le=1e6, allow_inf_nan=False)
    seed: int = 0
    metrics_flavor: MetricsFlavor = MetricsFlavor.VLLM
    #: Waiting requests (per model) beyond which new requests get 429.
    max_queue: int = Field(default=1024, ge=0)
    #: Start with the model(s) not loaded: serve only after the profile's cold start.
    cold_start: bool = False
    warmup_passes: int = Field(default=WARMUP_PASSES, ge=0)
    max_num_seqs: Annotated[int, Field(ge=1)] | None = None
    num_gpu_blocks: Annotated[int, Field(ge=1)] | None = None
    step_jitter: float = Field(default=0.0, ge=0.0, le=0.5)
    state: str | None = None
    region: Identifier = "local"
    zone: Identifier = "local-a"
    worker_id: Identifier | None = None
    advertise_url: str | None = None
    lease_ttl_s: float = Field(default=DEFAULT_LEASE_TTL_S, ge=1.0, le=3600.0)
    #: Seconds between the event-loop lag probe's wake-ups (``/admin/lag``).
    lag_probe_interval_s: float = Field(default=PROBE_INTERVAL_S, ge=0.001, le=10.0)
    #: Header/body/JSON-depth limits, slow-client timeouts, per-client concurrency.
    limits: HttpLimits = HttpLimits()
    #: vLLM's ``--kv-events-config``: publish the prefix cache's KV events over ZMQ
    #: (:mod:`gpusim.kv_events`); ``None``, as vLLM's default, publishes nothing.
    kv_events: KVEventsConfig | None = None


def build_profile(config: GpuSimConfig, model: str) -> GpuProfile:
    """The profile of ``model`` on the emulated GPU (``emulate``, else ``gpu_type``),
    with command-line overrides."""
    try:
        profile = get_profile(config.emulate or config.gpu_type, model)
    except UnknownProfile as exc:
        hint = "" if config.emulate else "; --emulate TYPE runs another type's profile"
        raise ConfigError(f"{exc}{hint}") from None
    if config.max_num_seqs is not None:
        profile = replace(profile, max_num_seqs=config.max_num_seqs)
    if config.num_gpu_blocks is not None:
        blocks = config.num_gpu_blocks
        max_len = min(profile.max_model_len, blocks * profile.block_size)
        profile = replace(profile, num_gpu_blocks=blocks, max_model_len=max_len)
    return profile
