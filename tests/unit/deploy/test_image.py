"""The container image's recipe (Containerfile, .containerignore), read without building
it (`make image` builds and smoke-tests it): both stages start from the local mmdebstrap
base, never a registry's image; the runtime stage installs no compiler and reads no index;
the image runs as the user the Kubernetes manifests run as, with `gtm` as its entrypoint
(the manifests give only a subcommand's arguments); and the build context holds every
package and file the wheel is built from."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).parents[3]
CONTAINERFILE = ROOT / "Containerfile"
IGNORE = ROOT / ".containerignore"
K8S_BASE = ROOT / "deploy" / "k8s" / "base"
GTM_IMAGE = "ghcr.io/gtm/gtm"
LOCAL_BASE = "localhost/gtm-base:bookworm"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in CONTAINERFILE.read_text("utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).strip().partition(" ")
        instructions.append((keyword.upper(), " ".join(arguments.split())))
        pending = ""
    assert not pending, "a continuation line ends the Containerfile"
    return instructions


def _stages() -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, arguments in _instructions():
        if keyword == "FROM":
            image, _, name = arguments.partition(" AS ")
            assert image == "${BASE}", f"stage {name} starts from {image}, not the local base"
            current = stages.setdefault(name, [])
        elif current is not None:
            current.append((keyword, arguments))
    return stages


def _last(stage: list[tuple[str, str]], keyword: str) -> str:
    values = [arguments for k, arguments in stage if k == keyword]
    assert values, keyword
    return values[-1]


def test_both_stages_start_from_the_local_mmdebstrap_base() -> None:
    assert ("ARG", f"BASE={LOCAL_BASE}") in _instructions()
    assert list(_stages()) == ["build", "runtime"]


def test_the_runtime_stage_installs_no_compiler_and_reads_no_index() -> None:
    runtime = " ".join(arguments for keyword, arguments in _stages()["runtime"])
    for word in ("apt-get", "gcc", "python3-dev", "build-essential"):
        assert word not in runtime
    assert "pip install -q --no-index --find-links /wheels" in runtime
    assert '"gtm-traffic-manager${EXTRAS:+[$EXTRAS]}"' in runtime
    # The wheels come in by a bind mount for one step, not a COPY that a layer would keep.
    assert "COPY" not in [keyword for keyword, _ in _stages()["runtime"]]
    assert "--mount=type=bind,from=build,source=/wheels,target=/wheels" in runtime


def test_the_runtime_install_is_rebuilt_when_the_source_changes() -> None:
    # The bind-mounted wheels are not part of the install step's cache key: without the
    # source's hash in it, a rebuild after a change reused the old install (an image of
    # old code, which passed the smoke test).
    runtime = _stages()["runtime"]
    install = next(i for i, (k, a) in enumerate(runtime) if k == "RUN" and "/wheels" in a)
    assert ("ARG", "SOURCE=unknown") in runtime[:install]
    assert "${SOURCE}" in runtime[install][1]
    assert 'gtm.source="${SOURCE}"' in _last(runtime, "LABEL")
    script = (ROOT / "scripts" / "build-image").read_text("utf-8")
    assert '--build-arg "SOURCE=$source"' in script
    # The smoke test reads the label back and counts the kernels gtm/native.py lists.
    assert '{{index .Labels "gtm.source"}}' in script
    assert "KERNEL_MODULES" in script


def _gtm_workloads() -> list[dict[str, Any]]:
    workloads = []
    for path in sorted(K8S_BASE.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text("utf-8")):
            if not isinstance(document, dict) or "template" not in document.get("spec", {}):
                continue
            containers = document["spec"]["template"]["spec"]["containers"]
            if any(c["image"].startswith(f"{GTM_IMAGE}:") for c in containers):
                workloads.append(document)
    return workloads


def test_the_image_runs_gtm_as_the_user_of_the_kubernetes_manifests() -> None:
    runtime = _stages()["runtime"]
    assert json.loads(_last(runtime, "ENTRYPOINT")) == ["gtm"]
    uid, _, gid = _last(runtime, "USER").partition(":")
    workloads = _gtm_workloads()
    assert len(workloads) >= 3, "the global, regional and zone tiers"
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == int(uid), workload["metadata"]["name"]
        assert pod["securityContext"]["runAsGroup"] == int(gid), workload["metadata"]["name"]
        for container in pod["containers"]:
            if container["image"].startswith(f"{GTM_IMAGE}:"):
                # The entrypoint runs gtm: a manifest names the subcommand in args.
                assert "command" not in container, container["name"]
                assert container["args"], container["name"]


def test_the_build_context_holds_what_the_wheel_is_built_from() -> None:
    lines = [line for line in IGNORE.read_text("utf-8").splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("#")]
    assert lines[0] == "*", "the context is an allowlist"
    included = {line[1:] for line in lines if line.startswith("!")}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {
        p.parent.name
        for p in ROOT.glob("*/__init__.py")
        if any(fnmatch.fnmatch(p.parent.name, pattern) for pattern in patterns)
    }
    assert packages >= {"gtm", "gtmctl", "global_lb", "regional_lb", "zone_agent"}
    files = {"pyproject.toml", "setup.py", project["project"]["readme"]}
    files |= set(project["project"]["license-files"])
    assert packages | files <= included
    # An editable install's compiled kernels stay out: the build stage compiles its own.
    assert "**/*.so" in lines


def test_the_default_extras_are_extras_of_the_distribution() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    default = [value for keyword, value in _instructions() if keyword == "ARG"]
    extras = next(v.partition("=")[2] for v in default if v.startswith("EXTRAS="))
    assert "otlp" in extras.split(","), "traces reach a collector from the image"
    assert set(extras.split(",")) <= set(project["project"]["optional-dependencies"])
