"""``gtm gpu-sim``: run one emulated GPU worker until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import click
from pydantic import ValidationError

from gpusim.auth import API_KEY_ENV, WorkerAuth, WorkerAuthConfig
from gpusim.auth import api_keys as worker_api_keys
from gpusim.lagprobe import PROBE_INTERVAL_S
from gpusim.metrics import MetricsFlavor
from gpusim.perfmodel import WARMUP_PASSES
from gpusim.registration import DEFAULT_LEASE_TTL_S
from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.admin_auth import AdminGuard, check_admin_bind
from gtm.cli_types import PORT, Host, HttpURL, StateURL, existing_file
from gtm.clock import SystemClock
from gtm.envvars import from_environment
from gtm.errors import GtmError
from gtm.gpu_profiles import LLAMA_8B, gpu_types, model_names
from gtm.logs import announce
from gtm.metrics import new_registry
from gtm.serve import settle_collector, until_signalled
from gtm.state.store import StateStore
from gtm.tls import TlsConfig, click_options, config_from_options, material

#: Config fields whose flag is not the field's name in kebab case.
_FLAG_OF = {
    "lease_ttl_s": "--lease-ttl",
    "lag_probe_interval_s": "--lag-probe-interval",
    "kv_events": "--kv-events-config",
}


@from_environment
@click.command("gpu-sim", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--host", type=Host(), default="127.0.0.1", show_default=True, help="Address to listen on."
)
@click.option("--port", type=PORT, default=8000, show_default=True, help="Port (0: any free port).")
@click.option(
    "--gpu-type",
    default="A100-80GB",
    show_default=True,
    help=f"GPU type to declare, and whose profile to emulate unless --emulate names "
    f"another: {', '.join(gpu_types())}.",
)
@click.option(
    "--emulate",
    default=None,
    metavar="GPU_TYPE",
    help="Run this GPU type's profile while declaring --gpu-type (which may then be a type "
    "gtm has no profile of): e.g. --gpu-type X1 --emulate H100.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    default=(LLAMA_8B,),
    show_default=True,
    help=f"Model to serve (repeatable): {', '.join(model_names())}.",
)
@click.option(
    "--speedup", type=float, default=1.0, show_default=True, help="Run N× faster than a real GPU."
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of generated text and faults."
)
@click.option(
    "--metrics-flavor",
    type=click.Choice([f.value for f in MetricsFlavor]),
    default=MetricsFlavor.VLLM.value,
    show_default=True,
    help="Metric names to expose on /metrics: those of vLLM, SGLang, TGI, TensorRT-LLM "
    "in Triton, llama.cpp's server or a Dynamo frontend.",
)
@click.option(
    "--max-queue", type=int, default=1024, show_default=True, help="Waiting requests before 429."
)
@click.option(
    "--cold-start/--no-cold-start", default=False, show_default=True, help="Start unloaded."
)
@click.option(
    "--warmup-passes", type=int, default=WARMUP_PASSES, show_default=True, help="Slow first passes."
)
@click.option("--max-num-seqs", type=int, default=None, help="Override the profile's batch size.")
@click.option("--num-gpu-blocks", type=int, default=None, help="Override the profile's KV blocks.")
@click.option(
    "--step-jitter", type=float, default=0.0, show_default=True, help="Relative pass-time noise."
)
@click.option(
    "--state",
    type=StateURL(),
    default=None,
    help="Register in this store: etcd://HOST:PORT[,...] or memory.",
)
@click.option("--region", default="local", show_default=True, help="Region id for registration.")
@click.option("--zone", default="local-a", show_default=True, help="Zone id for registration.")
@click.option("--worker-id", default=None, help="Worker id (default: sim-<gpu>-<port>).")
@click.option(
    "--advertise-url",
    type=HttpURL(),
    default=None,
    help="URL to register (default: the listen URL).",
)
@click.option(
    "--lease-ttl", type=float, default=DEFAULT_LEASE_TTL_S, show_default=True, help="Lease TTL, s."
)
@click.option(
    "--lag-probe-interval",
    "lag_probe_interval_s",
    type=float,
    default=PROBE_INTERVAL_S,
    show_default=True,
    help="Seconds between the event-loop lag probe's wake-ups (/admin/lag); shorter sees "
    "shorter stalls and costs more CPU.",
)
@click.option(
    "--kv-events-config",
    "kv_events",
    default=None,
    metavar="JSON",
    help="Publish KV-cache events as vLLM does: its --kv-events-config JSON (fields "
    "enable_kv_cache_events, publisher, endpoint, replay_endpoint, topic, buffer_steps, hwm, "
    "max_queue_size); gtm adds encoding: map (current vLLM, the default) or array "
    "(vLLM <= 0.23).",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    help=f"As vLLM's --api-key (repeatable; else vLLM's {API_KEY_ENV} variable): /v1/* needs "
    "the header Authorization: Bearer KEY, else a 401 as vLLM's; /health and /metrics "
    "stay open.",
)
@click.option(
    "--access-log-file",
    default=None,
    metavar="PATH",
    help="Append an access line per request to this file (uvicorn's format; - for stderr).",
)
@click.option(
    "--access-log-headers",
    is_flag=True,
    help="Debugging only: put every request header, value included, on its access line "
    "(the worker's own key is masked), so a credential that reaches a worker shows.",
)
@click.option(
    "--admin-token-file",
    type=existing_file(as_path=True),
    default=None,
    help="Require bearer tokens from this file on /admin/* (see `gtm admin token create`). "
    "Without it, only loopback clients may use /admin/*.",
)
@click.option(
    "--admin-audit-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Append every admin call to a hash-chained audit log here (`gtm audit verify`).",
)
@click.option(
    "--allow-remote-admin",
    is_flag=True,
    help="Allow a non-loopback --host; needs --admin-token-file as well.",
)
@click_options("gpu")
def gpu_sim(
    api_keys: tuple[str, ...],
    access_log_file: str | None,
    access_log_headers: bool,
    admin_token_file: Path | None,
    admin_audit_dir: Path | None,
    allow_remote_admin: bool,
    **options: object,
) -> None:
    """Run an emulated vLLM-compatible GPU worker (OpenAI API, vLLM metrics, faults)."""
    try:
        check_admin_bind(
            str(options["host"]), allow_remote=allow_remote_admin, token_file=admin_token_file
        )
    except GtmError as exc:
        raise click.UsageError(f"--host: {exc}") from None
    options["lease_ttl_s"] = options.pop("lease_ttl")
    if options["kv_events"] is not None:
        try:
            options["kv_events"] = json.loads(str(options["kv_events"]))
        except ValueError as exc:
            raise click.UsageError(f"--kv-events-config: not JSON: {exc}") from None
    try:
        tls = config_from_options(
            {k: options.pop(k) for k in ("tls_ca", "tls_cert", "tls_key", "tls_client")}
        )
    except GtmError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        config = GpuSimConfig.model_validate(options)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        where = _FLAG_OF.get(field, "--" + field.replace("_", "-")) if field else "options"
        raise click.UsageError(f"{where}: {first['msg']}") from None
    try:
        admin = AdminGuard.from_options(
            token_file=admin_token_file, audit_dir=admin_audit_dir, clock=SystemClock()
        )
    except GtmError as exc:
        raise click.UsageError(str(exc)) from None
    auth = WorkerAuthConfig.model_validate(
        {
            "api_keys": worker_api_keys(api_keys, os.environ),
            "access_log": access_log_file,
            "access_log_headers": access_log_headers,
        }
    )
    try:
        asyncio.run(serve(config, admin, tls, auth))
    except GtmError as exc:
        click.echo(f"gtm gpu-sim: {exc}", err=True)
        sys.exit(2)


async def serve(
    config: GpuSimConfig,
    admin: AdminGuard | None = None,
    tls: TlsConfig | None = None,
    auth: WorkerAuthConfig | None = None,
) -> None:
    """Run the worker until SIGINT or SIGTERM, then stop cleanly."""
    clock = SystemClock()
    registry = new_registry()
    tls_material = material(tls, clock=clock, registry=registry)
    store: StateStore | None = None
    if config.state:
        from gtm.state.url import open_store

        store = open_store(config.state, clock=clock, registry=registry)
    server: GpuSimServer | None = None
    try:
        server = GpuSimServer(
            config,
            registry=registry,
            clock=clock,
            store=store,
            admin=admin,
            tls=tls_material,
            auth=WorkerAuth(auth),
        )
        url = await server.start()
        settle_collector()
        models = ",".join(server.models)
        gpu = config.gpu_type + (f" emulating {config.emulate}" if config.emulate else "")
        announce(f"gpu-sim listening on {url} (gpu={gpu}, models={models})")
        sys.stdout.flush()
        await until_signalled()
    finally:
        if server is not None:
            await server.stop()
        if store is not None:
            await store.aclose()
        if admin is not None:
            admin.close()
