from pathlib import Path

import pytest

from fleetsim.traces import MOONCAKE_BLOCK_TOKENS, TraceKind, load_trace, read_mooncake
from gtm.errors import ConfigError

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


def test_mooncake_sample_has_prefix_blocks_of_512_tokens() -> None:
    trace = load_trace(TraceKind.MOONCAKE, DATA / "mooncake_conversation_sample.jsonl")
    assert len(trace.requests) == 41
    assert trace.requests[0].at_s == 0.0
    for r in trace.requests:
        assert len(r.prefix_hashes) == -(-r.input_tokens // MOONCAKE_BLOCK_TOKENS)
    assert [r.at_s for r in trace.requests] == sorted(r.at_s for r in trace.requests)


def test_azure_sample_reads_offsets_and_sizes() -> None:
    trace = load_trace(TraceKind.AZURE_CONV, DATA / "azure_conv_sample.csv")
    assert len(trace.requests) == 30
    assert trace.requests[0].at_s == 0.0
    assert all(r.input_tokens > 0 for r in trace.requests)
    assert trace.rate_per_s > 0


def test_malformed_mooncake_line_names_the_line() -> None:
    with pytest.raises(ConfigError, match="line 2"):
        read_mooncake(['{"timestamp": 0, "input_length": 5, "output_length": 1}', "{}"], "x")
