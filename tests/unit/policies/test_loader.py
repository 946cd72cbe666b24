from __future__ import annotations

from pathlib import Path

import pytest

from policies.errors import PolicyConflictError, PolicyValidationError, Problem
from policies.loader import (
    Format,
    LoadOptions,
    builtin_jurisdictions_path,
    load_bytes,
    load_examples,
    load_file,
    load_paths,
)
from tests.unit.policies.conftest import document

REGIONS = document(
    "Regions",
    "r",
    '  regions:\n    - id: eu-west\n      country: "IE"\n      location: {lat: 53.3, lon: -6.3}\n',
)


def problems_of(paths: list[Path], options: LoadOptions | None = None) -> tuple[Problem, ...]:
    with pytest.raises(PolicyValidationError) as info:
        load_paths(paths, options)
    return info.value.problems


def only(problems: tuple[Problem, ...]) -> Problem:
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


def test_examples_load() -> None:
    policy_set = load_examples()
    assert set(policy_set.regions) == {
        "us-east",
        "us-west",
        "eu-west",
        "eu-central",
        "ap-northeast",
        "ap-southeast",
    }
    assert set(policy_set.tenants) == {"demo-global", "demo-eu", "acme-health"}
    assert {p.tier.value for p in policy_set.profiles.values()} == {"global", "regional", "zone"}
    assert "eea" in policy_set.jurisdictions
    assert len(policy_set.digest) == 64


def test_malformed_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(REGIONS + "    - id: [unclosed\n")
    problem = only(problems_of([bad]))
    assert problem.file == str(bad)
    assert problem.line == 10
    assert problem.message.startswith("malformed YAML:")
    assert str(problem).startswith(f"{bad}:10: <root>: malformed YAML")


def test_unknown_field_names_the_expected_fields(tmp_path: Path) -> None:
    bad = tmp_path / "regions.yaml"
    bad.write_text(REGIONS + "      contry: DE\n")
    problem = only(problems_of([bad]))
    assert (problem.line, problem.path) == (10, "spec.regions[0].contry")
    assert problem.message.startswith("unknown field 'contry' (expected one of: id, name, country")


def test_wrong_type(tmp_path: Path) -> None:
    bad = tmp_path / "regions.yaml"
    bad.write_text(REGIONS.replace("lat: 53.3", "lat: north"))
    problem = only(problems_of([bad]))
    assert (problem.line, problem.path) == (9, "spec.regions[0].location.lat")
    assert (
        problem.message
        == "expected a valid number, unable to parse string as a number, got str 'north'"
    )


def test_pattern_errors_say_what_was_expected(tmp_path: Path) -> None:
    bad = tmp_path / "regions.yaml"
    bad.write_text(REGIONS.replace("id: eu-west", "id: EU West"))
    problem = only(problems_of([bad]))
    assert (problem.line, problem.path) == (7, "spec.regions[0].id")
    assert "expected a lowercase id" in problem.message
    assert "'EU West'" in problem.message


def test_missing_field_and_envelope_errors(tmp_path: Path) -> None:
    bad = tmp_path / "a.yaml"
    bad.write_text(REGIONS.replace('      country: "IE"\n', ""))
    problem = only(problems_of([bad]))
    assert (problem.path, problem.message) == (
        "spec.regions[0].country",
        "required field is missing",
    )
    assert problem.line == 7
    bad.write_text(REGIONS.replace("gtm.dev/v1", "gtm.dev/v2"))
    problem = only(problems_of([bad]))
    assert (problem.line, problem.path) == (1, "apiVersion")
    assert problem.message == "expected 'gtm.dev/v1', got str 'gtm.dev/v2'"
    bad.write_text(REGIONS.replace("kind: Regions", "kind: Region"))
    problem = only(problems_of([bad]))
    assert (problem.line, problem.path) == (2, "kind")
    assert problem.message.startswith("expected one of Jurisdictions, Regions, Residency")
    bad.write_text("- just\n- a list\n")
    problem = only(problems_of([bad]))
    assert problem.message.startswith("expected a mapping with 'apiVersion'")


def test_unsafe_tag(tmp_path: Path) -> None:
    bad = tmp_path / "evil.yaml"
    bad.write_text(REGIONS + "      name: !!python/object/apply:os.system ['touch pwned']\n")
    problem = only(problems_of([bad]))
    assert (problem.line, problem.path) == (10, "spec.regions[0].name")
    assert "unsafe or unsupported YAML tag '!!python/object/apply:os.system'" in problem.message
    assert not (tmp_path / "pwned").exists()


def test_ten_megabyte_file_is_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: [" + b"1, " * (10 * 1024 * 1024 // 3) + b"]\n")
    problem = only(problems_of([big]))
    assert problem.file == str(big)
    assert problem.line == 0
    assert "more than the 1048576-byte limit" in problem.message
    assert str(problem).startswith(f"{big}: <root>: file is ")
    tiny = LoadOptions(max_bytes=100)
    assert "100-byte limit" in only(problems_of([tmp_path / "big.yaml"], tiny)).message


def test_conflicting_rules(examples: Path) -> None:
    extra = examples / "zz-conflict.yaml"
    extra.write_text(
        document(
            "Residency",
            "conflict",
            "  rules:\n"
            "    - name: eu-tenant-in-us\n"
            "      match: {tenants: [demo-eu]}\n"
            "      effect: allow\n"
            "      jurisdictions: [us]\n",
        )
    )
    with pytest.raises(PolicyConflictError) as info:
        load_paths([examples])
    problem = only(info.value.problems)
    assert (problem.file, problem.line) == (str(extra), 7)
    assert problem.path == "rule 'eu-tenant-in-us'"
    assert (
        f"conflicts with rule 'eu-tenant-in-eu' at {examples / 'residency.yaml'}:"
        in problem.message
    )
    assert "{eu-central, eu-west} vs {us-east, us-west}" in problem.message


def test_reference_to_unknown_region(examples: Path) -> None:
    extra = examples / "zz-unknown.yaml"
    extra.write_text(
        document(
            "Residency",
            "unknown",
            "  rules:\n"
            "    - name: mars\n"
            "      match: {data_classes: [martian]}\n"
            "      effect: allow\n"
            "      regions: [eu-west, mars-north]\n",
        )
    )
    problem = only(problems_of([examples]))
    assert (problem.file, problem.line) == (str(extra), 10)
    assert problem.path == "spec.rules[0].regions[1]"
    assert problem.message.startswith("unknown region 'mars-north' (known: ap-northeast,")


def test_directory_is_all_or_nothing(examples: Path) -> None:
    (examples / "broken.yaml").write_text("kind: [\n")
    problems = problems_of([examples])
    assert [p.file for p in problems] == [str(examples / "broken.yaml")]


def test_every_problem_of_every_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(REGIONS.replace("eu-west", "Bad"))
    (tmp_path / "b.yaml").write_text(REGIONS.replace("lat: 53.3", "lat: 99"))
    problems = problems_of([tmp_path])
    assert [(Path(p.file).name, p.line) for p in problems] == [("a.yaml", 7), ("b.yaml", 9)]


def test_paths_that_do_not_exist_or_hold_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a policy")
    problems = problems_of([tmp_path / "nope", empty])
    assert [p.message for p in problems] == [
        "no such file or directory",
        "directory holds no .yaml/.yml/.json files",
    ]


def test_empty_file_and_invalid_utf8(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# only a comment\n")
    assert only(problems_of([empty])).message == "file holds no document"
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(REGIONS.encode() + b"      name: Z\xfcrich\n")
    problem = only(problems_of([latin]))
    assert (problem.line, problem.message) == (10, "not valid UTF-8 text")


def test_json_documents_and_lines(tmp_path: Path) -> None:
    good = tmp_path / "regions.json"
    good.write_text(
        '{"apiVersion": "gtm.dev/v1", "kind": "Regions", "metadata": {"name": "r"},\n'
        ' "spec": {"regions": [\n'
        '   {"id": "eu-west", "country": "IE", "location": {"lat": 53.3, "lon": -6.3}}]}}\n'
    )
    (doc,) = load_file(good)
    assert doc.name == "r"
    good.write_text(good.read_text().replace('"lat": 53.3', '"lat": "x"'))
    problem = only(problems_of([good]))
    assert (problem.line, problem.path) == (3, "spec.regions[0].location.lat")


def test_several_documents_in_one_file(tmp_path: Path) -> None:
    path = tmp_path / "both.yaml"
    tenants = document("Tenants", "t", "  tenants:\n    - id: acme\n")
    path.write_text(REGIONS + "---\n" + tenants)
    policy_set = load_paths([path])
    assert set(policy_set.tenants) == {"acme"}
    assert set(policy_set.regions) == {"eu-west"}


def test_defaults_can_be_left_out(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(REGIONS)
    assert "eu" not in load_paths([path], LoadOptions(include_defaults=False)).jurisdictions
    assert "eu" in load_paths([path]).jurisdictions


def test_load_bytes_for_store_values() -> None:
    raw = builtin_jurisdictions_path().read_bytes()
    (doc,) = load_bytes(raw, "key", Format.YAML)
    assert (doc.source, doc.name) == ("key", "builtin")
    with pytest.raises(PolicyValidationError, match="key: <root>: file is"):
        load_bytes(raw, "key", Format.YAML, LoadOptions(max_bytes=10))
