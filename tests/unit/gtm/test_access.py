"""gtm.access: the access record's fields and the middleware that writes one line per
request however it ends (answered, refused, failed, or its client gone)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator, Iterator

import aiohttp
import click
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from gtm import access
from gtm.access import (
    ACCESS_LOGGER,
    CLIENT_CLOSED,
    AccessRecord,
    End,
    TokenSource,
    access_log_option,
    emit,
)
from gtm.logs import JsonFormatter, LogFormat, TextFormatter, configure

SECRET_KEY = "sk-unit-secret-key"
PROMPT = "unit-test-prompt-text"
ARRIVED = web.AppKey("arrived", asyncio.Event)


class Lines(logging.Handler):
    """The access records written, and an event per record."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.written = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.written.set()

    async def next(self) -> logging.LogRecord:
        await asyncio.wait_for(self.written.wait(), 5.0)
        self.written.clear()
        return self.records[-1]


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    parent = logging.getLogger(ACCESS_LOGGER)
    parent.addHandler(handler)
    parent.setLevel(logging.INFO)
    yield handler
    parent.removeHandler(handler)
    parent.setLevel(logging.NOTSET)


def _app() -> web.Application:
    release = asyncio.Event()

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        access.tell(
            request,
            tenant="acme",
            model=body["model"],
            country="DE",
            location_source="geoip",
            client="192.0.2.7",
            tokens_in=12,
            tokens_out=3,
            tokens_source=TokenSource.USAGE,
        )
        return web.json_response(
            {"ok": True},
            headers={"x-gtm-region": "eu-west", "x-gtm-zone": "eu-west-a", "x-gtm-gpu": "g1"},
        )

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"x-gtm-spilled-from": "us-east"})
        await response.prepare(request)
        await response.write(b"data: first\n\n")
        await release.wait()  # until the client goes away
        return response

    async def slow(request: web.Request) -> web.Response:
        request.app[ARRIVED].set()
        await release.wait()  # never: the client leaves first
        return web.Response()

    async def refused(request: web.Request) -> web.Response:
        raise web.HTTPForbidden()

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app[ARRIVED] = asyncio.Event()
    app.router.add_post("/v1/slow", slow)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/stream", stream)
    app.router.add_post("/v1/refused", refused)
    app.router.add_post("/v1/broken", broken)
    app.router.add_get("/healthz", healthz)
    access.install(app, "regional", region="eu-west")
    return app


@pytest.fixture
async def client(lines: Lines) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    server = TestServer(_app(), handler_cancellation=True)
    async with TestClient(server) as test_client:
        yield test_client


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return json.loads(JsonFormatter().format(record))  # type: ignore[no-any-return]


def test_a_record_lists_its_fields_in_order_with_times_rounded() -> None:
    record = AccessRecord(
        tier="global",
        method="POST",
        path="/v1/chat/completions",
        status=200,
        end=End.OK,
        duration_ms=12.345,
        request_id="r1",
        ttft_ms=3.21,
        tokens_source=TokenSource.ESTIMATE,
    )
    got = record.fields()
    assert list(got)[:2] == ["request_id", "decision_id"]
    assert got["duration_ms"] == 12.3
    assert got["ttft_ms"] == 3.2
    assert got["end"] == "ok"
    assert got["tokens_source"] == "estimate"
    assert record.message() == "POST /v1/chat/completions 200"


def test_emit_writes_the_fields_as_keys_in_json_and_key_value_in_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    record = AccessRecord("zone", "POST", "/v1/completions", 503, End.OK, 1.0, "r2")
    emit(record)
    (written,) = caplog.records
    assert written.name == "gtm.access.zone"
    document = json.loads(JsonFormatter().format(written))
    assert document["status"] == 503
    assert document["request_id"] == "r2"
    assert document["tenant"] is None
    text = TextFormatter().format(written)
    assert "request_id=r2" in text
    assert "status=503" in text
    assert "tenant=" not in text


async def test_an_answered_request_is_one_line_from_its_response_and_the_tiers_notes(
    client: TestClient[web.Request, web.Application], lines: Lines
) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": PROMPT}]},
        headers={"Authorization": f"Bearer {SECRET_KEY}", "x-request-id": "client-id-1"},
    )
    assert response.status == 200
    assert response.headers["x-request-id"] == "client-id-1"  # echoed on the answer
    got = _fields(await lines.next())
    assert got["logger"] == "gtm.access.regional"
    assert got["request_id"] == "client-id-1"
    assert (got["tenant"], got["model"], got["country"]) == ("acme", "m", "DE")
    assert (got["location_source"], got["client"]) == ("geoip", "192.0.2.7")
    assert (got["region"], got["zone"], got["gpu"]) == ("eu-west", "eu-west-a", "g1")
    assert (got["tokens_in"], got["tokens_out"], got["tokens_source"]) == (12, 3, "usage")
    assert (got["status"], got["end"], got["method"]) == (200, "ok", "POST")
    assert got["ttft_ms"] is not None
    assert got["spill_from"] is None
    line = json.dumps(got)
    assert SECRET_KEY not in line
    assert PROMPT not in line
    assert "Bearer" not in line
    assert len(lines.records) == 1


async def test_a_refusal_and_a_failure_are_logged_with_the_status_the_client_got(
    client: TestClient[web.Request, web.Application], lines: Lines
) -> None:
    response = await client.post("/v1/refused")
    assert response.status == 403
    assert response.headers["x-request-id"]  # a new id, named on the answer
    got = _fields(await lines.next())
    assert (got["status"], got["end"]) == (403, "ok")
    assert got["request_id"] == response.headers["x-request-id"]
    assert got["region"] == "eu-west"  # this process's own, the response said none

    response = await client.post("/v1/broken")
    assert response.status == 500
    got = _fields(await lines.next())
    assert (got["status"], got["end"]) == (500, "error")


async def test_a_client_that_leaves_mid_stream_is_one_disconnect_line(
    client: TestClient[web.Request, web.Application], lines: Lines
) -> None:
    response = await client.post("/v1/stream", headers={"x-request-id": "gone-1"})
    assert await response.content.readline() == b"data: first\n"
    response.close()  # the client goes away; the handler is cancelled
    got = _fields(await lines.next())
    assert got["request_id"] == "gone-1"
    assert (got["status"], got["end"]) == (200, "disconnect")
    assert (got["spill_from"], got["spill_to"]) == ("us-east", "eu-west")


async def test_probes_are_not_logged(
    client: TestClient[web.Request, web.Application], lines: Lines
) -> None:
    assert (await client.get("/healthz")).status == 200
    await client.post("/v1/refused")
    got = _fields(await lines.next())
    assert got["path"] == "/v1/refused"
    assert len(lines.records) == 1


async def test_a_client_gone_before_any_answer_is_logged_as_499(
    client: TestClient[web.Request, web.Application], lines: Lines
) -> None:
    arrived = client.app[ARRIVED]
    async with asyncio.TaskGroup() as group:
        sent = group.create_task(client.post("/v1/slow", headers={"x-request-id": "early-1"}))
        await asyncio.wait_for(arrived.wait(), 5.0)
        sent.cancel()  # the client gives up before the first byte
    got = _fields(await lines.next())
    assert got["request_id"] == "early-1"
    assert (got["status"], got["end"]) == (CLIENT_CLOSED, "disconnect")
    assert got["ttft_ms"] is None


async def test_no_access_log_installs_nothing(lines: Lines) -> None:
    @click.command()
    @access_log_option()
    def daemon() -> None:
        app = web.Application()
        access.install(app, "zone")
        assert len(app.middlewares) == 0
        assert not app.on_response_prepare

    result = CliRunner().invoke(daemon, ["--no-access-log"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(daemon, [], env={"GTM_ACCESS_LOG": "false"})
    assert result.exit_code == 0, result.output
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO)


async def test_a_daemon_with_the_access_log_on_installs_it_at_any_log_level(
    lines: Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = logging.getLogger()  # as a fresh `gtm --log-level warning` process
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    configure("warning", LogFormat.TEXT, io.StringIO())
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.NOTSET)

    @click.command()
    @access_log_option()
    def daemon() -> None:
        app = web.Application()
        access.install(app, "zone")
        assert len(app.middlewares) == 1

    result = CliRunner().invoke(daemon, [])
    assert result.exit_code == 0, result.output


async def test_a_real_session_sees_the_request_id_on_a_stream(
    client: TestClient[web.Request, web.Application], lines: Lines
) -> None:
    async with aiohttp.ClientSession() as session:
        url = str(client.make_url("/v1/stream"))
        async with session.post(url) as response:
            await response.content.readline()
            assert response.headers["x-request-id"]
    got = _fields(await lines.next())
    assert got["end"] == "disconnect"


def test_under_a_hosts_own_logging_the_option_leaves_the_access_level_alone() -> None:
    access_logger = logging.getLogger(ACCESS_LOGGER)
    access_logger.setLevel(logging.NOTSET)

    @click.command()
    @access_log_option()
    def daemon() -> None:
        pass

    assert CliRunner().invoke(daemon, []).exit_code == 0
    assert access_logger.level == logging.NOTSET  # pytest's logging, not gtm's


async def test_under_gtms_own_handler_the_lines_are_written_directly_and_otherwise_logged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = logging.getLogger()  # as a `gtm zone` process: gtm's handler alone
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    stream = io.StringIO()
    configure("warning", LogFormat.JSON, stream)
    monkeypatch.setattr(logging.getLogger(ACCESS_LOGGER), "level", logging.INFO)
    registry = CollectorRegistry()
    app = web.Application()

    async def chat(request: web.Request) -> web.Response:
        access.tell(request, model="m", tokens_in=5)
        return web.Response(text="{}", headers={"x-gtm-gpu": "g1"})

    app.router.add_post("/v1/chat/completions", chat)
    access.install(app, "zone", zone="z1", registry=registry)

    def direct() -> float | None:
        return registry.get_sample_value("gtm_access_log_direct", {"tier": "zone"})

    async with TestClient(TestServer(app)) as client:
        assert (await client.post("/v1/chat/completions")).status == 200
        root.handlers[0].flush()  # the batch waits its interval (gtm.logs): a reader's flush
        line = json.loads(stream.getvalue())
        assert (line["logger"], line["msg"]) == ("gtm.access.zone", "POST /v1/chat/completions 200")
        assert (line["model"], line["tokens_in"], line["gpu"], line["zone"]) == ("m", 5, "g1", "z1")
        assert direct() == 1.0
        handler = Lines()  # a host's or a test's own handler: every line goes through logging
        root.addHandler(handler)
        try:
            assert (await client.post("/v1/chat/completions")).status == 200
            assert direct() == 0.0
            assert _fields(handler.records[-1])["gpu"] == "g1"
            assert len(stream.getvalue().splitlines()) == 2  # gtm's handler had it too
        finally:
            root.removeHandler(handler)
        assert (await client.post("/v1/chat/completions")).status == 200
        assert direct() == 1.0


class _Scope:
    """A request as :class:`gtm.access.AccessLog` reads it (a :class:`gtm.inbound.Scope`)."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.method = "POST"
        self.path = "/v1/chat/completions"
        self.headers = CIMultiDict(headers)
        self.remote = "127.0.0.1"
        self._state: dict[object, object] = {}

    def get(self, key: object, /) -> object:
        return self._state.get(key)


#: A zone's line for a relayed answer and for a client gone before any, as written.
_ZONE_LINES = {
    LogFormat.TEXT: (
        "2026-01-01 00:00:00,250 level=INFO logger=gtm.access.zone POST /v1/chat/completions "
        "200 request_id=d5b1d42fed6d498d0000000000000521 decision_id=8ade2aba0918444a0000000000"
        "000520 model=meta-llama/Llama-3.1-8B-Instruct region=bench zone=bench-a gpu=gpu-0 "
        "status=200 end=ok ttft_ms=2.2 tokens_in=14 tokens_out=1 tokens_source=estimate "
        "duration_ms=2.3 method=POST path=/v1/chat/completions peer=127.0.0.1\n"
        "2026-01-01 00:00:00,250 level=INFO logger=gtm.access.zone POST /v1/chat/completions "
        '499 request_id=client-id tenant="a b" model=m region=bench zone=bench-a status=499 '
        "end=disconnect tokens_in=0 duration_ms=2.3 method=POST path=/v1/chat/completions "
        "client=192.0.2.7 peer=127.0.0.1\n"
    ),
    LogFormat.JSON: (
        '{"ts":"2026-01-01T00:00:00.250Z","level":"INFO","logger":"gtm.access.zone","msg":"POST'
        ' /v1/chat/completions 200","request_id":"d5b1d42fed6d498d0000000000000521","decision_'
        'id":"8ade2aba0918444a0000000000000520","tenant":null,"model":"meta-llama/Llama-3.1-8B-'
        'Instruct","country":null,"location_source":null,"region":"bench","zone":"bench-a","gp'
        'u":"gpu-0","spill_from":null,"spill_to":null,"status":200,"end":"ok","ttft_ms":2.2,"to'
        'kens_in":14,"tokens_out":1,"tokens_source":"estimate","duration_ms":2.3,"method":"POST'
        '","path":"/v1/chat/completions","client":null,"peer":"127.0.0.1"}\n'
        '{"ts":"2026-01-01T00:00:00.250Z","level":"INFO","logger":"gtm.access.zone","msg":"POST'
        ' /v1/chat/completions 499","request_id":"client-id","decision_id":null,"tenant":"a b",'
        '"model":"m","country":null,"location_source":null,"region":"bench","zone":"bench-a","g'
        'pu":null,"spill_from":null,"spill_to":null,"status":499,"end":"disconnect","ttft_ms":n'
        'ull,"tokens_in":0,"tokens_out":null,"tokens_source":null,"duration_ms":2.3,"method":"P'
        'OST","path":"/v1/chat/completions","client":"192.0.2.7","peer":"127.0.0.1"}\n'
    ),
}


@pytest.mark.parametrize("log_format", list(LogFormat))
@pytest.mark.parametrize("direct", [True, False])
def test_a_zone_access_line_is_pinned_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, log_format: LogFormat, direct: bool
) -> None:
    """The whole line (fields, order, quoting, rounding, the time), written straight to
    gtm's handler and through ``logging`` (a filter on the way) alike."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    stream = io.StringIO()
    configure("warning", log_format, stream)
    monkeypatch.setattr(logging.getLogger(ACCESS_LOGGER), "level", logging.INFO)
    if not direct:
        monkeypatch.setattr(root.handlers[0], "filters", [logging.Filter("gtm")])
    monkeypatch.setattr("time.time", lambda: 1_767_225_600.25)
    clock = iter([10.0, 10.0022, 10.0023, 20.0, 20.0023])
    log = access.AccessLog("zone", region="bench", zone="bench-a", clock=lambda: next(clock))

    answered = _Scope({"Content-Type": "application/json"})
    note = answered._state[access.NOTE_KEY] = log.begin(answered)
    access.tell(
        answered,
        model="meta-llama/Llama-3.1-8B-Instruct",
        tokens_in=14,
        tokens_out=1,
        tokens_source=TokenSource.ESTIMATE,
    )
    headers = CIMultiDict(
        {
            "x-request-id": "d5b1d42fed6d498d0000000000000521",
            "x-gtm-decision-id": "8ade2aba0918444a0000000000000520",
            "x-gtm-zone": "bench-a",
            "x-gtm-gpu": "gpu-0",
        }
    )
    log.prepared(note, 200, headers)
    log.end(answered, note, 200, End.OK)

    gone = _Scope({"X-Request-Id": "client-id"})
    note = gone._state[access.NOTE_KEY] = log.begin(gone)
    access.tell(gone, tenant="a b", model="m", client="192.0.2.7", tokens_in=0)
    log.end(gone, note, CLIENT_CLOSED, End.DISCONNECT)
    for handler in root.handlers:
        handler.flush()
    assert stream.getvalue() == _ZONE_LINES[log_format]
