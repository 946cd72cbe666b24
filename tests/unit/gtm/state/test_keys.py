from __future__ import annotations

from collections.abc import Callable

import pytest

from gtm.models import DrainTarget
from gtm.state import keys
from gtm.state.keys import Kind, ParsedKey

# Every builder, with the ids it takes, the kind it builds and the parts parse() returns.
BUILDERS: list[tuple[Callable[..., str], tuple[str, ...], Kind, tuple[str, ...]]] = [
    (keys.region, ("eu-west",), Kind.REGION, ("eu-west",)),
    (keys.zone, ("eu-west", "eu-west-a"), Kind.ZONE, ("eu-west", "eu-west-a")),
    (keys.gpu, ("eu-west", "a", "gpu-0"), Kind.GPU, ("eu-west", "a", "gpu-0")),
    (keys.zone_summary, ("eu-west", "a"), Kind.ZONE_SUMMARY, ("eu-west", "a")),
    (keys.region_summary, ("us-east",), Kind.REGION_SUMMARY, ("us-east",)),
    (keys.tenant, ("acme",), Kind.TENANT, ("acme",)),
    (keys.policy, ("residency", "eu.v2"), Kind.POLICY, ("residency", "eu.v2")),
    (keys.quota_lease, ("acme", "replica_1"), Kind.QUOTA_LEASE, ("acme", "replica_1")),
    (keys.audit_anchor, ("global-0123abcd",), Kind.AUDIT_ANCHOR, ("global-0123abcd",)),
]


def test_every_kind_has_a_builder_here() -> None:
    assert {kind for _, _, kind, _ in BUILDERS} | {Kind.DRAIN} == set(Kind)


@pytest.mark.parametrize(("build", "ids", "kind", "parts"), BUILDERS)
def test_build_then_parse_round_trips(
    build: Callable[..., str], ids: tuple[str, ...], kind: Kind, parts: tuple[str, ...]
) -> None:
    key = build(*ids)
    assert key.startswith(keys.ROOT + kind.value + "/")
    assert keys.parse(key) == ParsedKey(kind, parts)
    assert key.startswith(keys.prefix(kind, *ids[:-1]))


@pytest.mark.parametrize("target", list(DrainTarget))
def test_drain_round_trips(target: DrainTarget) -> None:
    key = keys.drain(target, "eu-west")
    assert keys.parse(key) == ParsedKey(Kind.DRAIN, (target.value, "eu-west"))


def test_prefixes_end_in_a_slash_so_siblings_do_not_match() -> None:
    assert keys.prefix(Kind.ZONE, "eu") == "/gtm/v1/zones/eu/"
    assert not keys.zone("eu-west", "a").startswith(keys.prefix(Kind.ZONE, "eu"))
    assert keys.prefix(Kind.ZONE_SUMMARY) == "/gtm/v1/summaries/zones/"
    assert not keys.region_summary("x").startswith(keys.prefix(Kind.ZONE_SUMMARY))


@pytest.mark.parametrize(
    "bad", ["", "a/b", "-lead", ".hidden", "sp ace", "ü", "a" * 129, "..", "x\n"]
)
def test_invalid_segments_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid key segment"):
        keys.region(bad)
    with pytest.raises(ValueError, match="invalid key segment"):
        keys.gpu("eu-west", bad, "gpu-0")
    with pytest.raises(ValueError, match="invalid key segment"):
        keys.prefix(Kind.GPU, bad)


def test_longest_valid_segment_is_accepted() -> None:
    longest = "a" + "b" * 127
    assert keys.parse(keys.tenant(longest)) == ParsedKey(Kind.TENANT, (longest,))


@pytest.mark.parametrize(
    "foreign",
    [
        "/gtm/v2/regions/eu",  # another schema version
        "/other/regions/eu",
        "/gtm/v1/unknown/eu",
        "/gtm/v1/regions/eu/extra",  # wrong arity
        "/gtm/v1/gpus/eu/a",  # too few parts
        "/gtm/v1/regions/",  # empty id
        "/gtm/v1/regions/-bad",  # invalid segment
        "/gtm/v1/summaries/eu",  # "summaries" alone is not a kind
    ],
)
def test_keys_outside_the_schema_parse_to_none(foreign: str) -> None:
    assert keys.parse(foreign) is None


def test_summary_kinds_win_over_shorter_matches() -> None:
    parsed = keys.parse(keys.zone_summary("eu-west", "a"))
    assert parsed is not None
    assert parsed.kind is Kind.ZONE_SUMMARY
