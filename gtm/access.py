"""The access log: one line per request at each tier, when its response ends.

Each tier's application calls :func:`install` once (the front door, the regional LB,
the zone agent); it adds the outermost middleware and a response-prepare hook, so every
request is covered whatever ends it: a relayed answer, a refusal raised anywhere below
(the error middleware's JSON), a limit's 4xx, an unexpected 500, or the client going
away (the handler is cancelled). The line is written once, when the
handler is done, at INFO on ``gtm.access.<tier>`` (:class:`AccessRecord`, :func:`emit`).
The middleware is one user of :class:`AccessLog` (``begin``, ``prepared``, ``end``); a lean
server beside the application (:mod:`gtm.http1`) is the other, so its lines are the same:

* from the response the client got: ``status``, ``x-request-id`` (the middleware sets
  it on a response that has none, so every answer names its request), the decision id,
  ``x-gtm-region`` / ``-zone`` / ``-gpu`` and ``x-gtm-spilled-from``; ``ttft_ms`` is the
  time to the response's head, which a relay sends with the first body byte (a stream's
  first token; a whole body otherwise), ``duration_ms`` the time to its end;
* from the tier (:func:`tell`, a call where the tier knows it): the tenant's id, the
  model, the client's country and where that came from, the client's address, a spill
  that arrived here, the tier's decision id, and tokens in and out — the response's
  ``usage`` where the tier reads it (the front door and the regional LB; a stream without
  one: its content chunks), else the tier's estimates (``tokens_source``);
* ``end``: ``ok`` (the handler returned), ``disconnect`` (the client went away: status
  499 if no response had started) or ``error`` (an exception: 500).

**Never logged**: the body (prompts, completions), the ``Authorization`` header or any
API key, any other request header. A tier tells the tenant's *id*, found from the key.

Health probes and scrapes (``/healthz``, ``/readyz``, ``/metrics``) are not logged.
``--no-access-log`` (``GTM_ACCESS_LOG=false``) on a daemon turns the lines off: the
middleware is then not installed at all. The format (text or JSON) is the process's
(:mod:`gtm.logs`): in JSON the fields are keys of the line's object. While gtm's own
handler is the only one the lines reach (a ``gtm`` daemon), the middleware writes each
line to it directly (:class:`gtm.logs.LineWriter`: the same bytes, without a
``LogRecord`` per request); a handler or filter set up by a host or a test sends the
lines through ``logging`` again, which ``gtm_access_log_direct{tier}`` shows and the log
says.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping, MutableMapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, TypeVar

import click
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Gauge

from gtm import headers as gtm_headers
from gtm import tracing
from gtm.inbound import Scope, client_request_id, new_request_id
from gtm.logs import LineWriter, configured
from gtm.serve import CLIENT_CLOSED, SERVICE_PATHS

#: Parent of every tier's access logger (``gtm.access.global``, ``…regional``, …).
ACCESS_LOGGER = "gtm.access"

#: This module's own messages (not access lines: outside ``gtm.access``).
_log = logging.getLogger("gtm.logs")


class End(StrEnum):
    """How a request's handling ended."""

    OK = "ok"
    #: The client went away (the handler was cancelled).
    DISCONNECT = "disconnect"
    #: An exception no middleware answered (the client got a 500).
    ERROR = "error"


class TokenSource(StrEnum):
    """Where ``tokens_in``/``tokens_out`` came from."""

    #: The response's OpenAI ``usage`` object.
    USAGE = "usage"
    #: The tier's own estimates (the prompt's counted tokens, ``max_tokens``).
    ESTIMATE = "estimate"


class AccessRecord(NamedTuple):
    """One request's access line. Ids and names only: never a body, key or header.

    Immutable like a frozen dataclass, but a tuple: made once per request, and a
    tuple's construction skips the frozen dataclass's per-field ``object.__setattr__``."""

    tier: str
    method: str
    path: str
    status: int
    end: End
    duration_ms: float
    request_id: str
    decision_id: str | None = None
    tenant: str | None = None
    model: str | None = None
    country: str | None = None
    location_source: str | None = None
    region: str | None = None
    zone: str | None = None
    gpu: str | None = None
    spill_from: str | None = None
    spill_to: str | None = None
    ttft_ms: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_source: TokenSource | None = None
    client: str | None = None
    peer: str | None = None

    def values(self) -> tuple[object, ...]:
        """The line's field values in the order of :data:`FIELDS` (``None``: unknown
        here); times rounded to 0.1 ms, enums as their text."""
        ttft, source = self.ttft_ms, self.tokens_source
        return (
            self.request_id,
            self.decision_id,
            self.tenant,
            self.model,
            self.country,
            self.location_source,
            self.region,
            self.zone,
            self.gpu,
            self.spill_from,
            self.spill_to,
            self.status,
            self.end._value_,  # the member's text, without the ``value`` descriptor's calls
            None if ttft is None else round(ttft, 1),
            self.tokens_in,
            self.tokens_out,
            None if source is None else source._value_,
            round(self.duration_ms, 1),
            self.method,
            self.path,
            self.client,
            self.peer,
        )

    def fields(self) -> dict[str, object]:
        """The line's fields in order (``None``: unknown here); times rounded to 0.1 ms.
        The tier is the logger's name (``gtm.access.<tier>``), not a field."""
        return dict(zip(FIELDS, self.values(), strict=True))

    def message(self) -> str:
        return f"{self.method} {self.path} {self.status}"


#: The names of an access line's fields, in the order written (:meth:`AccessRecord.values`).
FIELDS = (
    "request_id",
    "decision_id",
    "tenant",
    "model",
    "country",
    "location_source",
    "region",
    "zone",
    "gpu",
    "spill_from",
    "spill_to",
    "status",
    "end",
    "ttft_ms",
    "tokens_in",
    "tokens_out",
    "tokens_source",
    "duration_ms",
    "method",
    "path",
    "client",
    "peer",
)


def logger(tier: str) -> logging.Logger:
    return logging.getLogger(f"{ACCESS_LOGGER}.{tier}")


def emit(record: AccessRecord, log: logging.Logger | None = None) -> None:
    """Write ``record`` at INFO (on ``gtm.access.<tier>`` unless ``log`` is given).

    ``Logger.info`` without its caller lookup (a walk up the stack per line, for a
    source location the formatters never print; every line comes from here)."""
    log = log or logger(record.tier)
    if log.isEnabledFor(logging.INFO):
        line = log.makeRecord(
            log.name, logging.INFO, __file__, 0, record.message(), (), None, "emit",
            record.fields(),
        )  # fmt: skip
        log.handle(line)


class _Writer:
    """How the middleware writes its lines: straight to gtm's own log handler when that
    is where every line goes (:class:`gtm.logs.LineWriter`, the same bytes without a
    ``LogRecord`` per request), else through ``logging`` (:func:`emit`). Each change of
    way is logged and shown on ``gtm_access_log_direct{tier}`` (with a registry)."""

    def __init__(self, log: logging.Logger, tier: str, registry: CollectorRegistry | None):
        self._log = log
        self._direct = LineWriter(log)
        self._is_direct: bool | None = None
        self._gauge = (
            None
            if registry is None
            else Gauge(
                "gtm_access_log_direct",
                "1 while the access lines are written straight to gtm's log handler, 0 "
                "while through logging's handlers (another handler or a filter is set up).",
                ["tier"],
                registry=registry,
            ).labels(tier)
        )

    def write(self, record: AccessRecord) -> None:
        log = self._log
        if not log.isEnabledFor(logging.INFO):
            return
        if self._direct.write_line(record, FIELDS):
            if self._is_direct is not True:
                self._switch(True)
            return
        if self._is_direct is not False:
            self._switch(False)
        emit(record, log)

    def _switch(self, direct: bool) -> None:
        self._is_direct = direct
        if self._gauge is not None:
            self._gauge.set(int(direct))
        if not direct:
            _log.info("access lines go through logging: %s", self._direct.why_not())


@dataclass(slots=True)
class AccessNote:
    """What a tier learns about one request while handling it (per request, mutable;
    :func:`tell` fills it, the middleware turns it into an :class:`AccessRecord`)."""

    started: float
    #: The request's headers: its ``x-request-id`` is read from them when first needed
    #: (:attr:`request_id`; a relayed response names its request itself).
    headers: Mapping[str, str] = field(repr=False)
    #: The request's id once :attr:`request_id` was read, else None.
    given_id: str | None = None
    tenant: str | None = None
    model: str | None = None
    country: str | None = None
    location_source: str | None = None
    client: str | None = None
    decision_id: str | None = None
    spill_from: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_source: TokenSource | None = None
    #: The response's headers once it was made (sent or returned), else None.
    response: Mapping[str, str] | None = field(default=None, repr=False)
    #: Its status (with :attr:`response`).
    status: int = 0
    prepared_at: float | None = None

    @property
    def request_id(self) -> str:
        """The client's id when sane (:func:`gtm.inbound.client_request_id`), else a fresh
        one, read on first use (and kept): a relayed response names its request itself,
        so most requests never need one here."""
        rid = self.given_id
        if rid is None:
            rid = self.given_id = client_request_id(self.headers) or new_request_id()
        return rid


#: Where a request's note is kept in its per-request state (:class:`gtm.inbound.Scope`).
NOTE_KEY = web.RequestKey("gtm_access_note", AccessNote)
_NOTE = NOTE_KEY


def tell(
    request: Scope,
    *,
    tenant: str | None = None,
    model: str | None = None,
    country: str | None = None,
    location_source: str | None = None,
    client: object | None = None,
    decision_id: str | None = None,
    spill_from: str | None = None,
    tokens_in: int | None = None,
    tokens_out: int | None = None,
    tokens_source: TokenSource | None = None,
) -> None:
    """Note what the tier knows of ``request`` for its access line (arguments left
    ``None`` keep what was told before), and for its span (:func:`gtm.tracing.tell`).
    Does nothing when the access log and tracing are off."""
    if tracing.traced(request):  # tracing off: nothing gathered for a span
        tracing.tell(
            request,
            tenant=tenant,
            model=model,
            country=country,
            location_source=location_source,
            client=client,
            decision_id=decision_id,
            spill_from=spill_from,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            tokens_source=None if tokens_source is None else tokens_source.value,
        )
    note = request.get(_NOTE)
    if note is None:
        return
    if tenant is not None:
        note.tenant = tenant
    if model is not None:
        note.model = model
    if country is not None:
        note.country = country
    if location_source is not None:
        note.location_source = location_source
    if client is not None:
        note.client = str(client)
    if decision_id is not None:
        note.decision_id = decision_id
    if spill_from is not None:
        note.spill_from = spill_from
    if tokens_in is not None:
        note.tokens_in = tokens_in
    if tokens_out is not None:
        note.tokens_out = tokens_out
    if tokens_source is not None:
        note.tokens_source = tokens_source


def record_of(
    request: Scope,
    note: AccessNote,
    *,
    tier: str,
    status: int,
    end: End,
    now: float,
    region: str | None = None,
    zone: str | None = None,
) -> AccessRecord:
    """The access record of ``request``: the response's headers first, then what the
    tier told (``note``), then this process's own ``region``/``zone``."""
    return _record(request, note, tier, status, end, now, region, zone)


def _record(
    request: Scope,
    note: AccessNote,
    tier: str,
    status: int,
    end: End,
    now: float,
    region: str | None,
    zone: str | None,
) -> AccessRecord:
    """:func:`record_of`, its arguments by position (the middleware's call per line)."""
    got: Mapping[str, str] = note.response if note.response is not None else {}
    spill_from = got.get(gtm_headers.SPILLED_FROM) or note.spill_from
    served = got.get(gtm_headers.REGION) or region
    prepared = note.prepared_at
    if prepared is None and end is End.OK:
        prepared = now  # a whole response, sent as the handler returns it
    # The tuple made directly, in the fields' order (the named tuple's ``__new__`` is a
    # Python function around this same call; every field is given).
    return _new_tuple(
        AccessRecord,
        (
            tier,
            request.method,
            request.path,
            status,
            end,
            (now - note.started) * 1000.0,  # duration_ms
            got.get(gtm_headers.REQUEST_ID) or note.request_id,
            note.decision_id or got.get(gtm_headers.DECISION_ID),
            note.tenant,
            note.model,
            note.country,
            note.location_source,
            served,  # region
            got.get(gtm_headers.ZONE) or zone,
            got.get(gtm_headers.GPU),
            spill_from,
            served if spill_from else None,  # spill_to
            None if prepared is None else (prepared - note.started) * 1000.0,  # ttft_ms
            note.tokens_in,
            note.tokens_out,
            note.tokens_source,
            note.client,
            request.remote,  # peer
        ),
    )


_new_tuple = tuple.__new__


class AccessLog:
    """One tier's access lines, whichever server parsed the request: aiohttp's
    middleware (:func:`install`) and the lean server (:mod:`gtm.http1`) both call
    :meth:`begin`, :meth:`prepared` and :meth:`end`, so the line is the same."""

    def __init__(
        self,
        tier: str,
        *,
        region: str | None = None,
        zone: str | None = None,
        skip: Collection[str] = SERVICE_PATHS,
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._tier = tier
        self._region = region
        self._zone = zone
        self._clock = clock
        #: The writer's bound method (a plain call, not an instance's ``__call__``).
        self._write = _Writer(logger(tier), tier, registry).write
        #: Paths without a line (probes, scrapes).
        self.skip = skip

    def begin(self, request: Scope) -> AccessNote:
        """A request arrived: its note (the caller keeps it under :data:`NOTE_KEY`)."""
        return AccessNote(self._clock(), request.headers)

    def prepared(self, note: AccessNote, status: int, headers: MutableMapping[str, str]) -> None:
        """The response's head is being sent: its time, status and headers; a response
        without ``x-request-id`` gains the request's."""
        note.response = headers
        note.status = status
        note.prepared_at = self._clock()
        if gtm_headers.REQUEST_ID not in headers:
            headers[gtm_headers.REQUEST_ID] = note.request_id

    def end(self, request: Scope, note: AccessNote, status: int, end: End) -> None:
        """The handling ended: write the line."""
        self._write(
            _record(request, note, self._tier, status, end, self._clock(), self._region, self._zone)
        )


def access_log(
    tier: str,
    *,
    region: str | None = None,
    zone: str | None = None,
    skip: Collection[str] = SERVICE_PATHS,
    clock: Callable[[], float] = time.monotonic,
    registry: CollectorRegistry | None = None,
) -> AccessLog | None:
    """The tier's :class:`AccessLog`, or None when ``gtm.access.<tier>`` is off."""
    if not logger(tier).isEnabledFor(logging.INFO):
        return None
    return AccessLog(tier, region=region, zone=zone, skip=skip, clock=clock, registry=registry)


def install(
    app: web.Application,
    tier: str,
    *,
    region: str | None = None,
    zone: str | None = None,
    skip: Collection[str] = SERVICE_PATHS,
    clock: Callable[[], float] = time.monotonic,
    registry: CollectorRegistry | None = None,
) -> AccessLog | None:
    """Log one access line per request of ``app`` (see the module docstring); nothing
    when ``gtm.access.<tier>`` is off (``--no-access-log``). ``region``/``zone``: where
    this process is, for lines whose response does not say; ``registry``: where
    ``gtm_access_log_direct{tier}`` goes. Returns the :class:`AccessLog` installed (a
    lean server beside ``app`` writes through it)."""
    made = access_log(tier, region=region, zone=zone, skip=skip, clock=clock, registry=registry)
    if made is None:
        return None

    @web.middleware
    async def access(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in made.skip:
            return await handler(request)
        note = request[_NOTE] = made.begin(request)
        status, end = 500, End.ERROR
        try:
            response = await handler(request)
            status, end = response.status, End.OK
            if note.response is None:  # not sent yet: the record reads its headers
                note.response = response.headers
            return response
        except web.HTTPException as exc:  # answered by aiohttp itself
            status, end = exc.status, End.OK
            raise
        except asyncio.CancelledError:
            end = End.DISCONNECT
            status = CLIENT_CLOSED if note.response is None else note.status
            raise
        finally:
            made.end(request, note, status, end)

    async def prepared(request: web.Request, response: web.StreamResponse) -> None:
        note = request.get(_NOTE)
        if note is not None:
            made.prepared(note, response.status, response.headers)

    app.middlewares.insert(0, access)
    app.on_response_prepare.append(prepared)
    return made


F = TypeVar("F", bound=Callable[..., Any])
#: A level above every record's: the tiers' access loggers are off.
_OFF = logging.CRITICAL + 1


def _switch(ctx: click.Context, param: click.Parameter, on: bool) -> None:
    # On: at INFO whatever --log-level says (the access log is its own stream), in a
    # process the gtm command configured (a host's logging, a test runner's, is left as
    # it is); off: the tiers find their loggers off and install nothing.
    if not on:
        logging.getLogger(ACCESS_LOGGER).setLevel(_OFF)
    elif configured():
        logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO)


def access_log_option() -> Callable[[F], F]:
    """``--access-log/--no-access-log`` (``GTM_ACCESS_LOG``) for a daemon's command."""
    return click.option(
        "--access-log/--no-access-log",
        default=True,
        show_default=True,
        envvar="GTM_ACCESS_LOG",
        expose_value=False,
        callback=_switch,
        help="One log line per request when its response ends (logger gtm.access.<tier>; "
        "ids, tenant, place, status, times, tokens — never a prompt or a key).",
    )


__all__ = [
    "ACCESS_LOGGER",
    "CLIENT_CLOSED",
    "NOTE_KEY",
    "SERVICE_PATHS",
    "AccessLog",
    "AccessNote",
    "AccessRecord",
    "End",
    "TokenSource",
    "access_log",
    "access_log_option",
    "emit",
    "install",
    "logger",
    "record_of",
    "tell",
]
