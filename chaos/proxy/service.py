"""What the API does, without HTTP: the proxy collection and its operations.

Each method mirrors a handler of Toxiproxy's ``api.go`` / ``proxy_collection.go`` /
``toxic_collection.go``, including the order in which it checks things (which decides
the error a client sees when a request is wrong in several ways). Request bodies arrive
as raw bytes and are decoded only when the reference would decode them (a toxic update
for an unknown toxic is a 404 whatever the body). Mutations are serialised by one lock,
like the collection mutexes of the reference.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from chaos.proxy import errors, gojson
from chaos.proxy.collection import ToxicSlot
from chaos.proxy.errors import ApiError
from chaos.proxy.metrics import ProxyMetrics
from chaos.proxy.models import (
    ProxyFields,
    ProxyPatch,
    ProxyView,
    ToxicFields,
    ToxicPatch,
    ToxicView,
    go_error,
    parse_direction,
    parse_struct,
    without_nulls,
)
from chaos.proxy.proxy import Proxy, ProxyRuntime
from chaos.proxy.toxics import REGISTRY
from chaos.proxy.toxics.base import Toxic
from gtm.clock import Clock, SystemClock

#: The Toxiproxy release whose API this server implements (``/version``).
TOXIPROXY_VERSION = "2.12.0"

_POPULATE_GO_TYPE = '[]struct { toxiproxy.Proxy; Enabled *bool "json:\\"enabled\\"" }'


@dataclass(frozen=True, slots=True)
class PopulateResult:
    """``/populate``: the proxies handled (None when none, as Go's nil slice) and the
    error that stopped it, if any (earlier items stay applied)."""

    proxies: tuple[ProxyView, ...] | None
    error: ApiError | None = None


def decode(body: bytes) -> Any:
    try:
        return gojson.decode_body(body)
    except gojson.GoJsonError as exc:
        raise errors.bad_request_body(str(exc)) from None


def build_toxic(cls: type[Toxic], attributes: dict[str, Any] | None, base: Toxic | None) -> Toxic:
    """``attributes`` decoded onto ``base`` (or the type's zero values), validated."""
    merged: dict[str, Any] = base.model_dump() if base is not None else {}
    merged.update(without_nulls(attributes or {}))
    try:
        return cls.model_validate(merged)
    except ValidationError as exc:
        raise errors.bad_request_body(go_error(exc, cls, "ToxicWrapper.attributes")) from None


class FaultProxyService:
    """The proxies of one fault-proxy server and every API operation on them."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.metrics = ProxyMetrics(registry)
        self._runtime = ProxyRuntime(
            clock=clock or SystemClock(), rng=rng or random.Random(), metrics=self.metrics
        )
        self._proxies: dict[str, Proxy] = {}
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ proxies
    def proxy_views(self) -> dict[str, ProxyView]:
        """Every proxy by name (Go marshals maps with sorted keys)."""
        return {name: self._proxies[name].view() for name in sorted(self._proxies)}

    def get_proxy(self, name: str) -> ProxyView:
        return self._proxy(name).view()

    def live_proxy(self, name: str) -> Proxy:
        """The proxy object itself (tests and embedding code)."""
        return self._proxy(name)

    async def create_proxy(self, body: bytes) -> ProxyView:
        fields = parse_struct(ProxyFields, decode(body), "Proxy")
        if not fields.name:
            raise errors.missing_field("name")
        if not fields.upstream:
            raise errors.missing_field("upstream")
        async with self._lock:
            if fields.name in self._proxies:
                raise errors.proxy_already_exists()
            proxy = Proxy(fields.name, fields.listen, fields.upstream, self._runtime)
            if fields.enabled:
                try:
                    await proxy.start()
                except ApiError:
                    self.metrics.forget_proxy(fields.name)
                    raise
            self._proxies[fields.name] = proxy
            return proxy.view()

    async def update_proxy(self, name: str, body: bytes) -> ProxyView:
        self._proxy(name)  # 404 before the body is looked at, as in Toxiproxy
        patch = parse_struct(ProxyPatch, decode(body), "Proxy")
        async with self._lock:
            proxy = self._proxy(name)  # it may have gone while we waited
            await proxy.update(patch)
            return proxy.view()

    async def delete_proxy(self, name: str) -> None:
        async with self._lock:
            proxy = self._proxy(name)
            await proxy.stop()
            del self._proxies[name]
            self.metrics.forget_proxy(name)

    async def populate(self, body: bytes) -> PopulateResult:
        try:
            items = self._populate_items(decode(body))
        except ApiError as exc:
            return PopulateResult(None, exc)
        done: list[ProxyView] = []
        async with self._lock:
            for item in items:
                try:
                    proxy = await self._add_or_replace(item)
                except ApiError as exc:
                    return PopulateResult(tuple(done) or None, exc)
                done.append(proxy.view())
        return PopulateResult(tuple(done) or None)

    def _populate_items(self, value: Any) -> list[ProxyFields]:
        """Decode and validate the whole array before changing anything."""
        if value is None:
            return []
        if not isinstance(value, list):
            raise errors.bad_request_body(
                f"json: cannot unmarshal {gojson.json_kind(value)} into Go value of type "
                f"{_POPULATE_GO_TYPE}"
            )
        items = [parse_struct(ProxyFields, element, "Proxy") for element in value]
        for number, item in enumerate(items, start=1):
            if not item.name:
                raise errors.missing_field(f"name at proxy {number}")
            if not item.upstream:
                raise errors.missing_field(f"upstream at proxy {number}")
        return items

    async def _add_or_replace(self, item: ProxyFields) -> Proxy:
        """``AddOrReplace``: same resolved listen and upstream keeps the proxy untouched."""
        existing = self._proxies.get(item.name)
        if existing is not None:
            if not await existing.differs(item.listen, item.upstream):
                return existing
            await existing.stop()
        proxy = Proxy(item.name, item.listen, item.upstream, self._runtime)
        if item.enabled:
            await proxy.start()  # on failure the stopped old proxy stays, as in Go
        self._proxies[item.name] = proxy
        return proxy

    async def reset(self) -> None:
        """Enable every proxy and remove every toxic (partial if one cannot bind)."""
        async with self._lock:
            for proxy in list(self._proxies.values()):
                await proxy.start()
                await proxy.toxics.reset()

    async def close(self) -> None:
        """Stop every proxy (server shutdown)."""
        async with self._lock:
            for proxy in self._proxies.values():
                await proxy.stop()

    def _proxy(self, name: str) -> Proxy:
        proxy = self._proxies.get(name)
        if proxy is None:
            raise errors.proxy_not_found()
        return proxy

    # ------------------------------------------------------------------ toxics
    def toxics(self, proxy: str) -> tuple[ToxicView, ...]:
        return self._proxy(proxy).toxics.views()

    def get_toxic(self, proxy: str, toxic: str) -> ToxicView:
        return self._slot(self._proxy(proxy), toxic).view()

    async def create_toxic(self, proxy_name: str, body: bytes) -> ToxicView:
        self._proxy(proxy_name)
        fields = parse_struct(ToxicFields, decode(body), "ToxicWrapper")
        direction = parse_direction(fields.stream)
        name = fields.name or f"{fields.type}_{fields.stream}"
        toxic_type = REGISTRY.get(fields.type)
        if toxic_type is None:
            raise errors.invalid_toxic_type()
        async with self._lock:
            proxy = self._proxy(proxy_name)
            if proxy.toxics.get(name) is not None:
                raise errors.toxic_already_exists()
            slot = ToxicSlot(
                name=name,
                type=fields.type,
                stream=fields.stream,
                direction=direction,
                toxicity=gojson.to_float32(fields.toxicity),
                toxic=build_toxic(toxic_type, fields.attributes, None),
            )
            await proxy.toxics.add(slot)
            return slot.view()

    async def update_toxic(self, proxy_name: str, toxic_name: str, body: bytes) -> ToxicView:
        self._slot(self._proxy(proxy_name), toxic_name)
        patch = parse_struct(ToxicPatch, decode(body), "ToxicWrapper")
        async with self._lock:
            proxy = self._proxy(proxy_name)
            slot = self._slot(proxy, toxic_name)
            # Validated in full before anything changes (Go decodes onto the live toxic,
            # so a type error half-way leaves it half-updated).
            toxic = build_toxic(type(slot.toxic), patch.attributes, slot.toxic)
            toxicity = (
                slot.toxicity if patch.toxicity is None else gojson.to_float32(patch.toxicity)
            )
            await proxy.toxics.update(slot, toxic=toxic, toxicity=toxicity)
            return slot.view()

    async def delete_toxic(self, proxy_name: str, toxic_name: str) -> None:
        async with self._lock:
            proxy = self._proxy(proxy_name)
            await proxy.toxics.remove(self._slot(proxy, toxic_name))

    @staticmethod
    def _slot(proxy: Proxy, name: str) -> ToxicSlot:
        slot = proxy.toxics.get(name)
        if slot is None:
            raise errors.toxic_not_found()
        return slot
