"""What ``gtm up`` prints once the deployment answers: where everything listens, the
demo API keys and three examples to copy and paste (dig, curl, the Python SDK)."""

from __future__ import annotations

import importlib.util
import json
import shlex
from dataclasses import dataclass

from gtm.topology import Deployment
from gtmctl.up.config import HostPort
from gtmctl.up.fleet import DNS_ZONE
from gtmctl.up.tls import https
from policies import ApiKeyError, PolicySet, TenantDirectory

#: The demo keys of ``policies/examples/tenants.yaml`` (fixed, documented values: local
#: demos only). Printed only when the policies in force accept them.
DEMO_KEYS: tuple[tuple[str, str], ...] = (
    ("gtm-demo-global", "no residency restriction of its own"),
    ("gtm-demo-eu", "EU-resident: served in EU regions only, from anywhere"),
    ("gtm-load-test", "gtm load's tenant: no quotas (gtm/data/load-tenant.yaml)"),
)

#: A London client network (MaxMind's test data and real GeoLite2 agree on 81.2.69.0/24).
EXAMPLE_SUBNET = "81.2.69.0/24"
EXAMPLE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(frozen=True, slots=True)
class Listeners:
    dns: HostPort
    http: HostPort
    status_url: str
    mode: str
    state: str
    ready_s: float
    run_dir: str
    #: Where gtm up --tls keeps its CA and certificates (empty without --tls).
    tls: tuple[str, ...] = ()


def demo_keys(policy_set: PolicySet) -> list[tuple[str, str, str]]:
    """(key, tenant id, description) of the demo keys the policies accept."""
    directory = TenantDirectory(policy_set.tenants)
    found = []
    for key, description in DEMO_KEYS:
        try:
            tenant = directory.authenticate(key)
        except ApiKeyError:
            continue
        found.append((key, tenant.id, description))
    return found


def _model(deployment: Deployment) -> str:
    served = {m for g in deployment.gpus for m in g.models}
    if EXAMPLE_MODEL in served:
        return EXAMPLE_MODEL
    return sorted(served)[0]


def render(listeners: Listeners, deployment: Deployment, keys: list[tuple[str, str, str]]) -> str:
    """The banner (plain text, ~40 lines)."""
    dns, http = listeners.dns, listeners.http
    gpus = len(deployment.gpus)
    lines = [
        f"gtm up: {len(deployment.regions)} regions, {len(deployment.zones)} zones, "
        f"{gpus} emulated GPUs ready in {listeners.ready_s:.1f} s "
        f"({listeners.mode}, state {listeners.state})",
        "",
        f"  {'DNS (UDP+TCP)':<22}{dns}  zone {DNS_ZONE}",
        f"  {'front door (OpenAI)':<22}{http.url}/v1",
        f"  {'status page':<22}{listeners.status_url}",
    ]
    for region in deployment.regions:
        zones = ", ".join(f"{z.id} :{z.port}" for z in region.zones)
        types = "+".join(g.gpu_type for z in region.zones for g in z.gpus)
        url = https(region.url) if listeners.tls else region.url
        lines.append(f"  {'region ' + region.id:<22}{url}  zones {zones}  GPUs {types}")
    if deployment.undeployed:
        lines.append(f"  not deployed (policy regions): {', '.join(deployment.undeployed)}")
    lines.append(f"  logs, audit trail      {listeners.run_dir}")
    lines += listeners.tls
    if keys:
        lines += ["", "Demo API keys (local demos only):"]
        lines += [f"  {key:<18} tenant {tenant}: {why}" for key, tenant, why in keys]
    key = keys[0][0] if keys else "<your API key>"
    lines += ["", "Try:", *examples(dns, http, key, _model(deployment))]
    lines += ["", "Ctrl-C stops everything."]
    return "\n".join(lines)


def examples(dns: HostPort, http: HostPort, key: str, model: str) -> list[str]:
    """The three copy-paste examples: dig with ECS, curl, Python openai (streaming)."""
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "Hello from London!"}]}
    )
    python = [
        "  python - <<'EOF'",
        "  from openai import OpenAI",
        f'  client = OpenAI(base_url="{http.url}/v1", api_key="{key}")',
        "  raw = client.chat.completions.with_raw_response.create(",
        f'      model="{model}", stream=True,',
        '      messages=[{"role": "user", "content": "Tell me about routing."}])',
        '  where = ("x-gtm-region", "x-gtm-zone", "x-gtm-gpu")',
        '  print("served by", *(raw.headers[h] for h in where))',
        "  for chunk in raw.parse():",
        '      print(chunk.choices[0].delta.content or "" if chunk.choices else "", end="")',
        "  print()",
        "  EOF",
    ]
    if importlib.util.find_spec("openai") is None:
        python.insert(0, "  # needs the OpenAI SDK: pip install openai")
    return [
        f"  # 1. GeoDNS: a London client (EDNS Client Subnet {EXAMPLE_SUBNET}) gets an EU region",
        f"  dig @{dns.host} -p {dns.port} api.{DNS_ZONE.rstrip('.')} A +subnet={EXAMPLE_SUBNET}",
        "  # 2. a completion through the front door (see the x-gtm-region/zone/gpu headers)",
        f"  curl -si {http.url}/v1/chat/completions -H 'Authorization: Bearer {key}' \\",
        f"       -H 'Content-Type: application/json' -d {shlex.quote(body)}",
        "  # 3. the OpenAI Python SDK, streaming",
        *python,
    ]
