from __future__ import annotations

import re

import pytest

from policies.apikeys import (
    DEFAULT_COST,
    ScryptCost,
    generate_key,
    hash_key,
    key_id,
    parse_hash,
    verify_key,
)
from policies.errors import ApiKeyError

FAST = ScryptCost(n=1024)  # tests only: production hashes use DEFAULT_COST


def test_key_ids() -> None:
    assert key_id("gtm-demo-global") == "demo"
    assert key_id("gtm-demo-eu") == "demo"
    assert key_id("gtm-ab12-secret-with-dashes_and_underscores") == "ab12"
    for bad in ("demo-global", "gtm-", "gtm-demo", "gtm-Demo-x", "gtm-demo-", "gtm-demo-sp ace"):
        with pytest.raises(ApiKeyError) as info:
            key_id(bad)
        assert str(info.value) == "malformed API key: expected 'gtm-<id>-<secret>'"


def test_generated_keys_are_random_and_well_formed() -> None:
    keys = {generate_key() for _ in range(50)}
    assert len(keys) == 50
    for key in keys:
        assert re.fullmatch(r"gtm-[a-z2-7]{8}-[A-Za-z0-9_-]{43}", key)
        assert len(key_id(key)) == 8


def test_hash_and_verify() -> None:
    stored = parse_hash(hash_key("gtm-demo-eu", FAST))
    assert stored.cost == FAST
    assert len(stored.salt) == 16
    assert verify_key("gtm-demo-eu", stored)
    assert not verify_key("gtm-demo-eU", stored)
    assert not verify_key("gtm-demo-global", stored)


def test_hashes_are_salted() -> None:
    assert hash_key("gtm-demo-eu", FAST) != hash_key("gtm-demo-eu", FAST)
    salt = b"0123456789abcdef"
    assert hash_key("gtm-demo-eu", FAST, salt=salt) == hash_key("gtm-demo-eu", FAST, salt=salt)


def test_hash_format_and_default_cost() -> None:
    text = hash_key("gtm-x-y", FAST)
    assert re.fullmatch(r"scrypt\$1024\$8\$1\$[A-Za-z0-9_-]{22}\$[A-Za-z0-9_-]{43}", text)
    assert (DEFAULT_COST.n, DEFAULT_COST.r, DEFAULT_COST.p) == (16384, 8, 1)
    with pytest.raises(ApiKeyError):
        hash_key("not a key", FAST)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("bcrypt$1$2$3$4$5", "expected 'scrypt$N$r$p$salt$digest'"),
        ("scrypt$1000$8$1$AAAAAAAAAAA$" + "A" * 43, "power of two"),
        ("scrypt$1048576$64$1$AAAAAAAAAAA$" + "A" * 43, "more than 256 MiB"),
        ("scrypt$1024$0$1$AAAAAAAAAAA$" + "A" * 43, "r must be 1..64"),
        ("scrypt$1024$8$1$AAAA$" + "A" * 43, "salt of ≥ 8 bytes"),
        ("scrypt$x$8$1$AAAAAAAAAAA$" + "A" * 43, "invalid scrypt hash"),
    ],
)
def test_parse_hash_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_hash(text)
