"""The soak benchmark's own arithmetic (bench/soak.py): slopes, the looped trace, what it
reads from /metrics and the logs, and its verdict."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
from pathlib import Path

import pytest

from bench.soak import (
    FdKind,
    Fds,
    Growth,
    Proc,
    ProcFigures,
    Run,
    Sample,
    Series,
    entries_table,
    etcd_notes,
    fd_kind,
    fds_missed,
    growth,
    kind_table,
    looped,
    metric_values,
    private_topology,
    proc_figures,
    read_fds,
    scan_log,
    slope_pct_per_hour,
    verdict,
)
from fleetsim.traces import Trace, TraceKind, TraceRequest
from gtm.state.etcd_server import RAFT_CATCHUP_ENTRIES, SNAPSHOT_ENTRIES
from gtm.topology import load_topology


def test_slope_is_percent_of_the_mean_per_hour() -> None:
    # 100 → 101 MB over an hour, sampled every 10 min: +1 MB/h on a 100.5 MB mean.
    times = [600.0 * k for k in range(7)]
    rss = [100.0 + k / 6 for k in range(7)]
    assert slope_pct_per_hour(times, rss) == pytest.approx(100 / 100.5)
    assert slope_pct_per_hour(times, [100.0] * 7) == pytest.approx(0.0)
    assert slope_pct_per_hour(times, [100.0 - k for k in range(7)]) < 0


def test_growth_is_split_into_steps_at_new_peaks_and_a_steady_rest() -> None:
    times = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    # +8 KB a sample (steady), one +900 KB step at 30 s, a fall of 300 KB at 50 s.
    rss = [1000, 1008, 1016, 1916, 1924, 1624]
    found = growth(times, rss)
    assert found == Growth(624, ((30.0, 900),))
    assert (found.in_steps_kb, found.rest_kb) == (900, -276)
    assert str(found) == "+624 KB: -276 steady, +900 in 1 step(s) (largest +900 at 30 s)"
    assert str(growth(times, [1000 + 8 * k for k in range(6)])) == "+40 KB: +40 steady"
    assert growth([], []) == Growth(0, ())


def test_slope_needs_three_samples_spread_in_time() -> None:
    assert math.isnan(slope_pct_per_hour([0.0, 1.0], [1.0, 2.0]))
    assert math.isnan(slope_pct_per_hour([5.0, 5.0, 5.0], [1.0, 2.0, 3.0]))


def trace(ats: list[float]) -> Trace:
    return Trace(TraceKind.AZURE_CONV, "test", tuple(TraceRequest(a, 10, 5) for a in ats))


def test_a_run_longer_than_the_trace_replays_it_from_the_start() -> None:
    t = trace([0.0, 4.0, 9.0])  # laps are 9 s plus one mean gap apart
    once = looped(t, 9.0, 1.0)
    assert [r.at_s for r in once] == [0.0, 4.0]
    span = t.duration_s + 1.0 / t.rate_per_s
    twice = looped(t, 2 * span, 1.0)
    assert [r.at_s for r in twice] == pytest.approx([0.0, 4.0, 9.0, span, span + 4.0, span + 9.0])
    # At twice the rate the same wall time holds twice the trace.
    assert len(looped(t, span, 2.0)) == 6
    assert all(r.input_tokens == 10 for r in twice)


def test_reads_tasks_failures_lag_every_entries_gauge_and_etcds_sizes() -> None:
    text = "\n".join(
        [
            "# TYPE gtm_event_loop_tasks gauge",
            "gtm_event_loop_tasks 12.0",
            "# TYPE gtm_zone_prefix_index_entries gauge",
            'gtm_zone_prefix_index_entries{index="sent"} 40.0',
            'gtm_zone_prefix_index_entries{index="answered"} 30.0',
            "# TYPE gtm_task_failures_total counter",
            'gtm_task_failures_total{component="zone",task="scrape"} 2.0',
            "# TYPE gtm_zone_requests_total counter",
            'gtm_zone_requests_total{code="200"} 9.0',
            "# TYPE etcd_server_proposals_committed_total gauge",
            "etcd_server_proposals_committed_total 6123.0",
            "# TYPE etcd_server_proposals_failed_total counter",
            "etcd_server_proposals_failed_total 0.0",
        ]
    )
    values = metric_values(text + "\n")
    assert values == {
        "gtm_event_loop_tasks": 12.0,
        'gtm_zone_prefix_index_entries{index="sent"}': 40.0,
        'gtm_zone_prefix_index_entries{index="answered"}': 30.0,
        'gtm_task_failures_total{component="zone",task="scrape"}': 2.0,
        "etcd_server_proposals_committed_total": 6123.0,  # etcd's raft index
    }


def test_log_scan_counts_whole_new_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "zone-a.log"
    log.write_text("t level=INFO x\nt level=WARNING slow\nt level=ERROR bad\npart")
    series = Series(Proc("zone/a", "zone", 1, None, log))
    scan_log(series, counting=False)
    assert series.warnings == 1
    assert series.errors == ["t level=ERROR bad"]
    assert series.log_bytes_after_warmup == 0
    with log.open("a") as handle:
        handle.write("ial line\nTraceback (most recent call last):\n")
    scan_log(series, counting=True)
    added = "partial line\nTraceback (most recent call last):\n"
    assert series.log_bytes_after_warmup == len(added)
    assert len(series.errors) == 2


def figures(name: str, slope: float) -> ProcFigures:
    return ProcFigures(name, "zone", 90.0, 90.0, slope, slope, None, None, None, None, None,
                       None, None, None, 0.0, 0, 0)  # fmt: skip


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        ("socket:[123456]", FdKind.SOCKET),
        ("/tmp/run/logs/global-global.log", FdKind.FILE),
        ("/var/lib/gtm/audit/audit-000000000001.jsonl", FdKind.FILE),
        ("/dev/null", FdKind.FILE),
        ("pipe:[98765]", FdKind.OTHER),
        ("anon_inode:[eventpoll]", FdKind.OTHER),
        ("anon_inode:[eventfd]", FdKind.OTHER),
    ],
)
def test_a_descriptor_is_a_socket_a_file_or_other_by_its_link(target: str, kind: FdKind) -> None:
    assert fd_kind(target) is kind


def test_reads_this_process_descriptors_by_kind(tmp_path: Path) -> None:
    before = read_fds(os.getpid())
    assert before is not None
    with (tmp_path / "f").open("w"), socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        during = read_fds(os.getpid())
    assert during == Fds(before.sockets + 1, before.files + 1, before.other)
    assert read_fds(2**22 + 1) is None  # no such process


def test_sockets_come_back_to_the_start_files_to_the_end_of_the_warm_up() -> None:
    before, warm = Fds(sockets=10, files=3, other=4), Fds(sockets=60, files=4, other=4)
    # The audit log, opened at the first audited request, stays open: back.
    assert fds_missed(before, warm, Fds(10, 4, 4)) is None
    # A connection not closed after the load is not back, whatever the warm-up held.
    assert fds_missed(before, warm, Fds(11, 4, 4)) == "11 sockets after the load, 10 before"
    # A file opened after the warm-up (per request, or never closed) is not back.
    assert fds_missed(before, warm, Fds(10, 5, 4)) == "5 files after the load, 4 after the warm-up"
    assert fds_missed(before, warm, Fds(10, 4, 5)) == (
        "5 other descriptors after the load, 4 before"
    )
    # Without a sample after the warm-up, files come back to the start too.
    assert fds_missed(before, None, Fds(10, 4, 4)) == "4 files after the load, 3 after the warm-up"
    # A file closed during the warm-up does not lower the bar below the start.
    assert fds_missed(before, Fds(10, 2, 4), Fds(10, 3, 4)) is None


def test_verdict_names_errors_slopes_and_descriptors() -> None:
    run = Run(
        fds_before={"zone/a": Fds(20, 3, 2), "zone/b": Fds(20, 3, 2)},
        fds_warm={"zone/a": Fds(40, 4, 2), "zone/b": Fds(40, 4, 2)},
        fds_after={"zone/a": Fds(20, 4, 2), "zone/b": Fds(23, 4, 2)},
    )
    missed = verdict(
        [figures("zone/a", 0.99), figures("zone/b", 1.0), figures("gpu/x", math.nan)],
        run,
        ["3 failed requests"],
    )
    assert missed == [
        "3 failed requests",
        "zone/b: RSS slope +1.00 %/h ≥ 1.0",
        "zone/b: 23 sockets after the load, 20 before",
    ]
    fewer = Run(fds_before={"a": Fds(3, 1, 1)}, fds_after={"a": Fds(2, 1, 1)})
    assert verdict([figures("zone/a", -5.0)], fewer, []) == []


def test_regions_by_name_or_count_on_a_private_block(tmp_path: Path) -> None:
    named = load_topology(private_topology(tmp_path, "us-east,eu-west"))
    assert [r.id for r in named.regions] == ["us-east", "eu-west"]
    assert all(str(r.address).startswith("127.") for r in named.regions)
    assert str(named.regions[0].address) != "127.0.1.1"  # never make up's addresses
    assert len(load_topology(private_topology(tmp_path, "3")).regions) == 3
    with pytest.raises(SystemExit, match="no region mars"):
        private_topology(tmp_path, "us-east,mars")


def test_report_tables_fit_after_the_warm_up_and_sum_each_kind(tmp_path: Path) -> None:
    run = Run(
        fds_before={"zone/a": Fds(10, 2, 1), "zone/b": Fds(12, 2, 1)},
        fds_warm={"zone/a": Fds(30, 3, 1), "zone/b": Fds(30, 3, 1)},
        fds_after={"zone/a": Fds(10, 3, 1), "zone/b": Fds(12, 3, 1)},
    )
    for name, growth_kb in (("zone/a", 0), ("zone/b", 1024)):
        series = run.series[name] = Series(Proc(name, "zone", 1, None, None))
        for k in range(-1, 13):  # every 5 min for an hour, one sample before the load
            at = 300.0 * k
            # Both grow 50 MB during the 10-min warm-up; then b grows 1 MB per 5 min.
            rss = 100 * 1024 + min(at, 600) / 600 * 50 * 1024 + max(0.0, at - 600) / 300 * growth_kb
            series.samples.append(
                Sample(at, int(rss), 10, tasks=5.0, entries={'gtm_zone_x_entries{i="1"}': k})
            )
    figures = {f.name: f for f in proc_figures(run, warmup_s=600.0)}
    assert figures["zone/a"].slope_pct_h == pytest.approx(0.0, abs=1e-9)
    # b: +12 MB/h over the last 50 min, on a mean of ~155 MB.
    assert 7.0 < figures["zone/b"].slope_pct_h < 8.0
    # A steady growth keeps its slope over the last half; no growth stays flat.
    assert figures["zone/b"].slope_tail_pct_h == pytest.approx(
        figures["zone/b"].slope_pct_h, rel=0.1
    )
    assert figures["zone/a"].slope_tail_pct_h == pytest.approx(0.0, abs=1e-9)
    assert figures["zone/a"].rss_warm_mb == pytest.approx(150.0)
    table = kind_table(list(figures.values()))
    assert table[2].startswith("| zone | 2 | 300 → 310 | +7.")
    assert "| 22 → 22 | 6 → 6 |" in table[2]  # sockets before → after, files warm → after
    sizes = entries_table(run, warmup_s=600.0)
    assert sizes[-1] == "| zone | gtm_zone_x_entries | 4 | 24 | 24 |"


def test_etcd_note_says_whether_its_raft_log_was_still_filling_after_the_warm_up() -> None:
    full = RAFT_CATCHUP_ENTRIES + SNAPSHOT_ENTRIES
    run = Run()
    series = run.series["etcd/etcd-1"] = Series(Proc("etcd/etcd-1", "etcd", 1, None, None))
    for k in range(13):  # every 5 min; 4 entries a second; RSS grows until the log is full
        at, index = 300.0 * k, 4.0 * 300 * k
        rss = 60 * 1024 + min(index, full) / 100
        entries = {"etcd_server_proposals_committed_total": index}
        series.samples.append(Sample(at, int(rss), 20, entries=entries))
    (filling,) = etcd_notes(run, warmup_s=600.0)
    assert filling.startswith("etcd/etcd-1: raft index 2400 at the end of the warm-up, 14400 ")
    assert "still filling after the warm-up" in filling
    assert "slope once full: +0.00 %/h over 8 samples" in filling
    (full_note,) = etcd_notes(run, warmup_s=1800.0)
    assert full_note.endswith("full from the start of the fit")
    series.samples = [
        dataclasses.replace(
            s, entries={**s.entries, "etcd_mvcc_db_total_size_in_bytes": 16 * 2**20}
        )
        for s in series.samples
    ]
    (with_db,) = etcd_notes(run, warmup_s=1800.0)
    assert with_db.endswith(
        "full from the start of the fit; its database 16.0 → 16.0 MB over the fit "
        "(it grows for about two compaction periods of 5m, then levels off)"
    )
