from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from policies.apikeys import ScryptCost, hash_key
from policies.documents import (
    DOCUMENT_TYPES,
    ApiKeyEntry,
    Kind,
    Match,
    PluginSpec,
    Profile,
    Rule,
    Tenant,
    UnknownClientLocation,
    json_schema,
)


def error_messages(exc: ValidationError) -> list[str]:
    return [str(e["msg"]) for e in exc.errors()]


def test_rule_needs_exactly_one_kind_of_selection() -> None:
    with pytest.raises(ValidationError) as info:
        Rule(name="r", effect="allow")
    assert "expected a selection" in error_messages(info.value)[0]
    with pytest.raises(ValidationError, match="cannot be combined"):
        Rule(name="r", effect="allow", all_regions=True, regions=("eu-west",))
    with pytest.raises(ValidationError, match="allow rules only"):
        Rule(name="r", effect="deny", regions=("a",), on_saturation="reject")
    rule = Rule(name="r", effect="deny", jurisdictions=("eea",), outside=True)
    assert rule.outside


def test_match_refuses_empty_lists() -> None:
    with pytest.raises(ValidationError, match="omit the field to match anything"):
        Match(tenants=())
    assert Match().tenants is None


def test_unknown_location_settings_are_consistent() -> None:
    with pytest.raises(ValidationError, match="needs a 'jurisdiction'"):
        UnknownClientLocation(action="assume")
    with pytest.raises(ValidationError, match="takes no 'jurisdiction'"):
        UnknownClientLocation(action="deny", jurisdiction="eu")


def test_tenant_shares_and_keys() -> None:
    share = [{"region": "a", "share": 0.7}, {"region": "b", "share": 0.4}]
    with pytest.raises(ValidationError, match=r"add up to 1\.1; expected at most 1"):
        Tenant.model_validate({"id": "t", "regional_shares": share})
    twice = [{"region": "a", "share": 0.2}, {"region": "a", "share": 0.2}]
    with pytest.raises(ValidationError, match="appears twice"):
        Tenant.model_validate({"id": "t", "regional_shares": twice})
    with pytest.raises(ValidationError, match="never the key itself"):
        ApiKeyEntry(id="demo", hash="gtm-demo-eu")
    with pytest.raises(ValidationError, match="power of two"):
        ApiKeyEntry(id="demo", hash="scrypt$1000$8$1$AAAAAAAAAAA$" + "A" * 43)
    good = hash_key("gtm-demo-eu", ScryptCost(n=1024))
    assert ApiKeyEntry(id="demo", hash=good).hash == good


def test_plugin_name_defaults_to_type_and_profile_refs() -> None:
    assert PluginSpec(type="max-score-picker").plugin_name == "max-score-picker"
    profile = Profile.model_validate(
        {
            "name": "p",
            "tier": "zone",
            "filters": ["health"],
            "scorers": [{"ref": "ttft", "weight": 2}, {"ref": "health"}],
            "picker": "pick",
            "cost_model": "ttft",
        }
    )
    assert profile.refs() == ("health", "ttft", "pick")
    with pytest.raises(ValidationError, match="greater than 0"):
        Profile.model_validate(
            {"name": "p", "tier": "zone", "scorers": [{"ref": "x", "weight": 0}], "picker": "x"}
        )


def test_models_are_frozen() -> None:
    rule = Rule(name="r", effect="allow", all_regions=True)
    with pytest.raises(ValidationError, match="frozen"):
        rule.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("kind", list(Kind))
def test_json_schema_per_kind(kind: Kind) -> None:
    schema: dict[str, Any] = json_schema(kind)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["kind"]["const"] == kind.value
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"apiVersion", "kind", "metadata", "spec"}
    assert DOCUMENT_TYPES[kind].__name__.startswith(kind.value)


def test_json_schema_of_any_document_discriminates_on_kind() -> None:
    schema: dict[str, Any] = json_schema()
    assert schema["discriminator"]["propertyName"] == "kind"
    assert len(schema["oneOf"]) == len(Kind)
    region = schema["$defs"]["Region"]["properties"]
    assert region["id"]["pattern"] == "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"
    assert region["country"]["pattern"] == "^[A-Z]{2}$"
