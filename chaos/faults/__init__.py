"""The fault library: one spec per ``kind``, each with ``inject(deployment) -> Injected``.

``FaultSpec`` is a pydantic discriminated union on ``kind`` (frozen, unknown fields
rejected); :func:`parse_fault` validates one from YAML/JSON-shaped data with an error
naming the field. Names (``region``, ``zone``, ``gpu``, ``tier``, link ``source`` and
``target``) are the deployment's own and are checked against it when the fault is
injected (:class:`~chaos.deployment.UnknownTarget` lists what exists).

================================  ======================================================
kind                              fields
================================  ======================================================
``kill``                          ``tier`` (global, regional/<r>, zone/<z>, gpu/<g>)
``pause``                         ``tier``
``etcd-kill-leader``              —
``etcd-stop``                     —
``etcd-compact``                  ``keep`` (revisions kept below the current, default 0)
``gpu-fault``                     ``gpu``, ``mode`` (crash, slow, throttle, black-hole,
                                  errors, latency, cut-stream), ``slowdown``,
                                  ``error_rate``, ``error_status``, ``latency_ms``,
                                  ``after_tokens``
``drain``                         one of ``region``, ``zone``, ``gpu``
``partition``                     ``source``, ``target`` (wildcards), ``mode``
                                  (black-hole, refuse)
``latency``                       ``source``, ``target``, ``latency_ms``, ``jitter_ms``,
                                  ``direction`` (upstream, downstream, both)
``all-health-checks-fail``        ``latency_ms`` (> the 1,000 ms probe timeout; default
                                  2000)
``policy-push``                   ``paths`` (policy files/directories)
================================  ======================================================
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from chaos.faults.base import FaultError, Injected, UnknownTarget
from chaos.faults.drain import DrainFault
from chaos.faults.etcd import EtcdCompactFault, EtcdKillLeaderFault, EtcdStopFault
from chaos.faults.gpu import GpuFault, GpuFaultMode
from chaos.faults.network import (
    AllHealthChecksFailFault,
    Direction,
    LatencyFault,
    PartitionFault,
    PartitionMode,
)
from chaos.faults.policy import PolicyPushFault, PolicyPushInjected
from chaos.faults.process import KillFault, PauseFault
from gtm.errors import ConfigError

FaultSpec = Annotated[
    KillFault
    | PauseFault
    | EtcdKillLeaderFault
    | EtcdStopFault
    | EtcdCompactFault
    | GpuFault
    | DrainFault
    | PartitionFault
    | LatencyFault
    | AllHealthChecksFailFault
    | PolicyPushFault,
    Field(discriminator="kind"),
]

FAULT_ADAPTER: TypeAdapter[FaultSpec] = TypeAdapter(FaultSpec)


def fault_kinds() -> tuple[str, ...]:
    """Every ``kind`` a spec may have."""
    members = FaultSpec.__origin__.__args__  # type: ignore[attr-defined]
    return tuple(m.model_fields["kind"].default for m in members)


def format_error(exc: ValidationError, where: str = "fault") -> str:
    """A pydantic error as one message per problem, each naming its field path."""
    lines = []
    for error in exc.errors():
        path = ".".join(str(p) for p in error["loc"])
        if error["type"] == "union_tag_invalid":
            got = error.get("input", {})
            kind = got.get("kind") if isinstance(got, dict) else None
            lines.append(
                f"{where}.kind: unknown kind {kind!r}; expected one of {', '.join(fault_kinds())}"
            )
            continue
        if error["type"] == "union_tag_not_found":
            lines.append(f"{where}.kind: missing; expected one of {', '.join(fault_kinds())}")
            continue
        # The first element of the location is the union member's tag: drop it.
        parts = path.split(".", 1)
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"{where}.{parts[1]}: {message}" if len(parts) == 2 else f"{where}: {message}")
    return "; ".join(lines)


def parse_fault(data: Any, where: str = "fault") -> FaultSpec:
    """Validate one fault spec; ConfigError naming ``where`` and the field when bad."""
    try:
        return FAULT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise ConfigError(format_error(exc, where)) from None


__all__ = [
    "FAULT_ADAPTER",
    "AllHealthChecksFailFault",
    "Direction",
    "DrainFault",
    "EtcdCompactFault",
    "EtcdKillLeaderFault",
    "EtcdStopFault",
    "FaultError",
    "FaultSpec",
    "GpuFault",
    "GpuFaultMode",
    "Injected",
    "KillFault",
    "LatencyFault",
    "PartitionFault",
    "PartitionMode",
    "PauseFault",
    "PolicyPushFault",
    "PolicyPushInjected",
    "UnknownTarget",
    "fault_kinds",
    "format_error",
    "parse_fault",
]
