"""The toxics, one module each, and the registry that maps a ``type`` to its class."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from chaos.proxy.toxics.bandwidth import BandwidthToxic
from chaos.proxy.toxics.base import Toxic
from chaos.proxy.toxics.latency import LatencyToxic
from chaos.proxy.toxics.limit_data import LimitDataToxic
from chaos.proxy.toxics.noop import NoopToxic
from chaos.proxy.toxics.reset_peer import ResetPeerToxic
from chaos.proxy.toxics.slicer import SlicerToxic
from chaos.proxy.toxics.slow_close import SlowCloseToxic
from chaos.proxy.toxics.timeout import TimeoutToxic

#: Every toxic type Toxiproxy 2.12 registers (``toxics/*.go`` ``init``), by ``type``.
REGISTRY: Mapping[str, type[Toxic]] = MappingProxyType(
    {
        cls.type_name: cls
        for cls in (
            NoopToxic,
            LatencyToxic,
            BandwidthToxic,
            SlowCloseToxic,
            TimeoutToxic,
            ResetPeerToxic,
            SlicerToxic,
            LimitDataToxic,
        )
    }
)

__all__ = [
    "REGISTRY",
    "BandwidthToxic",
    "LatencyToxic",
    "LimitDataToxic",
    "NoopToxic",
    "ResetPeerToxic",
    "SlicerToxic",
    "SlowCloseToxic",
    "TimeoutToxic",
    "Toxic",
]
