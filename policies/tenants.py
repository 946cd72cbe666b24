"""Tenant lookup by API key, with a bounded in-memory cache of verified keys.

The first request with a key costs one scrypt per stored entry sharing its id (see
:mod:`policies.apikeys`); later requests cost one HMAC-SHA256 and a dict lookup. The
cache is keyed by HMAC(process-local random secret, key), so neither the cache nor a
memory dump of it is an offline oracle for keys, and it never holds a key itself.
Failed verifications are cached too, so one wrong key retried in a loop costs one
scrypt, not one per attempt (rate-limiting *distinct* wrong keys is the tiers' job).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping

from policies.apikeys import StoredHash, key_id, parse_hash, verify_key
from policies.documents import Tenant
from policies.errors import ApiKeyError

#: Entries in the verified-key cache. Each is ~100 bytes; 16k covers far more active
#: keys than one deployment has tenants.
DEFAULT_CACHE_SIZE = 16_384


class TenantDirectory:
    """Tenants by id and by API key. Safe to call from several threads."""

    def __init__(self, tenants: Mapping[str, Tenant], *, cache_size: int = DEFAULT_CACHE_SIZE):
        self._tenants = dict(tenants)
        index: dict[str, list[tuple[str, StoredHash]]] = {}
        for tenant in tenants.values():
            for entry in tenant.api_keys:
                index.setdefault(entry.id, []).append((tenant.id, parse_hash(entry.hash)))
        self._by_key_id = {k: tuple(v) for k, v in index.items()}
        self._cache_secret = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, str | None] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def get(self, tenant_id: str) -> Tenant | None:
        return self._tenants.get(tenant_id)

    def __len__(self) -> int:
        return len(self._tenants)

    def authenticate(self, api_key: str) -> Tenant:
        """The tenant owning ``api_key``.

        Raises:
            ApiKeyError: malformed or unknown key. The message names the key id at
                most, never the secret.
        """
        ident = key_id(api_key)
        candidates = self._by_key_id.get(ident)
        if not candidates:
            raise ApiKeyError(f"unknown API key (id {ident!r})")
        fingerprint = hmac.new(self._cache_secret, api_key.encode(), hashlib.sha256).digest()
        with self._lock:
            hit = fingerprint in self._cache
            tenant_id = self._cache.get(fingerprint)
            if hit:
                self._cache.move_to_end(fingerprint)
        if not hit:
            tenant_id = next((t for t, stored in candidates if verify_key(api_key, stored)), None)
            self._remember(fingerprint, tenant_id)
        if tenant_id is None:
            raise ApiKeyError(f"invalid API key (id {ident!r})")
        return self._tenants[tenant_id]

    def _remember(self, fingerprint: bytes, tenant_id: str | None) -> None:
        with self._lock:
            self._cache[fingerprint] = tenant_id
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def allows_model(self, tenant_id: str, model: str) -> bool:
        """Whether the tenant may use ``model`` (unknown tenants may use nothing)."""
        tenant = self._tenants.get(tenant_id)
        if tenant is None:
            return False
        return tenant.allowed_models is None or model in tenant.allowed_models
