"""The fidelity benchmark's own arithmetic (bench/sim_fidelity.py): the tiers' overhead
under bursts, and figures pooled over several live runs."""

from __future__ import annotations

import numpy as np
import pytest

from bench.sim_fidelity import Overhead, Served, figures, pooled


def test_overhead_alone_is_the_idle_fit() -> None:
    overhead = Overhead(fixed_s=0.01, per_token_s=1e-6, samples=())
    delays = overhead.queued(np.array([0.0, 5.0]), np.array([1000.0, 4000.0]))
    assert delays == pytest.approx([0.011, 0.014])


def test_a_burst_shares_the_cpu_and_short_requests_are_through_first() -> None:
    overhead = Overhead(fixed_s=0.0, per_token_s=1e-3, samples=())
    # Three requests sent together, needing 3, 1 and 2 ms of CPU: processor sharing
    # finishes the 1 ms one after 3 ms (3 × 1), the 2 ms one 2 ms later, the last 1 ms
    # after that.
    delays = overhead.queued(np.zeros(3), np.array([3.0, 1.0, 2.0]))
    assert delays == pytest.approx([0.006, 0.003, 0.005])
    # The work is conserved: the last one is through when all of it is done.
    assert delays.max() == pytest.approx(0.006)


def test_a_request_arriving_mid_service_shares_what_is_left() -> None:
    overhead = Overhead(fixed_s=0.0, per_token_s=1.0, samples=())
    # 1 s of work at 0 and at 0.5: alone until 0.5 (half done), then both at half rate.
    delays = overhead.queued(np.array([0.0, 0.5]), np.array([1.0, 1.0]))
    assert delays == pytest.approx([1.5, 1.5])


def served(sent: list[float], e2e: list[float], ok: list[bool]) -> Served:
    return Served(
        sent_s=np.array(sent),
        ok=np.array(ok),
        ttft_s=np.array(e2e) / 2,
        e2e_s=np.array(e2e),
        region=("r",) * len(sent),
    )


def test_pooled_runs_count_throughput_per_run_window() -> None:
    a = served([0.0, 1.0, 9.0], [1.0, 1.0, 5.0], [True, True, True])
    b = served([0.0, 2.0], [2.0, 1.0], [True, False])
    both = figures(pooled([a, b]), window_s=10.0, runs=2)
    # In-window successes: a's first two (the third ends at 14 s), b's first.
    assert both.throughput == pytest.approx(3 / 20)
    assert both.success == pytest.approx(4 / 5)
    assert both.e2e_p99 == 5.0
    assert figures(a, window_s=10.0).throughput == pytest.approx(2 / 10)
