"""``gtm zone``: run one zone's agent until SIGINT/SIGTERM."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from pydantic import ValidationError

from gtm import native
from gtm.access import access_log_option
from gtm.cli_types import HostPort, StateURL
from gtm.clock import SystemClock
from gtm.envvars import from_environment
from gtm.errors import ConfigError, GtmError
from gtm.logs import announce
from gtm.metrics import new_registry
from gtm.net import split_host_port
from gtm.profile_files import operator_catalog
from gtm.serve import HttpServerKind, settle_collector, until_signalled
from gtm.state.store import StateStore
from gtm.tls import TlsConfig, click_options, config_from_options, material
from gtm.tracing import OFF, Tracing, open_tracing, trace_options
from zone_agent.app import ZoneAgent
from zone_agent.config import DEFAULT_KV_EVENTS, KVEventsSource, ZoneConfig, parse_worker
from zone_agent.credentials import WorkerKeyConfig
from zone_agent.flow import AdmissionMode, AdmissionSettings, QueueOrder
from zone_agent.loop import LoopKind, run
from zone_agent.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE


@from_environment
@click.command("zone", context_settings={"help_option_names": ["-h", "--help"]})
@access_log_option()
@trace_options()
@click.option("--zone", "zone", required=True, help="Zone id (e.g. eu-west-a).")
@click.option("--region", required=True, help="Region id (e.g. eu-west).")
@click.option(
    "--state",
    type=StateURL(),
    default=None,
    help="State store: memory or etcd://HOST:PORT[,...] (workers registered for this zone "
    "are discovered there; the zone summary is published there).",
)
@click.option(
    "--listen",
    type=HostPort(example="127.0.0.1:8100"),
    default="127.0.0.1:8100",
    show_default=True,
    help="HOST:PORT to listen on.",
)
@click.option(
    "--worker",
    "workers",
    multiple=True,
    help="A worker: URL[,gpu=TYPE][,id=ID][,model=NAME][,label:KEY=VALUE] (repeatable).",
)
@click.option(
    "--profile",
    type=click.Choice(list(BUILTIN_PROFILES)),
    default=DEFAULT_PROFILE,
    show_default=True,
    help="Routing profile: the default, goodput (concentrates lateness under overload: "
    "more requests within the TTFT SLO, a longer tail), or a baseline for comparisons.",
)
@click.option(
    "--gpu-profiles",
    "--profiles",
    "gpu_profiles",
    type=click.Path(exists=True, path_type=Path),
    multiple=True,
    help="GPU performance profiles (a YAML file, or a directory of them; repeatable), over "
    "the shipped ones: one document per GPU type × model (format: see the zone agent's "
    "README). A worker whose pair has none is priced conservatively, logged, and "
    "calibrated from its own metrics (gtm_zone_profile_source).",
)
@click.option(
    "--no-affinity",
    is_flag=True,
    help="No stickiness: a conversation's GPU is chosen by the profile alone, not kept on "
    "the GPU that answered its prefix (for side-by-side comparisons).",
)
@click.option(
    "--admission",
    type=click.Choice([m.value for m in AdmissionMode]),
    default=AdmissionMode.OFF.value,
    show_default=True,
    help="Flow control: slo holds a request in the agent while no GPU can take it without "
    "a queue over --admission-queue-ms or breaking the TPOT SLO of requests decoding "
    "there (or, when it can meet its SLO somewhere, where it can), and sends the "
    "shortest first as room appears (goodput under bursts); off sends every request at "
    "once.",
)
@click.option(
    "--admission-queue-ms",
    type=click.FloatRange(min=0.0, min_open=True),
    default=AdmissionSettings().queue_budget_ms,
    show_default=True,
    help="With --admission slo: the longest predicted queue (ms of GPU time) a request "
    "is sent into.",
)
@click.option(
    "--ttft-slo-ms",
    type=click.FloatRange(min=0.0, min_open=True),
    default=AdmissionSettings().ttft_slo_ms,
    show_default=True,
    help="With --admission slo: the SLO's TTFT bound (a request that can meet the SLO "
    "on some GPU waits for room there; one predicted later when it is sent gets no TPOT "
    "protection).",
)
@click.option(
    "--tpot-slo-ms",
    type=click.FloatRange(min=0.0, min_open=True),
    default=AdmissionSettings().tpot_slo_ms,
    show_default=True,
    help="With --admission slo: the SLO's time per output token, ms.",
)
@click.option(
    "--admission-max-wait",
    type=click.FloatRange(min=0.0, min_open=True),
    default=AdmissionSettings().max_wait_s,
    show_default=True,
    help="With --admission slo: the longest a request waits in the agent, s; then it goes "
    "where the profile says.",
)
@click.option(
    "--admission-max-waiting",
    type=click.IntRange(min=1),
    default=AdmissionSettings().max_waiting,
    show_default=True,
    help="With --admission slo: the most requests waiting at once; more get a 503 with "
    "Retry-After.",
)
@click.option(
    "--admission-order",
    type=click.Choice([o.value for o in QueueOrder]),
    default=AdmissionSettings().order.value,
    show_default=True,
    help="With --admission slo: which waiting request goes first.",
)
@click.option(
    "--admission-rescrape",
    type=click.FloatRange(min=0.0, min_open=True),
    default=AdmissionSettings().rescrape_s,
    show_default=True,
    help="With --admission slo: while requests are held on other clients' queued work "
    "seen in the last scrape, scrape the workers where it was seen again after this "
    "long, s (not at the next --scrape-interval): that work may be done.",
)
@click.option(
    "--scrape-interval",
    type=click.FloatRange(min=0.0, min_open=True),
    default=0.25,
    show_default=True,
    help="Seconds between scrapes of every worker; a round's view is rebuilt once all "
    "answered or this long after it began (a silent worker's scrape goes on alone).",
)
@click.option(
    "--upstream-timeout",
    type=click.FloatRange(min=0.0, min_open=True),
    default=300.0,
    show_default=True,
    help="Longest wait for a byte from a worker, s (checked every tenth of it, at most "
    "every second: a wait may end that much later).",
)
@click.option(
    "--event-loop",
    type=click.Choice([k.value for k in LoopKind]),
    default=LoopKind.AUTO.value,
    show_default=True,
    help="Event loop: uvloop (faster proxying), asyncio's own, or auto (uvloop when installed).",
)
@click.option(
    "--http-server",
    type=click.Choice([k.value for k in HttpServerKind]),
    default=HttpServerKind.LEAN.value,
    show_default=True,
    help="The server of the OpenAI endpoints: lean (a bare HTTP/1.1 server for them, "
    "aiohttp's for every other request and anything it does not serve, counted in "
    "gtm_http_fallbacks_total) or aiohttp (aiohttp's for everything).",
)
@click.option(
    "--worker-api-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Send every worker 'Authorization: Bearer <key>' with the key in this file (a "
    "vLLM's --api-key; a Kubernetes Secret mounted as a file); re-read when it changes. "
    "Clients' own credentials are never passed on to a worker.",
)
@click.option(
    "--worker-api-key-env",
    default=None,
    metavar="NAME",
    help="As --worker-api-key-file, the key read from environment variable NAME.",
)
@click.option(
    "--worker-api-key-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Per-worker keys: the file named by a worker's id in this directory (or the one "
    "its record's api-key-from=file:NAME label names) wins over the zone's key.",
)
@click.option(
    "--kv-events",
    "kv_events",
    is_flag=False,
    flag_value=DEFAULT_KV_EVENTS,
    default=None,
    metavar="PATTERN",
    help="Read each worker's vLLM KV events (its --kv-events-config publisher): what a GPU "
    "cached and evicted corrects the prefix placement. PATTERN names the endpoint, {host} "
    f"and {{port}} the worker URL's (alone: {DEFAULT_KV_EVENTS}); a worker's label "
    "kv-events=tcp://HOST:PORT wins.",
)
@click.option(
    "--kv-events-replay",
    default=None,
    metavar="PATTERN",
    help="The workers' KV-event replay endpoints (vLLM's replay_endpoint), asked on a "
    "sequence gap, e.g. tcp://{host}:5558; a worker's label kv-events-replay wins.",
)
@click.option(
    "--kv-events-tokenizer",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="The served model's tokenizer.json (or its directory, with tokenizer_config.json "
    "for the chat template), so prompts are tokenized as vLLM does and its KV events "
    "match; without it, the emulator's tokenization (gtm gpu-sim). Needs the "
    "kv-events-tokenizer extra.",
)
@click.option(
    "--kv-events-topic",
    default="",
    help="The KV-event topic the workers publish (vLLM's topic; default: every topic).",
)
@click_options("zone")
@click.option(
    "--tls-plain-workers",
    is_flag=True,
    help="With TLS on: still dial http:// workers in the clear (a vLLM without TLS); "
    "https:// workers get mutual TLS either way.",
)
def zone(
    zone: str,
    region: str,
    state: str | None,
    listen: str,
    workers: tuple[str, ...],
    profile: str,
    gpu_profiles: tuple[Path, ...],
    scrape_interval: float,
    upstream_timeout: float,
    tls_plain_workers: bool,
    event_loop: str,
    http_server: str = HttpServerKind.LEAN.value,
    no_affinity: bool = False,
    worker_api_key_file: Path | None = None,
    worker_api_key_env: str | None = None,
    worker_api_key_dir: Path | None = None,
    kv_events: str | None = None,
    kv_events_replay: str | None = None,
    kv_events_topic: str = "",
    kv_events_tokenizer: Path | None = None,
    admission: str = AdmissionMode.OFF.value,
    admission_queue_ms: float = AdmissionSettings().queue_budget_ms,
    ttft_slo_ms: float = AdmissionSettings().ttft_slo_ms,
    tpot_slo_ms: float = AdmissionSettings().tpot_slo_ms,
    admission_max_wait: float = AdmissionSettings().max_wait_s,
    admission_max_waiting: int = AdmissionSettings().max_waiting,
    admission_order: str = AdmissionSettings().order.value,
    admission_rescrape: float = AdmissionSettings().rescrape_s,
    trace_exporter: str = "none",
    trace_file: str | None = None,
    **tls_options: object,
) -> None:
    """Run one zone's agent: choose a GPU for each request by predicted TTFT and proxy it."""
    try:
        host, port = split_host_port(listen, example="127.0.0.1:8100")
        tls = config_from_options(tls_options)
        config = ZoneConfig(
            zone=zone,
            region=region,
            host=host,
            port=port,
            workers=tuple(parse_worker(w) for w in workers),
            profile=profile,
            gpu_profiles=gpu_profiles,
            affinity=not no_affinity,
            scrape_interval_s=scrape_interval,
            upstream_timeout_s=upstream_timeout,
            http_server=HttpServerKind(http_server),
            worker_keys=_worker_keys(worker_api_key_file, worker_api_key_env, worker_api_key_dir),
            kv_events=_kv_events_source(
                kv_events, kv_events_replay, kv_events_topic, kv_events_tokenizer
            ),
            admission=AdmissionSettings(
                mode=AdmissionMode(admission),
                queue_budget_ms=admission_queue_ms,
                ttft_slo_ms=ttft_slo_ms,
                tpot_slo_ms=tpot_slo_ms,
                max_wait_s=admission_max_wait,
                max_waiting=admission_max_waiting,
                order=QueueOrder(admission_order),
                rescrape_s=admission_rescrape,
            ),
        )
        operator_catalog(config.gpu_profiles)  # a bad profile file stops us here, by name
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "options"
        raise click.UsageError(f"{where}: {first['msg']}") from None
    except GtmError as exc:
        raise click.UsageError(str(exc)) from None
    native.warn_if_not_compiled(
        "zone_agent.costs._ttft",
        "zone_agent.costs._blend",
        "zone_agent._prefix",
        "zone_agent._exposition",
        "gtm._tokens",
        "gtm._logline",
    )
    try:
        tracing = open_tracing(
            trace_exporter,
            service="gtm-zone",
            file=trace_file,
            attributes={"gtm.region": region, "gtm.zone": zone},
        )
        try:
            run(
                serve(config, state, tls, plain_workers=tls_plain_workers, tracing=tracing),
                LoopKind(event_loop),
            )
        finally:
            tracing.shutdown()
    except GtmError as exc:
        click.echo(f"gtm zone: {exc}", err=True)
        sys.exit(2)


def _kv_events_source(
    endpoint: str | None, replay: str | None, topic: str, tokenizer: Path | None
) -> KVEventsSource | None:
    """``--kv-events*`` as one source, or None without ``--kv-events``; a bad pattern is
    a usage error naming the flag."""
    if endpoint is None:
        return None
    try:
        return KVEventsSource(endpoint=endpoint, replay=replay, topic=topic, tokenizer=tokenizer)
    except ValidationError as exc:
        first = exc.errors()[0]
        reason = first.get("ctx", {}).get("error", first["msg"])
        raise click.UsageError(f"--kv-events: {reason}") from None


def _worker_keys(file: Path | None, env: str | None, directory: Path | None) -> WorkerKeyConfig:
    try:
        return WorkerKeyConfig(file=file, env=env, directory=directory)
    except ValidationError as exc:
        detail = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ConfigError(f"--worker-api-key-file/-env/-dir: {detail}") from None


async def serve(
    config: ZoneConfig,
    state: str | None,
    tls: TlsConfig | None = None,
    *,
    plain_workers: bool = False,
    tracing: Tracing = OFF,
) -> None:
    """Run the agent until SIGINT or SIGTERM, then stop cleanly."""
    clock = SystemClock()
    registry = new_registry()
    tls_material = material(tls, clock=clock, registry=registry)
    store: StateStore | None = None
    if state:
        from gtm.state.url import open_store

        store = open_store(state, clock=clock, registry=registry)
    agent = ZoneAgent(
        config,
        registry=registry,
        clock=clock,
        store=store,
        tls=tls_material,
        plain_workers=plain_workers,
        tracing=tracing,
    )
    try:
        url = await agent.start()
        settle_collector()
        announce(
            f"zone agent {config.region}/{config.zone} listening on {url} "
            f"(profile={config.profile}, gpus={len(agent.view.gpus)}, "
            f"http-server={config.http_server})"
        )
        sys.stdout.flush()
        await until_signalled()
    finally:
        await agent.stop()
        if store is not None:
            await store.aclose()
