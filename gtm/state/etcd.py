"""The etcd state store, over aetcd. The only module that imports aetcd (and so gRPC).

Every client error is translated here into :mod:`gtm.errors`:

==========================================  ==========================================
etcd / gRPC                                 gtm
==========================================  ==========================================
UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED,  StateUnavailable (retry; static stability
ABORTED, INTERNAL, UNKNOWN, "too many       keeps the last snapshot meanwhile)
requests", no answer within ``timeout``
watch response with ``compact_revision``    CompactedError (re-list, watch again)
NOT_FOUND "requested lease not found"       LeaseNotFound
"request is too large" / message too large  StateError naming the size limit
PERMISSION_DENIED, failed authentication,   StateAccessDenied saying what to check
"user name is empty"
UNAUTHENTICATED "invalid auth token"        re-authenticate and retry once
anything else                               StateError with etcd's message
==========================================  ==========================================

Why the gRPC stubs and not aetcd's high-level methods: aetcd's ``transaction`` drops the
response header (so a CAS could not return the revision it made), its ``revoke_lease``
turns NOT_FOUND into a generic ``ClientError``, and its ``watch`` flattens responses into
single events (losing the batch revision a watcher resumes from) through an unbounded
queue. So this module takes the stubs and protobuf messages from aetcd (``aetcd.rpc``)
and makes the calls itself; that is also where every
call gets its deadline (``timeout``, default :data:`DEFAULT_TIMEOUT`).

Connections: gRPC channels are lazy, so constructing the store never blocks and an etcd
that is down makes calls fail with StateUnavailable after at most ``timeout``. The
channel is our own (aetcd 1.0's ``Client`` has no TLS): with ``tls`` it is a secure
channel verifying etcd's certificate against the given CA (and presenting our client
certificate for ``--client-cert-auth``); with ``user``/``password`` the first call
authenticates and every call carries etcd's token, re-authenticating once when etcd
says the token expired (simple tokens expire after ``--auth-token-ttl``, 300 s). With
several endpoints, a call that finds its endpoint unavailable moves the store to the
next one for later calls (the failing call still raises: callers retry with backoff).

Watches: each is its own Watch stream, read only when the consumer asks for the next
batch, so a slow consumer is held back by gRPC flow control instead of filling a queue
here (etcd keeps it as a slow watcher; if its history is compacted meanwhile it ends with
CompactedError). gRPC keepalive pings make a watch on a dead or partitioned etcd fail
with StateUnavailable instead of waiting forever.

Lease TTLs are whole seconds in etcd's API: :func:`~gtm.state.store.granted_ttl` rounds
a request up (min 1 s). etcd also enforces its own minimum, 1.5 × the election timeout
rounded up (server/lease/lessor.go, ``minLeaseTTL``): 2 s with the default 1 s election
timeout, so ``Lease.ttl`` reports what etcd actually granted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import grpc
from aetcd import rpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from gtm.errors import (
    CompactedError,
    ConfigError,
    LeaseNotFound,
    StateAccessDenied,
    StateError,
    StateUnavailable,
)
from gtm.state.store import (
    EventType,
    KeyValue,
    Lease,
    RangeResult,
    TxnResult,
    WatchBatch,
    WatchEvent,
    granted_ttl,
)

if TYPE_CHECKING:
    from gtm.state.url import Endpoint, EtcdTls

#: The key whose range answer gives the store's revision: inside ``/gtm/``, because a gtm
#: role is granted only that prefix (a range outside it is PERMISSION_DENIED); the
#: header's revision is the whole store's either way.
_REVISION_PROBE_KEY = b"/gtm/"

#: Deadline of every call, seconds. A healthy etcd answers in milliseconds (its own
#: request timeout is 5 s for a leader change), and static stability prefers failing
#: fast and serving the last snapshot over waiting.
DEFAULT_TIMEOUT = 2.0

#: gRPC keepalive ping interval on open streams, seconds, so that a watch on a dead or
#: partitioned etcd fails instead of waiting forever. etcd rejects pings more frequent
#: than ``--grpc-keepalive-min-time`` (default 5 s) with GOAWAY, so stay above it.
KEEPALIVE_INTERVAL = 10.0

#: Cap on gRPC's reconnect backoff, seconds. gRPC's default grows to 120 s
#: (grpc/doc/connection-backoff.md), which would keep a client failing for up to two
#: minutes after etcd is back; 2 s makes recovery quick at negligible cost.
MAX_RECONNECT_BACKOFF = 2.0

_RETRYABLE = frozenset(
    {
        rpc.StatusCode.UNAVAILABLE,
        rpc.StatusCode.DEADLINE_EXCEEDED,
        rpc.StatusCode.CANCELLED,
        rpc.StatusCode.ABORTED,
        rpc.StatusCode.INTERNAL,
        rpc.StatusCode.UNKNOWN,
        rpc.StatusCode.RESOURCE_EXHAUSTED,  # etcd's "too many requests"
    }
)
_FAILOVER = frozenset({rpc.StatusCode.UNAVAILABLE, rpc.StatusCode.DEADLINE_EXCEEDED})
_EVENT_TYPES = {rpc.Event.PUT: EventType.PUT, rpc.Event.DELETE: EventType.DELETE}


def _encode(key: str) -> bytes:
    # surrogateescape: a non-UTF-8 key written by another tool survives a round trip.
    return key.encode("utf-8", "surrogateescape")


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _prefix_end(prefix: bytes) -> bytes:
    """The exclusive end of the keys starting with ``prefix`` (clientv3
    ``GetPrefixRangeEnd``); ``b"\\0"`` means "to the end of the keyspace"."""
    for i in reversed(range(len(prefix))):
        if prefix[i] < 0xFF:
            return prefix[:i] + bytes([prefix[i] + 1])
    return b"\0"


def _kv(pb: Any) -> KeyValue:
    return KeyValue(
        key=_decode(pb.key),
        value=bytes(pb.value),
        create_revision=int(pb.create_revision),
        mod_revision=int(pb.mod_revision),
        version=int(pb.version),
        lease=int(pb.lease),
    )


def _batch(response: Any) -> WatchBatch:
    events = tuple(WatchEvent(_EVENT_TYPES[e.type], _kv(e.kv)) for e in response.events)
    # The batch's revision is its last event's, not the response header's: while a watch
    # catches up, etcd sends at most 1000 revisions per response but stamps each with
    # the store's current revision (mvcc/watchable_store.go, syncWatchers: ``Revision:
    # curRev`` even when ``eb.moreRev != 0``), so resuming from the header's revision
    # would skip events. etcd never splits one revision across responses.
    return WatchBatch(max(e.kv.mod_revision for e in events), events)


class _TokenExpired(StateUnavailable):
    """etcd no longer knows our auth token; the call is retried after re-authenticating."""


def _read_tls(tls: EtcdTls) -> grpc.ChannelCredentials:
    def read(path: Any) -> bytes:
        try:
            return bytes(path.read_bytes())
        except OSError as exc:
            raise ConfigError(f"cannot read etcd TLS file {path}: {exc.strerror}") from None

    return grpc.ssl_channel_credentials(
        root_certificates=read(tls.ca),
        private_key=read(tls.key) if tls.key else None,
        certificate_chain=read(tls.cert) if tls.cert else None,
    )


class _Connection:
    """One endpoint's channel, stubs and auth metadata (the part of aetcd.Client we use)."""

    def __init__(
        self, target: str, options: dict[str, int], credentials: grpc.ChannelCredentials | None
    ) -> None:
        pairs = list(options.items())
        if credentials is None:
            self.channel = rpc.insecure_channel(target, options=pairs)
        else:
            self.channel = rpc.secure_channel(target, credentials, options=pairs)
        self.kvstub = rpc.KVStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.metadata: tuple[tuple[str, str], ...] | None = None

    async def close(self) -> None:
        await self.channel.close()


def _check_key(key: str) -> bytes:
    if not key:
        raise ValueError("state-store keys must not be empty")
    return _encode(key)


class EtcdStore:
    """A :class:`~gtm.state.store.StateStore` on an etcd v3 cluster."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        registry: CollectorRegistry | None = None,
        keepalive_interval: float = KEEPALIVE_INTERVAL,
        tls: EtcdTls | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if (user is None) != (password is None):
            raise ValueError("etcd user and password go together")
        self._credentials = None if tls is None else _read_tls(tls)
        self._has_client_cert = tls is not None and tls.cert is not None
        self._user = user
        self._password = password
        self._endpoints = tuple(endpoints)
        self._timeout = timeout
        self._current = 0
        self._clients: dict[int, Any] = {}
        self._streams: set[Any] = set()  # open watch calls, finished by aclose()
        self._closed = False
        self._options = {
            "grpc.keepalive_time_ms": int(keepalive_interval * 1000),
            "grpc.keepalive_timeout_ms": int(max(timeout, 1.0) * 1000),
            "grpc.http2.max_pings_without_data": 0,  # keep pinging an idle watch stream
            # (Not grpc.min_reconnect_backoff_ms: gRPC core also uses it as the connect
            # timeout, which must stay long enough for a distant etcd.)
            "grpc.initial_reconnect_backoff_ms": 100,
            "grpc.max_reconnect_backoff_ms": int(MAX_RECONNECT_BACKOFF * 1000),
            # A range over many large values may exceed gRPC's default 4 MiB response cap.
            "grpc.max_receive_message_length": -1,
        }
        registry = registry or CollectorRegistry(auto_describe=True)
        self._errors = Counter(
            "gtm_state_etcd_errors_total",
            "Failed etcd calls by operation and gRPC status code.",
            ["op", "code"],
            registry=registry,
        )
        self._watches = Gauge(
            "gtm_state_etcd_watches", "Open etcd watch streams.", registry=registry
        )

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint calls currently go to."""
        return self._endpoints[self._current]

    # ------------------------------------------------------------------ reads

    async def get(self, key: str) -> KeyValue | None:
        response = await self._unary("get", _range, rpc.RangeRequest(key=_check_key(key)))
        return _kv(response.kvs[0]) if response.kvs else None

    async def range(self, prefix: str) -> RangeResult:
        raw = _encode(prefix)
        request = rpc.RangeRequest(key=raw or b"\0", range_end=_prefix_end(raw))
        response = await self._unary("range", _range, request)
        return RangeResult(int(response.header.revision), tuple(_kv(kv) for kv in response.kvs))

    async def current_revision(self) -> int:
        request = rpc.RangeRequest(key=_REVISION_PROBE_KEY, count_only=True)
        response = await self._unary("current_revision", _range, request)
        return int(response.header.revision)

    # ------------------------------------------------------------------ writes

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        request = rpc.PutRequest(key=_check_key(key), value=value, lease=lease)
        response = await self._unary("put", lambda c: c.kvstub.Put, request, lease=lease)
        return int(response.header.revision)

    async def delete(self, key: str) -> bool:
        request = rpc.DeleteRangeRequest(key=_check_key(key))
        response = await self._unary("delete", lambda c: c.kvstub.DeleteRange, request)
        return int(response.deleted) > 0

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_mod_revision: int, lease: int = 0
    ) -> TxnResult:
        raw = _check_key(key)
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=raw, value=value, lease=lease))
        return await self._txn("compare_and_swap", raw, expected_mod_revision, put, lease=lease)

    async def compare_and_delete(self, key: str, *, expected_mod_revision: int) -> TxnResult:
        raw = _check_key(key)
        delete = rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=raw))
        return await self._txn("compare_and_delete", raw, expected_mod_revision, delete)

    async def _txn(
        self, op: str, key: bytes, expected_mod_revision: int, then: Any, *, lease: int = 0
    ) -> TxnResult:
        # A missing key compares as mod_revision 0 (etcd compares against a zero value),
        # which is how expected_mod_revision=0 means "only if absent".
        compare = rpc.Compare(
            key=key,
            target=rpc.Compare.MOD,
            result=rpc.Compare.EQUAL,
            mod_revision=expected_mod_revision,
        )
        request = rpc.TxnRequest(compare=[compare], success=[then])
        response = await self._unary(op, lambda c: c.kvstub.Txn, request, lease=lease)
        return TxnResult(bool(response.succeeded), int(response.header.revision))

    # ------------------------------------------------------------------ leases

    async def grant_lease(self, ttl: float) -> Lease:
        request = rpc.LeaseGrantRequest(TTL=granted_ttl(ttl))
        response = await self._unary("grant_lease", lambda c: c.leasestub.LeaseGrant, request)
        if response.error:
            raise StateError(f"etcd refused a lease of {ttl} s: {response.error}")
        return Lease(int(response.ID), float(response.TTL))

    async def keep_alive(self, lease_id: int) -> float:
        # LeaseKeepAlive is a stream: one request, one reply, then close our side and
        # let etcd end the stream.
        with self._translate("keep_alive", lease=lease_id):
            client = await self._client()
            call = client.leasestub.LeaseKeepAlive(timeout=self._timeout, metadata=client.metadata)
            try:
                await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
                reply = await call.read()
                await call.done_writing()
                await call.code()
            finally:
                await self._finish(call)
        if not isinstance(reply, rpc.LeaseKeepAliveResponse):
            raise StateUnavailable(f"etcd at {self.endpoint} closed the keep-alive stream")
        if reply.TTL <= 0:  # etcd answers a keep-alive for an unknown lease with TTL 0
            raise LeaseNotFound(lease_id)
        return float(reply.TTL)

    async def revoke_lease(self, lease_id: int) -> None:
        request = rpc.LeaseRevokeRequest(ID=lease_id)
        try:
            await self._unary(
                "revoke_lease", lambda c: c.leasestub.LeaseRevoke, request, lease=lease_id
            )
        except LeaseNotFound:
            return

    # ------------------------------------------------------------------ history

    async def compact(self, revision: int) -> None:
        if revision <= 1:
            return
        with self._translate("compact"):
            client = await self._client()
            try:
                await client.kvstub.Compact(
                    rpc.CompactionRequest(revision=revision),
                    timeout=self._timeout,
                    metadata=client.metadata,
                )
            except rpc.AioRpcError as exc:
                # Compacting to or below the current compaction point is a no-op for us.
                if exc.code() == rpc.StatusCode.OUT_OF_RANGE and "compacted" in exc.details():
                    return
                raise

    def watch(self, prefix: str, *, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        return self._watch(prefix, start_revision)

    async def _watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        raw = _encode(prefix)
        create = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=raw or b"\0", range_end=_prefix_end(raw), start_revision=max(0, start_revision)
            )
        )
        with self._translate("watch"):
            client = await self._client()
            call = rpc.WatchStub(client.channel).Watch(metadata=client.metadata)
        self._streams.add(call)
        self._watches.inc()
        try:
            next_revision = start_revision
            with self._translate("watch"):
                async with asyncio.timeout(self._timeout):
                    await call.write(create)
                    response = await call.read()
            while True:
                if not isinstance(response, rpc.WatchResponse):  # end of stream
                    if self._closed:
                        return
                    raise StateUnavailable(f"etcd at {self.endpoint} ended the watch stream")
                if response.compact_revision:
                    raise CompactedError(next_revision, int(response.compact_revision))
                if response.canceled:
                    raise StateUnavailable(f"etcd cancelled the watch: {response.cancel_reason}")
                if response.created and next_revision <= 0:
                    next_revision = int(response.header.revision) + 1
                if response.events:
                    batch = _batch(response)
                    next_revision = batch.revision + 1
                    yield batch
                try:
                    with self._translate("watch"):
                        response = await call.read()
                except StateUnavailable:
                    if self._closed:
                        return
                    raise
        finally:
            self._streams.discard(call)
            self._watches.dec()
            await self._finish(call)

    async def aclose(self) -> None:
        """Close every channel; open watches end, later calls raise StateUnavailable."""
        self._closed = True
        for call in list(self._streams):
            await self._finish(call)
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            await client.close()

    # ------------------------------------------------------------------ plumbing

    async def _client(self) -> Any:
        if self._closed:
            raise StateUnavailable("the etcd state store is closed")
        client = self._clients.get(self._current)
        if client is None:
            # Building the channel and stubs does no network I/O.
            client = _Connection(str(self.endpoint), self._options, self._credentials)
            self._clients[self._current] = client
        if self._user is not None and client.metadata is None:
            reply = await rpc.AuthStub(client.channel).Authenticate(
                rpc.AuthenticateRequest(name=self._user, password=self._password),
                timeout=self._timeout,
            )
            client.metadata = (("token", reply.token),)
        return client

    async def _unary(
        self, op: str, method: Callable[[Any], Any], request: Any, *, lease: int = 0
    ) -> Any:
        """Call ``method(client)`` — a unary stub method — with the deadline, translated."""
        try:
            with self._translate(op, lease=lease):
                client = await self._client()
                return await method(client)(
                    request, timeout=self._timeout, metadata=client.metadata
                )
        except _TokenExpired:
            pass  # the token was dropped: the retry authenticates again
        with self._translate(op, lease=lease):
            client = await self._client()
            return await method(client)(request, timeout=self._timeout, metadata=client.metadata)

    async def _finish(self, call: Any) -> None:
        """Cancel a stream call if still open and wait until gRPC has finished it, so no
        completion is left to arrive after its event loop is gone."""
        call.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(call.code(), self._timeout)

    @contextmanager
    def _translate(self, op: str, *, lease: int = 0) -> Iterator[None]:
        try:
            yield
        except rpc.AioRpcError as exc:
            raise self._error(op, exc.code(), exc.details() or "", lease) from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller is being cancelled
            # gRPC raises CancelledError from a call cancelled underneath us: the store's
            # channel was closed by aclose().
            raise StateUnavailable(f"the etcd store was closed during {op}") from None
        except TimeoutError as exc:
            self._errors.labels(op, "timeout").inc()
            self._failover()
            raise StateUnavailable(
                f"etcd at {self.endpoint} did not answer {op} within {self._timeout} s"
            ) from exc
        except grpc.aio.BaseError as exc:
            # gRPC's own errors (not an RPC status): e.g. ExecuteBatchError from a stream
            # operation on a call that broke underneath, seen on keep-alive streams while
            # etcd was starved. The store is unavailable for this call, like a timeout.
            self._errors.labels(op, "broken_call").inc()
            raise StateUnavailable(
                f"etcd at {self.endpoint}: the {op} call broke ({type(exc).__name__}: {exc})"
            ) from exc

    def _error(self, op: str, code: Any, details: str, lease: int) -> StateError:
        self._errors.labels(op, str(code.name).lower()).inc()
        where = f"etcd at {self.endpoint}"
        if code == rpc.StatusCode.NOT_FOUND and "lease not found" in details:
            return LeaseNotFound(lease)
        denied = self._access_error(op, code, details)
        if denied is not None:
            return denied
        if "too large" in details or "larger than max" in details:
            return StateError(f"{where} refused {op}: the request is too large ({details})")
        if code in _RETRYABLE:
            if code in _FAILOVER:
                self._failover()
            return StateUnavailable(f"{where} unavailable during {op}: {code.name}: {details}")
        return StateError(f"{where} failed {op}: {code.name}: {details}")

    def _access_error(self, op: str, code: Any, details: str) -> StateError | None:
        """Authentication and authorisation failures, with what to check (None if other)."""
        where = f"etcd at {self.endpoint}"
        who = (
            f"user {self._user!r}"
            if self._user
            else "the client certificate's user (its common name)"
        )
        if code == rpc.StatusCode.UNAUTHENTICATED and "invalid auth token" in details:
            client = self._clients.get(self._current)
            if client is not None:
                client.metadata = None
            return _TokenExpired(f"{where}: the auth token expired during {op}; retry")
        if code == rpc.StatusCode.PERMISSION_DENIED:
            return StateAccessDenied(
                f"{where} denied {op} to {who} ({details}): give its role readwrite on the "
                "/gtm/ prefix (etcdctl role grant-permission ROLE --prefix=true readwrite /gtm/)"
            )
        if "authentication failed" in details:
            return StateAccessDenied(
                f"{where} refused {who} ({details}): check user= in the --state URL and the "
                "password in password-file= or $GTM_ETCD_PASSWORD"
            )
        if "user name is empty" in details or "user name not found" in details:
            return StateAccessDenied(
                f"{where} requires authentication ({details}): add user=NAME&password-file=PATH "
                "to the --state URL, or a client certificate (cacert=, cert=, key=) whose "
                "common name is an etcd user"
            )
        if (
            code == rpc.StatusCode.UNAVAILABLE
            and self._credentials is not None
            and ("handshake" in details.lower() or "certificate" in details.lower())
        ):
            mine = (
                "that etcd trusts the CA of cert="
                if self._has_client_cert
                else "whether etcd demands a client certificate (add cert= and key=)"
            )
            return StateUnavailable(
                f"{where}: TLS handshake failed during {op} ({details}): check that cacert= "
                f"is the CA that signed etcd's certificate (whose names include this host), "
                f"and {mine}"
            )
        return None

    def _failover(self) -> None:
        if len(self._endpoints) > 1:
            self._current = (self._current + 1) % len(self._endpoints)


def _range(client: Any) -> Any:
    return client.kvstub.Range


def enable_auth(
    endpoint: Endpoint,
    *,
    root_password: str,
    user: str = "gtm",
    password: str | None = None,
    prefix: str = "/gtm/",
    tls: EtcdTls | None = None,
    timeout: float = 10.0,
) -> None:
    """Turn on etcd authentication the way gtm expects it, on a cluster without it.

    Makes the ``root`` user (role ``root``, which etcd requires before enabling auth), a
    role named ``user`` with readwrite on ``prefix`` only, and the user ``user`` with
    that role — with ``password``, or none (certificate-only: etcd's
    ``--client-cert-auth`` maps a client certificate's common name to the user) — then
    enables auth. The equivalent etcdctl commands are in SECURITY.md. Synchronous: for
    set-up scripts and test fixtures.
    """
    raw = _encode(prefix)
    credentials = None if tls is None else _read_tls(tls)
    target = str(endpoint)
    channel = (
        grpc.secure_channel(target, credentials)
        if credentials is not None
        else grpc.insecure_channel(target)
    )
    try:
        auth = rpc.AuthStub(channel)
        auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=root_password), timeout=timeout)
        auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=timeout)
        auth.RoleAdd(rpc.AuthRoleAddRequest(name=user), timeout=timeout)
        permission = rpc.Permission(
            permType=rpc.Permission.READWRITE, key=raw, range_end=_prefix_end(raw)
        )
        auth.RoleGrantPermission(
            rpc.AuthRoleGrantPermissionRequest(name=user, perm=permission), timeout=timeout
        )
        if password is None:
            request = rpc.AuthUserAddRequest(
                name=user, options=rpc.UserAddOptions(no_password=True)
            )
        else:
            request = rpc.AuthUserAddRequest(name=user, password=password)
        auth.UserAdd(request, timeout=timeout)
        auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=user, role=user), timeout=timeout)
        auth.AuthEnable(rpc.AuthEnableRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        raise StateError(f"could not enable authentication on etcd at {endpoint}: {exc}") from exc
    finally:
        channel.close()
