"""Configuration of a zone agent (``gtm zone`` options), validated once at start-up."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from gtm.errors import ConfigError
from gtm.http_limits import HttpLimits
from gtm.kv_events import KV_EVENTS_LABEL, KV_EVENTS_REPLAY_LABEL
from gtm.models import Frozen, GpuWorker, Identifier, ModelName
from gtm.serve import HttpServerKind
from zone_agent.credentials import KeyRef, WorkerKeyConfig, parse_ref
from zone_agent.flow import AdmissionSettings
from zone_agent.health import HealthConfig
from zone_agent.profiles import DEFAULT_PROFILE

#: GPU type of a static worker whose type is not given: priced by the model's slowest
#: shipped profile until its own metrics calibrate it (zone_agent.calibration), logged once.
UNKNOWN_GPU_TYPE = "unknown"

#: vLLM's default KV-event endpoint (``KVEventsConfig.endpoint``, tcp://*:5557), as the
#: zone agent dials it on each worker's host: ``gtm zone --kv-events`` alone.
DEFAULT_KV_EVENTS = "tcp://{host}:5557"


class KVEventsSource(Frozen):
    """Where the agent reads each worker's vLLM KV events (``gtm zone --kv-events``,
    :mod:`zone_agent.kv_events`): patterns in which ``{host}`` is the worker URL's host
    and ``{port}`` its port, or a worker's own ``kv-events``/``kv-events-replay`` labels
    (as vllm-router takes a fallback port or a per-worker ``URL=tcp://HOST:PORT``)."""

    endpoint: str = DEFAULT_KV_EVENTS
    replay: str | None = None
    topic: str = ""
    #: The model's tokenizer.json (or its directory), tokenizing prompts as a real vLLM
    #: does (zone_agent.kv_tokenizer); None: the emulator's tokenization (gtm.tokens).
    tokenizer: Path | None = None

    @model_validator(mode="after")
    def _patterns(self) -> KVEventsSource:
        for pattern in (self.endpoint, self.replay):
            if pattern is None:
                continue
            try:
                filled = pattern.format_map({"host": "h", "port": "1"})
            except (KeyError, IndexError, ValueError):
                raise ValueError(
                    f"{pattern!r}: only {{host}} and {{port}} may be filled in"
                ) from None
            if not filled.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"{pattern!r} is not a ZeroMQ endpoint (tcp://HOST:PORT)")
        return self

    def endpoints(self, worker: GpuWorker) -> tuple[str, str | None]:
        """(PUB endpoint, replay endpoint or None) of ``worker``."""
        labels = dict(worker.labels)
        url = urlsplit(worker.url)
        host = url.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        fill = {"host": host, "port": str(url.port or (443 if url.scheme == "https" else 80))}
        endpoint = labels.get(KV_EVENTS_LABEL) or self.endpoint.format_map(fill)
        replay = labels.get(KV_EVENTS_REPLAY_LABEL) or (
            self.replay.format_map(fill) if self.replay else None
        )
        return endpoint, replay


class StaticWorker(Frozen):
    """A worker given on the command line: ``URL[,gpu=TYPE][,id=ID][,model=NAME]...``."""

    id: Identifier
    url: str = Field(pattern=r"^https?://")
    gpu_type: str = UNKNOWN_GPU_TYPE
    models: tuple[ModelName, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    #: Where this worker's own API key is read (``api-key-from=file:PATH|env:NAME``;
    #: zone_agent.credentials). Kept out of the record: never in the state store.
    api_key_from: KeyRef | None = None

    def record(self, zone_id: str, region_id: str) -> GpuWorker:
        return GpuWorker(
            id=self.id,
            zone_id=zone_id,
            region_id=region_id,
            url=self.url,
            gpu_type=self.gpu_type,
            models=self.models,
            labels=self.labels,
        )


def _default_id(url: str) -> str:
    parts = urlsplit(url)
    host = (parts.hostname or "worker").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return re.sub(r"[^a-z0-9-]+", "-", f"w-{host}-{port}").strip("-")[:63]


def parse_worker(spec: str) -> StaticWorker:
    """Parse ``URL[,gpu=TYPE][,id=ID][,model=NAME][,label:KEY=VALUE][,api-key-from=REF]``;
    ConfigError if bad."""
    url, *options = [part.strip() for part in spec.split(",")]
    if not re.match(r"^https?://[^/\s]+", url):
        raise ConfigError(f"--worker {spec!r}: expected http(s)://HOST:PORT[,gpu=TYPE][,id=ID]")
    fields: dict[str, object] = {"url": url.rstrip("/"), "id": _default_id(url)}
    models: list[str] = []
    labels: list[tuple[str, str]] = []
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not value:
            raise ConfigError(f"--worker {spec!r}: option {option!r} is not KEY=VALUE")
        if key == "gpu":
            fields["gpu_type"] = value
        elif key == "id":
            fields["id"] = value
        elif key == "model":
            models.append(value)
        elif key == "api-key-from":
            fields["api_key_from"] = parse_ref(value, where=f"--worker {url}: api-key-from")
        elif key.startswith("label:"):
            labels.append((key.removeprefix("label:"), value))
        else:
            raise ConfigError(
                f"--worker {url}: unknown option {key!r} (gpu, id, model, label:K, api-key-from)"
            )
    fields["models"] = tuple(models)
    fields["labels"] = tuple(labels)
    try:
        return StaticWorker.model_validate(fields)
    except ValueError as exc:
        raise ConfigError(f"--worker {spec!r}: {exc}") from None


class ZoneConfig(Frozen):
    """Everything a zone agent is configured with."""

    zone: Identifier
    region: Identifier
    host: str = "127.0.0.1"
    port: int = Field(default=8100, ge=0, le=65535)
    workers: tuple[StaticWorker, ...] = ()
    profile: str = DEFAULT_PROFILE
    #: Operator's GPU performance profile files or directories (gtm.profile_files),
    #: over the shipped ones (``--gpu-profiles``).
    gpu_profiles: tuple[Path, ...] = ()
    #: Keep a conversation on the GPU that answered its prefix while that GPU can take
    #: it (:func:`zone_agent.affinity.sticky_gpu`; the built-in baselines never do).
    #: Off: ``gtm zone --no-affinity``, for side-by-side comparisons.
    affinity: bool = True
    #: Scrape every worker's /metrics this often (s); issue 5 asks for 250 ms.
    scrape_interval_s: float = Field(default=0.25, gt=0.0)
    scrape_timeout_s: float = Field(default=1.0, gt=0.0)
    #: Scraped signals older than this are distrusted (four scrape intervals).
    stale_after_s: float = Field(default=1.0, gt=0.0)
    summary_interval_s: float = Field(default=1.0, gt=0.0)
    health: HealthConfig = HealthConfig()
    connect_timeout_s: float = Field(default=2.0, gt=0.0)
    #: Longest wait for any byte from a worker (response headers, then between chunks).
    #: A non-streamed completion sends nothing until it is done, so this is generous.
    upstream_timeout_s: float = Field(default=300.0, gt=0.0)
    #: First-byte deadline of a streamed response: max(floor, factor × predicted TTFT),
    #: then retried on another GPU (``zone_agent.proxy``: a black-holed GPU).
    first_byte_floor_s: float = Field(default=5.0, gt=0.0)
    first_byte_ttft_factor: float = Field(default=4.0, ge=1.0)
    #: Attempts per request, on distinct GPUs, before the first byte (ARCHITECTURE §6).
    max_attempts: int = Field(default=3, ge=1, le=3)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    #: Header/body/JSON-depth limits, slow-client timeouts, per-client concurrency.
    limits: HttpLimits = HttpLimits()
    #: Which server answers the OpenAI endpoints (``--http-server``): the lean one
    #: (gtm.http1), aiohttp's answering the rest; or aiohttp's for everything.
    http_server: HttpServerKind = HttpServerKind.LEAN
    #: How long a ``/v1/assign`` decision is charged to its GPU (the bytes go elsewhere,
    #: so the agent never sees the request end): until scrapes have caught up.
    assign_hold_s: float = Field(default=1.0, ge=0.0)
    #: Survivors whose scores go into a returned trace.
    trace_top: int = Field(default=16, ge=0)
    #: Keep-alive connections per worker in the proxy's pool.
    pool_per_worker: int = Field(default=256, ge=1)
    #: Where the workers' own API keys are read (zone_agent.credentials).
    worker_keys: WorkerKeyConfig = WorkerKeyConfig()
    #: Read the workers' vLLM KV events (``--kv-events``): what each GPU cached and
    #: evicted corrects the agent's prefix index. None: the agent's own record alone.
    kv_events: KVEventsSource | None = None
    #: The zone's flow control (``--admission slo``, zone_agent.flow): requests wait in
    #: the agent while no GPU can take them within the SLO. Off by default.
    admission: AdmissionSettings = AdmissionSettings()
