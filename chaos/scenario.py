"""Game-day scenario files: YAML in the spirit of a Chaos Toolkit experiment.

::

    title: Region blackout
    description: ...
    tags: [fast]
    deployment: {topology: topologies/two-eu.yaml, speedup: 20, etcd_members: 1}
    load: {trace: azure-conv, rate_scale: 2, duration_s: 40, streams: [...]}
    dns: {names: [api.inference.example.]}
    hypothesis:            # the steady-state probes with their tolerances
      - {probe: success_rate, window: before, min: 0.99}
      - {probe: failover_time, step: blackout, max_s: 3}
    method:                # fault injections on the load's timeline
      - {id: blackout, at_s: 10, duration_s: 15, fault: {kind: kill, tier: regional/eu-west}}

Every fault of ``method`` is rolled back — at the end of its ``duration_s``, else when
the method ends, and always on an error or Ctrl-C (Chaos Toolkit's ``rollbacks`` with
strategy ``always``). Probes whose window is ``before`` are the gate: if they fail,
no fault is injected and the run is *aborted*.

Loading is strict (``extra="forbid"``, :func:`gtm.models.Frozen`); every error names the
file and the field path, and the CLI exits 2 on it.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from chaos.faults import FaultSpec
from chaos.mutants import MUTANTS
from chaos.probes import FailoverTime, FaultRefused, Probe, RefusalCodes, RegionShare
from chaos.traffic import DnsSpec, LoadSpec, Multiplier
from gtm.errors import ConfigError
from gtm.models import Frozen
from gtmctl.up.control import LinkKind

#: A scenario file larger than this is refused before parsing (policies' own limit
#: reasoning: YAML bombs and mistakes, not legitimate files, get this large).
MAX_SCENARIO_BYTES = 1_000_000

#: Tag of the scenarios ``make test`` runs (short, high speedup).
FAST_TAG = "fast"


class DeploymentSpec(Frozen):
    """What ``gtm up --processes`` to launch (ignored with ``--attach``)."""

    #: A topology YAML, relative to the scenario file (default: gtm up's example).
    topology: Path | None = None
    speedup: float = Field(default=20.0, gt=0.0, le=1000.0)
    etcd_members: Literal[1, 3] = 1
    #: Inter-tier links routed through the fault proxy (partition/latency faults).
    chaos_links: tuple[LinkKind, ...] = ()
    ready_timeout_s: float = Field(default=120.0, gt=0.0, le=3600.0)
    scrape_interval_s: float = Field(default=0.25, gt=0.0, le=10.0)


class Step(Frozen):
    """One change on the timeline, at ``at_s`` after the load starts, undone
    ``duration_s`` later (or when the method ends): a ``fault`` (the
    :data:`chaos.faults.FaultSpec` union), or a ``load_factor`` — arrivals that many
    times faster for the step's duration (flash crowd, overload)."""

    id: str = Field(default="", max_length=40, pattern=r"^[a-z0-9-]*$")
    at_s: float = Field(ge=0.0)
    duration_s: float | None = Field(default=None, gt=0.0)
    fault: FaultSpec | None = None
    load_factor: float | None = Field(default=None, gt=0.0, le=100.0)

    @model_validator(mode="after")
    def _one(self) -> Step:
        if (self.fault is None) == (self.load_factor is None):
            raise ValueError("a step has exactly one of fault, load_factor")
        if self.load_factor is not None and self.duration_s is None:
            raise ValueError("a load_factor step needs duration_s")
        return self

    @property
    def kind(self) -> str:
        return self.fault.kind if self.fault is not None else "load"

    def spec_json(self) -> dict[str, Any]:
        """The step's replayable spec (the fault's fields, or the load factor)."""
        if self.fault is not None:
            return self.fault.model_dump(mode="json")
        return {"load_factor": self.load_factor}


class Scenario(Frozen):
    title: str = Field(min_length=1, max_length=200)
    description: str = ""
    tags: tuple[str, ...] = ()
    deployment: DeploymentSpec = DeploymentSpec()
    load: LoadSpec
    dns: DnsSpec = DnsSpec()
    hypothesis: tuple[Probe, ...] = Field(min_length=1)
    method: tuple[Step, ...] = Field(min_length=1)
    #: The mutants (:mod:`chaos.mutants`) under which this scenario must FAIL: the
    #: breakages of the behaviour its title claims (``gtm chaos mutants``).
    mutants: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        ids = [s.id for s in self.steps()]
        if len(set(ids)) != len(ids):
            raise ValueError(f"method step ids must be unique, got {ids}")
        for probe in self.hypothesis:
            named: tuple[str, ...] = ()
            if isinstance(probe, FaultRefused):
                named = probe.steps
            elif isinstance(probe, FailoverTime | RegionShare) and probe.step is not None:
                named = (probe.step,)
            elif isinstance(probe, RefusalCodes):
                named = probe.cut_by
            for step in named:
                if step not in ids:
                    raise ValueError(f"{probe.probe} names step {step!r}; the method has {ids}")
        unknown = [m for m in self.mutants if m not in MUTANTS]
        if unknown:
            raise ValueError(f"unknown mutants {unknown}; known: {', '.join(sorted(MUTANTS))}")
        if len(set(self.mutants)) != len(self.mutants):
            raise ValueError(f"mutants must be unique, got {list(self.mutants)}")
        streams = {s.label for s in self.load.streams}
        for probe in self.hypothesis:
            if probe.stream is not None and probe.stream not in streams:
                raise ValueError(
                    f"probe {probe.probe} names stream {probe.stream!r}; the load has "
                    f"{sorted(streams)}"
                )
        surges = [(s.at_s, s.at_s + (s.duration_s or 0.0)) for s in self.method if s.load_factor]
        if surges and self.load.multipliers:
            raise ValueError("use load_factor steps or load.multipliers, not both")
        for (a0, a1), (b0, _b1) in itertools.pairwise(sorted(surges)):
            if b0 < a1:
                raise ValueError(f"load_factor steps overlap ({a0:g}–{a1:g} s and {b0:g} s)")
        last = max(s.at_s + (s.duration_s or 0.0) for s in self.method)
        if last >= self.load.duration_s:
            raise ValueError(
                f"the method runs until {last:g} s but the load stops at "
                f"{self.load.duration_s:g} s: faults must happen under load"
            )
        return self

    def effective_load(self) -> LoadSpec:
        """The load with the ``load_factor`` steps as rate multipliers."""
        surges = sorted((s for s in self.method if s.load_factor), key=lambda s: s.at_s)
        if not surges:
            return self.load
        multipliers: list[Multiplier] = []
        for step in surges:
            assert step.load_factor is not None
            assert step.duration_s is not None
            multipliers.append(Multiplier(at_s=step.at_s, factor=step.load_factor))
            multipliers.append(Multiplier(at_s=step.at_s + step.duration_s, factor=1.0))
        return self.load.model_copy(update={"multipliers": tuple(multipliers)})

    def steps(self) -> tuple[Step, ...]:
        """The method with every step named (``step-N`` when the file names none)."""
        return tuple(
            s if s.id else s.model_copy(update={"id": f"step-{i + 1}"})
            for i, s in enumerate(self.method)
        )

    @property
    def fast(self) -> bool:
        return FAST_TAG in self.tags


class ScenarioError(ConfigError):
    """A scenario file is unreadable or invalid; the message names file and field."""


def _field_path(location: tuple[int | str, ...]) -> str:
    path = ""
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(top level)"


def load_scenario(path: Path) -> tuple[Scenario, Path | None]:
    """Read and validate ``path``; the topology (if any) resolved against its folder."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"{path}: {len(raw)} bytes, more than {MAX_SCENARIO_BYTES}")
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: expected a mapping (title, load, hypothesis, method)")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"  {_field_path(tuple(e['loc']))}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors(include_url=False)
        ]
        raise ScenarioError(f"{path}: invalid scenario:\n" + "\n".join(problems)) from None
    scenario = _resolve_paths(scenario, path.parent)
    topology = scenario.deployment.topology
    if topology is not None and not topology.is_absolute():
        topology = path.parent / topology
    if topology is not None and not topology.is_file():
        raise ScenarioError(f"{path}: deployment.topology: no file {topology}")
    return scenario, topology


def _resolve_paths(scenario: Scenario, folder: Path) -> Scenario:
    """Relative file paths in fault specs (``policy-push``'s ``paths``) are relative to
    the scenario file, so a suite runs from any directory."""
    method = []
    for step in scenario.method:
        paths = getattr(step.fault, "paths", None)
        if step.fault is not None and isinstance(paths, tuple):
            resolved = tuple(p if p.is_absolute() else folder / p for p in paths)
            step = step.model_copy(
                update={"fault": step.fault.model_copy(update={"paths": resolved})}
            )
        method.append(step)
    return scenario.model_copy(update={"method": tuple(method)})
