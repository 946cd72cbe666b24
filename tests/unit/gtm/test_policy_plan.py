from __future__ import annotations

import pytest

from gtm.policy_plan import Change, field_diff, plan_changes
from policies.errors import PolicyValidationError
from policies.loader import Format, examples_path, load_bytes, load_documents
from policies.policyset import LoadedDocument, document_json


@pytest.fixture(scope="module")
def examples() -> tuple[LoadedDocument, ...]:
    return load_documents([examples_path()])


def stored_of(docs: tuple[LoadedDocument, ...]) -> dict[tuple[str, str], bytes]:
    return {(d.kind.value, d.name): document_json(d.document) for d in docs}


def test_field_diff_names_each_changed_field() -> None:
    before = {"spec": {"tenants": [{"id": "a", "quotas": {"rpm": 1}}, {"id": "b"}], "x": [1, 2]}}
    after = {"spec": {"tenants": [{"id": "a", "quotas": {"rpm": 2}}, {"id": "c"}], "x": [1, 3]}}
    assert field_diff(before, after) == [
        "spec.tenants[a].quotas.rpm: 1 → 2",
        '- spec.tenants[b]: {"id": "b"}',
        '+ spec.tenants[c]: {"id": "c"}',
        "spec.x[1]: 2 → 3",
    ]
    assert field_diff({"a": [1]}, {"a": [1, 2]}) == ["a: [1] → [1, 2]"]
    assert field_diff(1, 1) == []


def test_field_diff_is_short() -> None:
    before = {f"k{i}": i for i in range(20)}
    after = {f"k{i}": i + 1 for i in range(20)}
    lines = field_diff(before, after, limit=3)
    assert lines == ["k0: 0 → 1", "k1: 1 → 2", "k10: 10 → 11", "… 17 more field change(s)"]
    long = field_diff("a", "b" * 200)[0]
    assert long.endswith("…")
    assert len(long) < 100


def test_without_prune_the_stored_documents_not_given_are_kept(
    examples: tuple[LoadedDocument, ...],
) -> None:
    routing = next(d for d in examples if d.kind.value == "RoutingProfiles")
    others = tuple(d for d in examples if d is not routing)
    stored = stored_of(examples) | {("Tenants", "leftover"): b"{}"}
    plan = plan_changes(examples, stored, others, prune=False, base_generation=3, base_revision=9)
    fates = {c.ref: c.change for c in plan.changes}
    assert fates["RoutingProfiles/example-routing"] is Change.KEPT
    assert fates["Tenants/leftover"] is Change.DISCARDED
    assert set(plan.policy_set.profiles) == {
        "global-default",
        "regional-default",
        "zone-default",
        "zone-goodput",
    }
    assert not plan.writes  # a leftover alone is no reason for a generation
    named = set(stored_of(examples))  # what the commit names: not the leftover
    pruned = plan_changes(
        (), stored, others, prune=True, base_generation=3, base_revision=9, named=named
    )
    assert [c.ref for c in pruned.of(Change.DELETED)] == ["RoutingProfiles/example-routing"]
    assert [c.ref for c in pruned.of(Change.DISCARDED)] == ["Tenants/leftover"]
    assert not pruned.policy_set.profiles
    assert pruned.counts() == "5 unchanged, 1 deleted, 1 discarded"


TENANT = """\
apiVersion: gtm.dev/v1
kind: Tenants
metadata: {name: load-test}
spec:
  tenants: [{id: load-test, name: Load test, regional_shares: [{region: REGION, share: 1}]}]
"""


def tenant_document(region: str) -> LoadedDocument:
    (doc,) = load_bytes(TENANT.replace("REGION", region).encode(), "load-test.yaml", Format.YAML)
    return doc


def test_the_next_generation_is_checked_whole(examples: tuple[LoadedDocument, ...]) -> None:
    stored = stored_of(examples)
    # A tenant alone names a region only the kept documents define: valid.
    plan = plan_changes(
        examples, stored, (tenant_document("eu-west"),), prune=False,
        base_generation=1, base_revision=1,
    )  # fmt: skip
    assert [c.ref for c in plan.of(Change.ADDED)] == ["Tenants/load-test"]
    assert "load-test" in plan.policy_set.tenants
    # One naming a region nobody defines is refused at its file and line.
    with pytest.raises(PolicyValidationError, match=r"load-test.yaml:\d+: .*'planet-x'"):
        plan_changes(
            examples, stored, (tenant_document("planet-x"),), prune=False,
            base_generation=1, base_revision=1,
        )  # fmt: skip
    # With prune it is the whole policy, and no document defines eu-west.
    with pytest.raises(PolicyValidationError, match="'eu-west'"):
        plan_changes(
            examples, stored, (tenant_document("eu-west"),), prune=True,
            base_generation=1, base_revision=1,
        )  # fmt: skip
