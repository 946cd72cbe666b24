from __future__ import annotations

import pytest

from policies.errors import PolicyError
from policies.yamlsafe import Limits, ReadError, format_path, parse_json, parse_yaml


def test_core_schema_keeps_norway_a_string() -> None:
    (doc,) = parse_yaml("countries: [NO, no, yes, on, off]\nflag: true\nother: False\n")
    assert doc.data == {"countries": ["NO", "no", "yes", "on", "off"], "flag": True, "other": False}


def test_numbers_null_and_no_timestamps() -> None:
    text = "a: 1\nb: -2.5\nc: 0x1f\nd: 0o17\ne: ~\nf:\ng: 2024-01-01\nh: 1e3\n"
    (doc,) = parse_yaml(text)
    assert doc.data == {
        "a": 1,
        "b": -2.5,
        "c": 31,
        "d": 15,
        "e": None,
        "f": None,
        "g": "2024-01-01",
        "h": 1000.0,
    }


def test_lines_of_every_path() -> None:
    (doc,) = parse_yaml("a: 1\nb:\n  - x\n  - {c: 2}\n")
    assert doc.lines[("a",)] == 1
    assert doc.lines[("b",)] == 2
    assert doc.lines[("b", 0)] == 3
    assert doc.lines[("b", 1, "c")] == 4
    assert doc.line_of(("b", 1, "c", "missing", 3)) == 4
    assert doc.line_of(("zzz",)) == 1


def test_multiple_documents_keep_their_own_lines() -> None:
    docs = parse_yaml("a: 1\n---\nb: 2\n")
    assert [d.data for d in docs] == [{"a": 1}, {"b": 2}]
    assert docs[1].lines[("b",)] == 3
    assert docs[1].start_line == 3


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("a: !!python/object/apply:os.system [ls]\n", 1, "'!!python/object/apply:os.system'"),
        ("a: 1\nb: !!python/name:os.system\n", 2, "'!!python/name:os.system'"),
        ("a: !custom 3\n", 1, "'!custom'"),
        ("a: !!binary aGVsbG8=\n", 1, "'!!binary'"),
        ("a: !!timestamp 2020-01-01\n", 1, "'!!timestamp'"),
        ("a: !!set {x}\n", 1, "'!!set'"),
    ],
)
def test_unsafe_tags_are_rejected_with_their_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(ReadError) as info:
        parse_yaml(text)
    assert info.value.line == line
    assert "unsafe or unsupported YAML tag" in info.value.message
    assert fragment in info.value.message


def test_duplicate_keys_name_both_lines() -> None:
    with pytest.raises(PolicyError) as info:  # ReadError sits in the policies error tree
        parse_yaml("spec:\n  a: 1\n  b: 2\n  a: 3\n")
    assert isinstance(info.value, ReadError)
    assert info.value.line == 4
    assert info.value.path == ("spec",)
    assert info.value.message == "duplicate key 'a' (first at line 2)"


def test_merge_keys_and_non_string_keys_are_rejected() -> None:
    with pytest.raises(ReadError, match="merge keys"):
        parse_yaml("base: &b {x: 1}\nother:\n  <<: *b\n")
    with pytest.raises(ReadError, match="mapping keys must be plain strings") as info:
        parse_yaml("a: 1\n2: b\n")
    assert info.value.line == 2


def test_malformed_yaml_reports_line_and_column() -> None:
    with pytest.raises(ReadError) as info:
        parse_yaml("a: 1\nb: [1, 2\nc: 3\n")
    assert info.value.message.startswith("malformed YAML: while parsing a flow sequence")
    assert info.value.line == 2  # where the unclosed "[" starts
    assert "(line 3, column 2)" in info.value.message  # where the parser gave up


def test_billion_laughs_stops_at_the_node_budget() -> None:
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        levels.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    with pytest.raises(ReadError, match="after expanding aliases"):
        parse_yaml("\n".join(levels) + "\n")


def test_alias_count_depth_and_recursion_caps() -> None:
    many = "a: &a 1\nb: [" + ", ".join(["*a"] * 5) + "]\n"
    with pytest.raises(ReadError, match="more than 4 YAML aliases"):
        parse_yaml(many, Limits(max_aliases=4))
    assert parse_yaml(many, Limits(max_aliases=5))[0].data["b"] == [1] * 5
    with pytest.raises(ReadError, match="nested deeper than 64 levels"):
        parse_yaml("[" * 200 + "]" * 200)
    with pytest.raises(ReadError, match="recursive YAML alias"):
        parse_yaml("a: &a [*a]\n")


def test_json_is_strict_and_tracks_lines() -> None:
    (doc,) = parse_json('{\n  "a": [1,\n    {"b": "NO"}]\n}\n')
    assert doc.data == {"a": [1, {"b": "NO"}]}
    assert doc.lines[("a", 1, "b")] == 3
    with pytest.raises(ReadError, match="duplicate key 'a'"):
        parse_json('{"a": 1, "a": 2}')
    with pytest.raises(ReadError, match="NaN is not valid JSON"):
        parse_json('{"a": NaN}')
    with pytest.raises(ReadError, match="malformed JSON") as info:
        parse_json('{\n"a": \n}')
    assert info.value.line == 3
    with pytest.raises(ReadError, match="nested"):
        parse_json("[" * 100 + "]" * 100)


def test_format_path() -> None:
    assert format_path(()) == "<root>"
    assert format_path(("spec", "rules", 2, "match")) == "spec.rules[2].match"
    assert format_path((0, "a")) == "[0].a"
