from __future__ import annotations

import gzip
from pathlib import Path

import pytest

import gtm.data
from fleetsim.traces import (
    TRACE_FILES,
    TraceKind,
    data_dir,
    load_trace,
    read_azure,
    read_mooncake,
)
from gtm.errors import ConfigError

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:46.1805900,10,1
"""

MOONCAKE = [
    '{"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}',
    "",
    '{"timestamp": 0, "input_length": 7, "output_length": 3, "hash_ids": [0]}',
]


def test_azure_rows_become_sorted_offsets() -> None:
    trace = read_azure(AZURE, "a.csv")
    assert [r.at_s for r in trace.requests] == pytest.approx([0.0, 0.5, 4.814578])
    assert trace.requests[1].input_tokens == 374
    assert trace.requests[1].output_tokens == 44
    assert trace.duration_s == pytest.approx(4.814578)
    assert trace.rate_per_s == pytest.approx(3 / 4.814578)


def test_mooncake_lines_keep_their_prefix_hashes() -> None:
    trace = read_mooncake(MOONCAKE, "m.jsonl")
    assert [(r.at_s, r.prefix_hashes) for r in trace.requests] == [(0.0, (0,)), (1.0, (0, 1))]


def test_window_speeds_arrivals_up() -> None:
    trace = read_mooncake(MOONCAKE, "m.jsonl")
    assert len(trace.window(0.5, rate_scale=1.0)) == 1
    assert len(trace.window(0.5, rate_scale=4.0)) == 2
    with pytest.raises(ValueError, match="positive"):
        trace.window(1.0, rate_scale=0.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", "line 2"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,-1,1\n", "line 2"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
        ("a,b\n1,2\n", "line 2"),
    ],
)
def test_bad_azure_files_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_azure(text, "a.csv")


@pytest.mark.parametrize(
    ("lines", "message"), [(["{"], "line 1"), (['{"timestamp": 1}'], "line 1"), ([], "no requests")]
)
def test_bad_mooncake_files_name_the_line(lines: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_mooncake(lines, "m.jsonl")


def test_load_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(AZURE)
    assert len(load_trace(TraceKind.AZURE_CODE, path).requests) == 3
    with pytest.raises(ConfigError, match="cannot read the mooncake trace"):
        load_trace(TraceKind.MOONCAKE, tmp_path / "missing.jsonl")


def test_data_dir_follows_the_environment(tmp_path: Path) -> None:
    assert data_dir({"GTM_DATA_DIR": str(tmp_path)}) == tmp_path


def test_data_dir_defaults_to_the_data_shipped_with_gtm() -> None:
    # Nothing beside the repository: the package's own folder, in a checkout as in a wheel.
    assert data_dir({}) == Path(gtm.data.__file__).parent


def test_the_shipped_traces_load() -> None:
    # Stored xz-compressed in gtm/data/traces (with their licences), named plain.
    conv = load_trace(TraceKind.AZURE_CONV)
    assert len(conv.requests) == 19_366
    assert 5.0 < conv.rate_per_s < 6.0
    assert len(load_trace(TraceKind.AZURE_CODE).requests) == 8_819
    mooncake = load_trace(TraceKind.MOONCAKE)
    assert len(mooncake.requests) == 12_031
    assert mooncake.requests[0].prefix_hashes
    assert set(TRACE_FILES) == set(TraceKind) - {TraceKind.SYNTHETIC}


def test_a_trace_under_gtm_data_dir_is_read_plain_or_compressed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / TRACE_FILES[TraceKind.AZURE_CONV]
    plain.parent.mkdir(parents=True)
    plain.write_text(AZURE)
    monkeypatch.setenv("GTM_DATA_DIR", str(tmp_path))
    assert len(load_trace(TraceKind.AZURE_CONV).requests) == 3
    plain.with_name(plain.name + ".gz").write_bytes(gzip.compress(AZURE.encode()))
    plain.unlink()
    assert len(load_trace(TraceKind.AZURE_CONV).requests) == 3
    with pytest.raises(ConfigError, match="GTM_DATA_DIR"):
        load_trace(TraceKind.MOONCAKE)


def test_the_synthetic_trace_needs_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTM_DATA_DIR", "/nonexistent")
    trace = load_trace(TraceKind.SYNTHETIC, seed=3)
    assert trace.kind is TraceKind.SYNTHETIC
    assert trace.requests == load_trace(TraceKind.SYNTHETIC, seed=3).requests
    with pytest.raises(ConfigError, match="drawn, not read"):
        load_trace(TraceKind.SYNTHETIC, "t.csv")
