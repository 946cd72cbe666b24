"""gRPC's own errors (not RPC statuses) are translated at the store's boundary."""

from __future__ import annotations

from typing import Any

import grpc.aio
import pytest
from grpc._cython import cygrpc

from gtm.errors import StateUnavailable
from gtm.metrics import new_registry
from gtm.state.etcd import EtcdStore
from gtm.state.url import Endpoint


class _BrokenCall:
    """A keep-alive stream whose write fails as gRPC does on a call that broke."""

    async def write(self, _request: object) -> None:
        raise cygrpc.ExecuteBatchError('Failed "execute_batch"')

    def cancel(self) -> None:
        pass

    async def code(self) -> None:
        return None


class _Stubs:
    def LeaseKeepAlive(self, **_kwargs: Any) -> _BrokenCall:
        return _BrokenCall()


class _Client:
    leasestub = _Stubs()
    metadata = None


async def test_a_broken_keep_alive_call_is_unavailable_not_a_grpc_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = new_registry()
    store = EtcdStore([Endpoint("127.0.0.1", 1)], timeout=1.0, registry=registry)

    async def client() -> _Client:
        return _Client()

    monkeypatch.setattr(store, "_client", client)
    assert issubclass(cygrpc.ExecuteBatchError, grpc.aio.BaseError)
    with pytest.raises(StateUnavailable, match="keep_alive call broke"):
        await store.keep_alive(7)
    errors = registry.get_sample_value(
        "gtm_state_etcd_errors_total", {"op": "keep_alive", "code": "broken_call"}
    )
    await store.aclose()
    assert errors == 1.0
