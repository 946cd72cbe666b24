from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from policies.documents import SaturationPolicy, UnknownLocationAction
from policies.errors import PolicyValidationError, Problem
from policies.loader import load_paths
from policies.policyset import MAX_KEYS_PER_ID, known_countries
from tests.unit.policies.conftest import document


def problems_of(path: Path) -> tuple[Problem, ...]:
    with pytest.raises(PolicyValidationError) as info:
        load_paths([path])
    return info.value.problems


def add(directory: Path, name: str, kind: str, spec: str) -> Path:
    path = directory / name
    path.write_text(document(kind, name.split(".")[0], spec))
    return path


def test_known_countries_are_iso_codes() -> None:
    countries = known_countries()
    assert len(countries) == 252
    assert {"DE", "NO", "US", "SG"} <= countries
    assert "XX" not in countries


def test_duplicate_ids_name_the_first_definition(examples: Path) -> None:
    path = add(
        examples,
        "zz-regions.yaml",
        "Regions",
        '  regions:\n    - id: eu-west\n      country: "IE"\n      location: {lat: 1, lon: 1}\n',
    )
    (problem,) = problems_of(examples)
    assert (problem.file, problem.line, problem.path) == (str(path), 7, "spec.regions[0].id")
    assert (
        problem.message == f"region 'eu-west' is already defined at {examples / 'regions.yaml'}:21"
    )


def test_duplicate_document_names(examples: Path) -> None:
    shutil.copy(examples / "tenants.yaml", examples / "tenants-copy.yaml")
    problems = problems_of(examples)
    assert problems[0].file == str(examples / "tenants.yaml")
    assert problems[0].message.startswith("a Tenants document named 'example-tenants' is already")
    assert any("tenant 'demo-global' is already defined" in p.message for p in problems)


def test_unknown_references(examples: Path) -> None:
    path = add(
        examples,
        "zz.yaml",
        "Residency",
        "  rules:\n"
        "    - name: refs\n"
        "      match:\n"
        "        {tenants: [ghost], client_jurisdictions: [atlantis], client_countries: [XX]}\n"
        "      effect: deny\n"
        "      jurisdictions: [narnia]\n"
        '      countries: ["ZZ"]\n',
    )
    problems = problems_of(examples)
    assert all(p.file == str(path) for p in problems)
    assert [(p.line, p.path, p.message.split(" (")[0]) for p in problems] == [
        (9, "spec.rules[0].match.tenants[0]", "unknown tenant 'ghost'"),
        (9, "spec.rules[0].match.client_countries[0]", "unknown country code 'XX'"),
        (9, "spec.rules[0].match.client_jurisdictions[0]", "unknown jurisdiction 'atlantis'"),
        (11, "spec.rules[0].jurisdictions[0]", "unknown jurisdiction 'narnia'"),
        (12, "spec.rules[0].countries[0]", "unknown country code 'ZZ'"),
    ]
    assert "(known: acme-health, demo-eu, demo-global)" in problems[0].message


def test_unknown_plugin_and_share_region(examples: Path) -> None:
    text = (
        (examples / "routing-profiles.yaml")
        .read_text()
        .replace("picker: max-score\n", "picker: best\n", 1)
    )
    (examples / "routing-profiles.yaml").write_text(text)
    text = (examples / "tenants.yaml").read_text().replace("region: us-west", "region: us-north")
    (examples / "tenants.yaml").write_text(text)
    problems = problems_of(examples)
    messages = {(Path(p.file).name, p.path): p.message for p in problems}
    assert messages[("tenants.yaml", "spec.tenants[2].regional_shares[1].region")].startswith(
        "unknown region 'us-north'"
    )
    # The first profile picking max-score is regional-default, the second.
    assert messages[("routing-profiles.yaml", "spec.profiles[1].picker")].startswith(
        "unknown plugin 'best' (known: canary, fits, health,"
    )


def test_jurisdiction_includes_cycles_and_labels(tmp_path: Path) -> None:
    add(
        tmp_path,
        "j.yaml",
        "Jurisdictions",
        "  jurisdictions:\n"
        "    - id: a\n      include: [b]\n"
        "    - id: b\n      include: [a, missing]\n"
        '    - id: c\n      countries: ["FR"]\n      include: [eu]\n',
    )
    add(
        tmp_path,
        "r.yaml",
        "Regions",
        '  regions:\n    - id: x\n      country: "US"\n      location: {lat: 0, lon: 0}\n'
        "      jurisdiction: eu\n",
    )
    problems = problems_of(tmp_path)
    assert [p.message for p in problems] == [
        "jurisdiction includes itself (a → b → a)",
        "unknown jurisdiction 'missing' (known: a, b, c, continent-af, continent-an, "
        "continent-as, continent-eu, continent-na, continent-oc, continent-sa, eea, efta, …)",
        "jurisdiction 'eu' does not contain US",
    ]
    assert problems[2].path == "spec.regions[0].jurisdiction"


def test_settings_may_be_split_but_not_contradict(examples: Path) -> None:
    path = add(
        examples,
        "zz.yaml",
        "Residency",
        "  unknown_client_location: {action: deny}\n  on_saturation: spill_within_allowed\n",
    )
    (problem,) = problems_of(examples)
    assert (problem.file, problem.line, problem.path) == (
        str(path),
        6,
        "spec.unknown_client_location",
    )
    assert problem.message == f"conflicts with the setting at {examples / 'residency.yaml'}:14"


def test_settings_default_to_fail_closed(tmp_path: Path) -> None:
    add(tmp_path, "r.yaml", "Residency", "  rules: []\n")
    policy_set = load_paths([tmp_path])
    assert policy_set.settings.unknown_client_location.action is UnknownLocationAction.DENY
    assert policy_set.settings.on_saturation is SaturationPolicy.REJECT


def test_too_many_keys_share_an_id(tmp_path: Path) -> None:
    entry = (
        "        - {id: same, hash: 'scrypt$1024$8$1$AAAAAAAAAAAAAAAAAAAAAA$" + "A" * 43 + "'}\n"
    )
    add(tmp_path, "t.yaml", "Tenants", "  tenants:\n    - id: t\n      api_keys:\n" + entry * 5)
    (problem,) = problems_of(tmp_path)
    assert problem.path == f"spec.tenants[0].api_keys[{MAX_KEYS_PER_ID}].id"
    assert problem.message.startswith("more than 4 keys share the key id 'same'")


def test_digest_ignores_file_names_and_order(examples: Path, tmp_path: Path) -> None:
    first = load_paths([examples])
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for i, path in enumerate(sorted(examples.iterdir(), reverse=True)):
        shutil.copy(path, renamed / f"{i}-{path.name}")
    assert load_paths([renamed]).digest == first.digest
    text = (examples / "regions.yaml").read_text().replace("Dublin", "Dublin, Ireland")
    (examples / "regions.yaml").write_text(text)
    assert load_paths([examples]).digest != first.digest


def test_profile_config_matches_the_routing_registry_shape(examples: Path) -> None:
    policy_set = load_paths([examples])
    config = policy_set.profile_config("regional-default")
    assert config["name"] == "regional-default"
    assert [p["name"] for p in config["plugins"]] == [
        "residency",
        "health",
        "model",
        "ttft",
        "prefix-affinity",
        "max-score",
        "ttft-cost",
    ]
    assert config["profile"] == {
        "filters": ["residency", "health", "model"],
        "scorers": [
            {"ref": "ttft", "weight": 1.0},
            {"ref": "prefix-affinity", "weight": 0.3},
        ],
        "picker": "max-score",
        "cost_model": "ttft-cost",
    }
    with pytest.raises(KeyError):
        policy_set.profile_config("nope")
