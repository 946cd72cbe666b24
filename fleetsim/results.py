"""What a run reports: each request's outcome, as arrays indexed like the workload, and
the run's own figures (GPU busy time, spills, the tiers' share of the wall time)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class Status:
    """A request's end (the values of :attr:`Outcomes.status`)."""

    OK = 0
    REFUSED = 1
    TIMED_OUT = 2
    PENDING = 3
    #: Lost on a GPU that crashed.
    FAILED = 4


@dataclass(slots=True)
class Outcomes:
    """Per-request results, as arrays indexed like the workload."""

    n: int
    status: np.ndarray = field(init=False)
    ttft_s: np.ndarray = field(init=False)
    e2e_s: np.ndarray = field(init=False)
    region: np.ndarray = field(init=False)
    gpu: np.ndarray = field(init=False)
    home: np.ndarray = field(init=False)
    cached: np.ndarray = field(init=False)
    violation: np.ndarray = field(init=False)
    ends: np.ndarray = field(init=False)
    reason: list[str] = field(init=False)

    def __post_init__(self) -> None:
        n = self.n
        self.status = np.full(n, Status.PENDING, dtype=np.int8)
        self.ttft_s = np.full(n, np.nan)
        self.e2e_s = np.full(n, np.nan)
        self.region = np.full(n, -1, dtype=np.int16)
        #: The GPU that served the request (its index in ``Simulator.gpu_list``), or -1.
        self.gpu = np.full(n, -1, dtype=np.int32)
        self.home = np.full(n, -1, dtype=np.int16)
        self.cached = np.zeros(n)
        self.violation = np.zeros(n, dtype=np.bool_)
        self.ends = np.zeros(n, dtype=np.int16)
        self.reason = [""] * n


@dataclass(slots=True)
class RunResult:
    policy: str
    outcomes: Outcomes
    wall_s: float
    sim_s: float
    gpu_busy_s: np.ndarray
    gpu_region: np.ndarray
    gpu_types: tuple[str, ...]
    max_kv_fraction: float
    spills: int
    #: Length of the arrival window the rates and busy fractions are measured over.
    window_s: float
    #: Busy seconds of each GPU inside the window.
    gpu_busy_window_s: np.ndarray
    crashed_gpus: int
    slow_gpus: int
    util_timeline: list[tuple[float, tuple[float, ...]]]
    prefix_hit_tokens: int
    prefix_queried_tokens: int
    #: Wall seconds spent inside each tier's decision code ("global", "regional",
    #: "zone") and in publishing summaries and rebuilding views ("publish"); the rest
    #: of the run is the simulator's own work (GPU model, accounting, events).
    tier_wall_s: dict[str, float] = field(default_factory=dict)
    #: Processes that simulated the run (fleetsim.partition); ``tier_wall_s`` is
    #: summed over them.
    workers: int = 1
    #: Per worker of a partitioned run, the seconds it spent waiting for the others
    #: (at the ticks, and when it was a lookahead ahead of one).
    worker_waited_s: tuple[float, ...] = ()
