"""API keys: format, salted scrypt hashes, constant-time verification.

Design. A key looks like ``gtm-<id>-<secret>``: ``id`` is a short public lookup id
(``[a-z0-9]{1,32}``), ``secret`` the rest. Tenants files store only ``id`` and a
salted scrypt hash of the *whole* key. To authenticate, a tier parses ``id`` from
the presented key, looks up the (usually one) stored entry with that id, and runs
one scrypt — so the cost is O(keys sharing the id), never O(tenants × scrypt), and a
key with an unknown id is refused without any scrypt (garbage costs nothing).
:class:`policies.tenants.TenantDirectory` then caches verified keys in memory.

Trade-offs, and why not the alternatives:

* A fast index such as SHA-256(key) or HMAC with a pepper stored in the same file
  would hand anyone holding the file an offline oracle at SHA-256 speed, which makes
  the slow hash pointless for low-entropy keys. The public id reveals nothing about
  the secret.
* One file-wide salt (so the scrypt output itself is the index) avoids the id but
  lets an attacker test each guess against every key at once, and makes every
  garbage key cost a full scrypt: a cheap CPU-exhaustion attack.
* The id is not secret: logs and error messages may show it (never the secret).
  Generated ids are 8 random base32 characters (40 bits), so collisions are rare;
  the demo keys ``gtm-demo-global`` and ``gtm-demo-eu`` share the id ``demo``, which
  costs at most one extra scrypt on first use. A policy set refuses more than
  :data:`policies.policyset.MAX_KEYS_PER_ID` keys per id.

Cost. scrypt N=2^14, r=8, p=1 (16 MiB of memory per check): the parameters Percival
recommends for interactive logins ("Stronger key derivation via sequential
memory-hard functions", 2009, §7; also RFC 7914 §2). Generated keys carry 256 bits
of entropy, so the cost only matters for human-chosen keys. The parameters are stored
with each hash, so they can be raised later without invalidating old hashes.
Salt: 16 random bytes (NIST SP 800-132 §5.1: at least 128 bits).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from policies.errors import ApiKeyError

KEY_PREFIX = "gtm-"
_KEY = re.compile(r"^gtm-([a-z0-9]{1,32})-([A-Za-z0-9_-]{1,256})$")
_SALT_BYTES = 16
_DIGEST_BYTES = 32
_MAX_MEMORY = 256 << 20  # refuse stored parameters that would need more than 256 MiB


@dataclass(frozen=True, slots=True)
class ScryptCost:
    """scrypt parameters: CPU/memory cost ``n`` (a power of two), block size ``r``,
    parallelism ``p``. Memory needed is about 128 × n × r bytes."""

    n: int = 1 << 14
    r: int = 8
    p: int = 1

    def __post_init__(self) -> None:
        if self.n < 2 or self.n & (self.n - 1):
            raise ValueError(f"scrypt n must be a power of two ≥ 2, got {self.n}")
        if not (1 <= self.r <= 64 and 1 <= self.p <= 16):
            raise ValueError(f"scrypt r must be 1..64 and p 1..16, got r={self.r} p={self.p}")
        if self.memory_bytes > _MAX_MEMORY:
            raise ValueError(f"scrypt n={self.n} r={self.r} needs more than 256 MiB")

    @property
    def memory_bytes(self) -> int:
        return 128 * self.n * self.r * (self.p + 2)


DEFAULT_COST = ScryptCost()


def key_id(api_key: str) -> str:
    """The public id inside ``gtm-<id>-<secret>``.

    Raises:
        ApiKeyError: the key is not in that format (the message never shows the key).
    """
    match = _KEY.match(api_key)
    if match is None:
        raise ApiKeyError("malformed API key: expected 'gtm-<id>-<secret>'")
    return match.group(1)


def generate_key() -> str:
    """A new random key: 40-bit id, 256-bit secret (``secrets``, i.e. the OS CSPRNG)."""
    ident = base64.b32encode(secrets.token_bytes(5)).decode().lower()
    return f"{KEY_PREFIX}{ident}-{secrets.token_urlsafe(32)}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _scrypt(api_key: str, salt: bytes, cost: ScryptCost) -> bytes:
    return hashlib.scrypt(
        api_key.encode(),
        salt=salt,
        n=cost.n,
        r=cost.r,
        p=cost.p,
        maxmem=cost.memory_bytes + (1 << 20),
        dklen=_DIGEST_BYTES,
    )


def hash_key(api_key: str, cost: ScryptCost = DEFAULT_COST, *, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$<salt>$<digest>`` (URL-safe base64 without padding)."""
    key_id(api_key)  # refuse malformed keys before hashing them
    salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
    digest = _scrypt(api_key, salt, cost)
    return f"scrypt${cost.n}${cost.r}${cost.p}${_b64(salt)}${_b64(digest)}"


@dataclass(frozen=True, slots=True)
class StoredHash:
    cost: ScryptCost
    salt: bytes
    digest: bytes


def parse_hash(stored: str) -> StoredHash:
    """Split a stored hash; raises ValueError naming what is wrong."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("expected 'scrypt$N$r$p$salt$digest'")
    try:
        cost = ScryptCost(int(parts[1]), int(parts[2]), int(parts[3]))
        salt, digest = _unb64(parts[4]), _unb64(parts[5])
    except (ValueError, TypeError) as exc:
        raise ValueError(f"invalid scrypt hash: {exc}") from None
    if len(salt) < 8 or len(digest) != _DIGEST_BYTES:
        raise ValueError(f"expected a salt of ≥ 8 bytes and a {_DIGEST_BYTES}-byte digest")
    return StoredHash(cost, salt, digest)


def verify_key(api_key: str, stored: StoredHash) -> bool:
    """Whether ``api_key`` hashes to ``stored`` (constant-time comparison)."""
    return hmac.compare_digest(_scrypt(api_key, stored.salt, stored.cost), stored.digest)
