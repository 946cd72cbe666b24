from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from fleetsim.traces import Trace, TraceKind, TraceRequest
from gtm.clock import FakeClock
from gtm.net import free_port
from gtm.tokens import ChatMessage, count_chat_tokens, count_text_tokens
from gtmctl.cli import cli
from gtmctl.load import (
    ClientsFrom,
    LoadConfig,
    LoadRun,
    Outcome,
    ProgressBar,
    PromptMaker,
    StreamRead,
    Tally,
    describe,
    is_stream_break,
    render_summary,
)
from gtmctl.up.cli import EXIT_FAILED


@pytest.mark.parametrize("tokens", [8, 100, 1020, 4142])
def test_prompts_have_the_traces_token_count(tokens: int) -> None:
    text = PromptMaker(seed=1).prompt(tokens)
    assert count_chat_tokens([ChatMessage(role="user", text=text)]) == tokens


def test_shared_prefix_hashes_share_prompt_text() -> None:
    maker = PromptMaker(seed=1)
    first = maker.prompt(1200, (7, 8, 9))
    second = maker.prompt(1100, (7, 8, 10))
    assert first[:2000] == second[:2000]  # block 7 (512 tokens of 5-character words)
    assert first != second
    unrelated = maker.prompt(1200, (1, 2, 3))
    assert unrelated[:50] != first[:50]


def test_unshared_prompts_differ() -> None:
    maker = PromptMaker(seed=1)
    assert maker.prompt(500) != maker.prompt(500)
    assert count_text_tokens(maker.prompt(500)) == 500 - 7


def test_a_summary_without_successes_has_null_percentiles() -> None:
    tally = Tally(scheduled=1)
    tally.add(Outcome(False, 0, reason="ClientConnectorError"))
    summary = tally.summary()
    assert summary["ttft_ms"] == {"p50": None, "p99": None}
    assert summary["latency_ms"] == {"p50": None, "p99": None}
    json.dumps(summary, allow_nan=False)  # null, not NaN: the JSON stays valid
    assert "TTFT       p50 –, p99 –" in render_summary(summary, "summary")


def test_summary_counts_success_regions_spills_and_refusals() -> None:
    tally = Tally(scheduled=5)
    for outcome in (
        Outcome(True, 200, ttft_s=0.1, latency_s=1.0, region="eu-west"),
        Outcome(True, 200, ttft_s=0.3, latency_s=2.0, region="eu-central", spilled_from="eu-west"),
        Outcome(True, 200, ttft_s=0.2, latency_s=1.5, region="eu-west"),
        Outcome(False, 429, reason="http-429:rate_limit_exceeded"),
        Outcome(False, 0, reason="ClientConnectorError"),
    ):
        tally.add(outcome)
    summary = tally.summary()
    assert summary["requests"] == 5
    assert summary["succeeded"] == 3
    assert summary["success_ratio"] == 0.6
    assert summary["ttft_ms"] == {"p50": 200.0, "p99": 300.0}
    assert summary["region_share"] == {"eu-west": 0.6667, "eu-central": 0.3333}
    assert summary["spills"] == {"eu-west→eu-central": 1}
    assert summary["refusals"] == {"http-429:rate_limit_exceeded": 1, "ClientConnectorError": 1}
    text = render_summary(summary, "summary")
    assert "3 succeeded (60.00 %)" in text
    assert "p50 200 ms, p99 300 ms" in text
    assert "eu-west→eu-central 1" in text


def test_empty_summary_renders() -> None:
    text = render_summary(Tally().summary(), "summary")
    assert "0 sent" in text
    assert "refusals   none" in text


def test_trace_window_and_description() -> None:
    trace = Trace(
        TraceKind.AZURE_CONV,
        "t.csv",
        tuple(TraceRequest(float(i), 100, 10) for i in range(10)),
    )
    config = LoadConfig(duration_s=3.0, rate_scale=2.0)
    window = trace.window(config.duration_s, config.rate_scale)
    assert len(window) == 6  # arrivals at 0..5 s of trace time = 0..2.5 s at 2×
    assert "× 2 for 3 s = 6 requests (2.00 req/s)" in describe(trace, config, window)


def test_progress_bar_on_a_pipe_prints_a_line_every_ten_seconds() -> None:
    out = io.StringIO()
    bar = ProgressBar(out, started=0.0, duration_s=60.0)
    tally = Tally(scheduled=10, sent=4)
    tally.add(Outcome(True, 200, ttft_s=0.05))
    for now in (0.5, 1.0, 10.6, 11.0):
        bar(tally, now)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "sent 4/10  ok 1  failed 0  in flight 3  TTFT p50 50 ms" in lines[0]


def test_requests_carry_the_trace_sizes_and_a_city_client(fake_clock: FakeClock) -> None:
    config = LoadConfig(max_input_tokens=1000, max_output_tokens=50)
    run = LoadRun(config, (), clock=fake_clock)
    body = run.body(TraceRequest(0.0, input_tokens=5000, output_tokens=80))
    assert body["max_tokens"] == 50
    assert body["ignore_eos"] is True
    assert body["stream"] is True
    text = body["messages"][0]["content"]
    assert count_chat_tokens([ChatMessage(role="user", text=text)]) == 1000
    headers, city = run.headers()
    assert headers["Authorization"] == "Bearer gtm-load-test"
    assert headers["X-Forwarded-For"].startswith("2001:db8:")
    assert city


def test_loopback_clients_send_no_forwarded_for(fake_clock: FakeClock) -> None:
    run = LoadRun(LoadConfig(clients_from=ClientsFrom.LOOPBACK), (), clock=fake_clock)
    headers, city = run.headers()
    assert "X-Forwarded-For" not in headers
    assert city == ""


def test_gtm_load_replays_a_synthetic_trace_without_any_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No data folder at all: the synthetic trace is drawn, so gtm load gets as far as its
    # front-door check (nothing listens on the port).
    monkeypatch.setenv("GTM_DATA_DIR", "/nonexistent")
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    args = ["load", "--trace", "synthetic", "--duration", "5", "--url", url]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == EXIT_FAILED, result.output
    assert "no front door answers" in result.output
    result = CliRunner().invoke(cli, ["load", "--duration", "5", "--url", url])
    assert result.exit_code == EXIT_FAILED, result.output
    assert "cannot read the azure-conv trace" in result.output
    assert "GTM_DATA_DIR" in result.output


def test_a_stream_read_names_how_it_failed() -> None:
    assert StreamRead(done=True).reason() == ""
    assert StreamRead().reason() == "truncated-stream"
    assert StreamRead(done=True, error="upstream_reset").reason() == "stream-error:upstream_reset"
    assert StreamRead(error="").reason() == "stream-error"


def test_stream_break_reasons_are_told_from_other_failures() -> None:
    for reason in (
        "stream-error:upstream_timeout",
        "cut-stream:ClientPayloadError",
        "truncated-stream",
    ):
        assert is_stream_break(reason)
    for reason in ("", "http-502", "ClientConnectorError", "client-overload", "TimeoutError"):
        assert not is_stream_break(reason)


def test_a_summary_without_cut_streams_has_no_cut_line() -> None:
    tally = Tally(scheduled=1)
    tally.add(Outcome(True, 200, ttft_s=0.1, latency_s=1.0))
    summary = tally.summary()
    assert summary["cut_streams"] == 0
    assert "cut " not in render_summary(summary, "summary")
