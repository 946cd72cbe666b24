"""``SampleReader`` pinned to its reference, prometheus_client's text parser on the lines
``relevant`` keeps: the same samples on every engine fixture, each emulator flavour's
exposition of a busy worker and generated expositions (escapes, commas, braces and
equals signs inside label values, every number form); on a text outside its grammar,
mutated or garbage, it steps aside and the reference decides (the same figures or the
same ScrapeError)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusim.metrics import MetricsFlavor
from gpusim.samples import busy_exposition
from gtm import native
from gtm.gpu_profiles import LLAMA_8B
from gtm.testing.kernels import expected_state
from zone_agent import exposition, scrape
from zone_agent.exposition import Sample, StepAside
from zone_agent.scrape import Flavor, Parser, ScrapeError, parse_metrics, reference_samples

FIXTURES = sorted((Path(__file__).resolve().parents[2] / "data" / "engines").glob("*.txt"))
WANTED = sorted(scrape._WANTED)


def _same(samples: list[Sample]) -> list[tuple[str, dict[str, str], str]]:
    """Comparable samples: labels as read where the table reads them, values by repr
    (NaN equals NaN, -0.0 differs from 0.0)."""
    return [
        (name, dict(labels) if scrape._WANTED[name] else {}, repr(value))
        for name, labels, value in samples
    ]


def _assert_pinned(text: str) -> list[Sample] | StepAside:
    read = scrape._READER.read(text)
    try:
        reference = reference_samples(text)
    except ScrapeError:
        assert isinstance(read, StepAside), "the reference rejects what the reader read"
        with pytest.raises(ScrapeError):
            parse_metrics(text, scraped_at=0.0)
        return read
    if not isinstance(read, StepAside):
        assert _same(read) == _same(reference)
    assert _outcome(text, Parser.READER) == _outcome(text, Parser.REFERENCE)
    return read


def _outcome(text: str, parser: Parser) -> tuple[str, str]:
    """What ``parse_metrics`` makes of a text: the flavour and figures, or a ScrapeError."""
    try:
        parsed = parse_metrics(text, scraped_at=0.0, default_model="d", parser=parser)
    except ScrapeError:
        return ("ScrapeError", "")
    return (parsed.flavor, repr(dict(parsed.models)))


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_every_engine_fixture_is_read_as_the_reference_reads_it(path: Path) -> None:
    read = _assert_pinned(path.read_text())
    assert not isinstance(read, StepAside), read
    assert read, "the fixture gives samples"


@pytest.mark.parametrize("flavor", list(MetricsFlavor), ids=[f.value for f in MetricsFlavor])
def test_each_emulator_flavour_is_read_as_the_reference_reads_it(flavor: MetricsFlavor) -> None:
    text = busy_exposition(flavor, requests=8, finished=4, max_num_seqs=4)
    read = _assert_pinned(text)
    assert not isinstance(read, StepAside), read
    parsed = parse_metrics(text, scraped_at=0.0, default_model=LLAMA_8B)
    assert parsed.parsed_by is Parser.READER
    assert parsed.flavor is Flavor(flavor.value)
    assert parsed.models[LLAMA_8B].running > 0


# ---------------------------------------------------------------- generated expositions

#: Label values: escapes, the characters the label grammar gives meaning to, unicode.
_VALUE_TEXT = st.lists(
    st.sampled_from([*'abz09 _-/.:\\"\n,{}=#\té€', "\\n", '\\"', "\\\\"]), max_size=12
).map("".join)
_LABEL_NAMES = st.sampled_from(
    ["model_name", "model", "request_type", "kv_cache_block_type", "method", "le",
     "cache_source", "block_size", "num_gpu_blocks", "page_size", "num_pages",
     "dynamo_endpoint", "response_metric_type", "engine", "_", "_x", "a:b", "__name__",
     "__reserved"]
)  # fmt: skip
_LABEL_VALUES = st.one_of(
    _VALUE_TEXT,
    st.sampled_from(["scheduled", "waiting", "fraction", "used", "max", "tokens_per",
                     "decode", "prefill", "device", "", "generate", "total_input_tokens",
                     "16", "100", "-3", "x"]),
)  # fmt: skip
_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**20), 10**20).map(str),
    st.sampled_from(
        ["NaN", "+Inf", "-Inf", "Inf", "1e3", "1E-3", "+1.5e+2", ".5", "5.", "-0", "+0",
         "-0.0", "007", "1" + "0" * 320, "-" + "9" * 330, "1e400", "1_0", "0x10", "nan",
         "infinity", "١٢"]
    ),
)  # fmt: skip


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def _names(draw: st.DrawFn) -> str:
    name: str = draw(st.sampled_from(WANTED))
    stem = name.removesuffix("_total").removesuffix("_sum").removesuffix("_count")
    return draw(
        st.sampled_from([name, stem, stem + "_total", stem + "_sum", stem + "_bucket",
                         stem + "_created", stem + "_other", "other_metric"])
    )  # fmt: skip


@st.composite
def _sample_line(draw: st.DrawFn) -> str:
    name = draw(_names())
    labels = draw(st.lists(st.tuples(_LABEL_NAMES, _LABEL_VALUES), max_size=4))
    block = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    if draw(st.booleans()) and block:
        block += ","
    empty_braces: bool = draw(st.booleans())
    braces = f"{{{block}}}" if labels or empty_braces else ""
    stamp = draw(st.sampled_from(["", "", " 1700000000000", " -5", " 1.5"]))
    return f"{name}{braces} {draw(_NUMBERS)}{stamp}"


@st.composite
def _comment_line(draw: st.DrawFn) -> str:
    name = draw(_names())
    if draw(st.booleans()):
        return f"# HELP {name} {draw(_VALUE_TEXT).replace(chr(10), ' ')}".rstrip()
    kind = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped", "info"]))
    return f"# TYPE {name} {kind}"


_EXPOSITIONS = st.lists(st.one_of(_sample_line(), _comment_line()), max_size=14).map(
    lambda lines: "\n".join(lines) + "\n"
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_EXPOSITIONS)
def test_generated_expositions_are_read_as_the_reference_reads_them(text: str) -> None:
    _assert_pinned(text)


#: Characters a mutation inserts or substitutes: the grammar's own and whitespace.
_MUTATIONS = st.sampled_from([*' \t{}",=\\#_:.e+-0a\r\x0b\x85\u2028\xa0', ' # {a="b"} 1'])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_EXPOSITIONS, st.data())
def test_mutated_expositions_step_aside_or_agree(text: str, data: st.DataObject) -> None:
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 2))
        text = (
            text[:at] + data.draw(st.sampled_from(["", data.draw(_MUTATIONS)])) + text[at + cut :]
        )
    _assert_pinned(text)


# ---------------------------------------------------------------- the usual exotica


@pytest.mark.parametrize(
    ("text", "reader"),
    [
        # Legal, read by the reader.
        ('vllm:num_requests_running{model_name="a\\"b\\\\c\\nd,e}f=g"} 3\n', True),
        ('vllm:num_requests_running{model_name="m",} 3 1700000000000\n', True),
        ("# TYPE llamacpp:prompt_tokens counter\nllamacpp:prompt_tokens 7\n", True),
        ("# TYPE vllm:num_requests_running counter\nvllm:num_requests_running 7\n", True),
        ('vllm:num_requests_running{model_name="m"} -0\n', True),
        ("llamacpp:requests_processing NaN\n# EOF\n", True),
        # Legal, but left to the reference.
        ('vllm:num_requests_running{model_name = "m"} 3\n', False),
        ('vllm:num_requests_running{model_name="m"}\t3\n', False),
        ('vllm:num_requests_running {model_name="m"} 3\n', False),
        ('llamacpp:requests_processing 3 # {trace_id="x"} 1\n', False),
    ],
)
def test_the_usual_shapes_are_read_and_the_rest_left_to_the_reference(
    text: str, reader: bool
) -> None:
    read = _assert_pinned(text)
    assert isinstance(read, StepAside) is not reader


@pytest.mark.parametrize(
    "text",
    [
        'vllm:num_requests_running{model_name="m" 3\n',
        'vllm:num_requests_running{model_name="m",model_name="n"} 3\n',
        'vllm:num_requests_running{__name__="x",model_name="m"} 3\n',
        'vllm:num_requests_running{model_name="m"} 1_0\n',
        "vllm:num_requests_running " + "1" * 400 + "\n",
        "# TYPE vllm:num_requests_running\n",
        'vllm:request_prompt_tokens_count{model_name="m"} garbage\n',
    ],
)
def test_garbage_in_a_kept_line_is_a_scrape_error_by_the_reference(text: str) -> None:
    read = scrape._READER.read(text)
    assert isinstance(read, StepAside)
    with pytest.raises(ScrapeError):
        parse_metrics(text, scraped_at=0.0)


def test_a_step_aside_is_read_by_the_reference_and_says_why() -> None:
    text = 'vllm:num_requests_running{model_name="m"}  3\n'
    parsed = parse_metrics(text, scraped_at=0.0)
    assert parsed.parsed_by is Parser.REFERENCE
    assert "usual shape" in parsed.aside
    assert "vllm:num_requests_running" in parsed.aside
    assert parsed.models["m"].running == 3
    assert math.isclose(
        parse_metrics(text.replace("  ", " "), scraped_at=0.0).models["m"].running, 3
    )


# ---------------------------------------------------------------- the two forms of the loop
# zone_agent/_exposition.c and SampleReader._kept (Python): the same kept lines, or the
# same step aside, on every text the C form takes (ASCII); None on the rest.


def _both(text: str) -> None:
    compiled = exposition._kept
    assert compiled is not None
    got = compiled(text, scrape._READER.prefixes)
    python = scrape._READER._kept(text)
    if not text.isascii():
        assert got is None
        return
    if isinstance(python, StepAside):
        assert got == (python.line, python.reason)
    else:
        assert got == python


def test_the_line_loop_is_compiled_where_it_must_be() -> None:
    expected = expected_state()
    assert native.kernel("zone_agent._exposition").state is expected
    assert exposition.COMPILED is (expected is not native.KernelState.PYTHON)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_both_forms_keep_the_same_lines_of_every_engine_fixture(path: Path) -> None:
    text = path.read_text()
    _both(text)
    _both(text.replace("\n", "\r\n"))


@pytest.mark.parametrize("flavor", list(MetricsFlavor), ids=[f.value for f in MetricsFlavor])
def test_both_forms_keep_the_same_lines_of_each_emulator_flavour(flavor: MetricsFlavor) -> None:
    _both(busy_exposition(flavor, requests=8, finished=4, max_num_seqs=4))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_EXPOSITIONS, st.data())
def test_both_forms_keep_the_same_lines_of_generated_and_mutated_texts(
    text: str, data: st.DataObject
) -> None:
    _both(text)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 2))
        extra = data.draw(st.one_of(_MUTATIONS, st.sampled_from(["\r\n", "\x0c", "\x1d", "\n#"])))
        text = text[:at] + extra + text[at + cut :]
        _both(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n\r\n",
        "vllm:num_requests_running 1",  # no line break at the end
        "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits 4\n",
        "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total 4\n",
        '# HELP vllm:num_requests_running x\nvllm:num_requests_running{_="a",b="c"} 2\n',
        "# TYPE vllm:time_to_first_token_seconds histogram\nvllm:time_to_first_token_seconds 1\n",
        "# TYPE vllm:time_to_first_token_seconds summary\n"
        "vllm:time_to_first_token_seconds 1\nvllm:time_to_first_token_seconds_sum 2\n",
        "#  HELP vllm:num_requests_running x\n",
        "# HELP  vllm:num_requests_running\n",
        "# TYPE vllm:num_requests_running gaugehistogram\nvllm:num_requests_running 1\n",
        "# TYPE vllm:num_requests_running counter \n",
        "vllm:num_requests_running 1 1234567890123456789\n",
        "vllm:num_requests_running 1 -123456789012345678\n",
        "vllm:num_requests_running -Inf\nvllm:num_requests_running .5e-3\n",
        "vllm:num_requests_running 1e\n",
        'vllm:num_requests_running{a="\\\\"} 1\n',
        'vllm:num_requests_running{a="\\"} 1\n',
        'vllm:num_requests_running{__x="1"} 1\n',
        "vllm:num_requests_running{} 1\nvllm:num_requests_running{,} 1\n",
        "vllm:num_requests_running\x0b1\n",
    ],
)
def test_both_forms_agree_on_the_edges_of_the_grammar(text: str) -> None:
    _both(text)
