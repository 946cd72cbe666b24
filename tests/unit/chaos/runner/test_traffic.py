"""The load plan: rate multipliers map trace time to run time; streams by share."""

from __future__ import annotations

import pytest

from chaos.journal import Journal
from chaos.traffic import LoadSpec, Multiplier, Stream, Traffic, plan, run_time, trace_time
from fleetsim.traces import Trace, TraceKind, TraceRequest
from gtm.clock import FakeClock
from gtm.errors import ConfigError
from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor


def _trace(count: int, gap: float = 1.0) -> Trace:
    return Trace(
        TraceKind.AZURE_CONV,
        "synthetic",
        tuple(TraceRequest(i * gap, 100, 10) for i in range(count)),
    )


def test_trace_time_and_run_time_are_inverse() -> None:
    surge = (Multiplier(at_s=10, factor=3), Multiplier(at_s=20, factor=1))
    assert trace_time(surge, 2.0, 10) == pytest.approx(20)
    assert trace_time(surge, 2.0, 20) == pytest.approx(80)  # 20 + 10 s × 3 × 2
    assert trace_time(surge, 2.0, 25) == pytest.approx(90)
    for t in (0.0, 3.3, 10.0, 14.2, 20.0, 31.7):
        assert run_time(surge, 2.0, trace_time(surge, 2.0, t)) == pytest.approx(t)


def test_a_surge_triples_the_arrivals_in_its_window() -> None:
    spec = LoadSpec(
        duration_s=30, multipliers=(Multiplier(at_s=10, factor=3), Multiplier(at_s=20, factor=1))
    )
    planned = plan(spec, _trace(200))
    sent = [p.send_at for p in planned]
    assert sum(1 for t in sent if t < 10) == 10
    assert sum(1 for t in sent if 10 <= t < 20) == 30
    assert sum(1 for t in sent if 20 <= t < 30) == 10
    assert sent == sorted(sent)


def test_streams_drawn_by_share_seeded() -> None:
    spec = LoadSpec(
        duration_s=1000,
        streams=(Stream(label="a", share=3.0), Stream(label="b", api_key="k", share=1.0)),
    )
    first = [p.stream.label for p in plan(spec, _trace(1000))]
    assert first == [p.stream.label for p in plan(spec, _trace(1000))]
    assert 0.7 < first.count("a") / len(first) < 0.8


def test_load_spec_rejects_duplicate_streams_and_unordered_multipliers() -> None:
    with pytest.raises(ValueError, match="unique"):
        LoadSpec(duration_s=1, streams=(Stream(label="x"), Stream(label="x")))
    with pytest.raises(ValueError, match="order"):
        LoadSpec(
            duration_s=1, multipliers=(Multiplier(at_s=5, factor=2), Multiplier(at_s=1, factor=1))
        )


def _traffic(spec: LoadSpec, region_urls: dict[str, str] | None) -> Traffic:
    clock = FakeClock()
    supervisor = TaskSupervisor(registry=new_registry(), clock=clock, component="test")
    return Traffic(
        spec,
        (),
        "http://127.0.0.1:9000",
        Journal(t0_wall=0.0),
        clock=clock,
        t0=0.0,
        supervisor=supervisor,
        region_urls=region_urls,
    )


def test_a_direct_stream_goes_to_its_regions_lb_the_others_to_the_front_door() -> None:
    direct = Stream(label="direct", region="eu-central", share=0.5)
    spec = LoadSpec(duration_s=10, streams=(Stream(), direct))
    traffic = _traffic(spec, {"eu-central": "http://127.0.0.4:8080/", "us-east": "x"})
    assert traffic.url_for(direct) == "http://127.0.0.4:8080"
    assert traffic.url_for(spec.streams[0]) == "http://127.0.0.1:9000"


def test_a_direct_stream_to_a_region_the_deployment_lacks_is_a_config_error() -> None:
    spec = LoadSpec(duration_s=10, streams=(Stream(region="planet-x"),))
    with pytest.raises(ConfigError, match=r"regions \['planet-x'\]; the deployment has \['eu'\]"):
        _traffic(spec, {"eu": "http://127.0.0.1:1"})
