"""gtm.logs: JSON and text lines, their structured fields, and who configures the root."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import signal
import subprocess
import sys
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtm import logs, native
from gtm.logs import (
    _REMEMBERED,
    BATCH_LIMIT,
    LATER_CHARS,
    MAX_BEHIND,
    SLICE_LINES,
    JsonFormatter,
    LineWriter,
    LogFormat,
    TextFormatter,
    _text_value,
    announce,
    configure,
    configured_format,
    fields,
)
from gtm.testing.kernels import expected_state


def _record(
    msg: str = "hello %s",
    args: tuple[object, ...] = ("world",),
    *,
    exc: bool = False,
    **extra: object,
) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    record = logging.getLogger("gtm.test").makeRecord(
        "gtm.test", logging.WARNING, "f.py", 1, msg, args, exc_info, extra=extra
    )
    record.created = 1_767_225_600.25  # 2026-01-01T00:00:00.250Z
    return record


def test_a_json_line_has_ts_level_logger_msg_and_the_extra_fields_as_keys() -> None:
    line = JsonFormatter().format(_record(request_id="r1", status=200, ratio=0.5, gone=None))
    assert "\n" not in line
    document = json.loads(line)
    assert document == {
        "ts": "2026-01-01T00:00:00.250Z",
        "level": "WARNING",
        "logger": "gtm.test",
        "msg": "hello world",
        "request_id": "r1",
        "status": 200,
        "ratio": 0.5,
        "gone": None,
    }
    parsed = datetime.fromisoformat(document["ts"])
    assert parsed.tzinfo is not None
    assert parsed.utcoffset() == UTC.utcoffset(None)


def test_a_json_line_writes_an_exception_as_one_string_and_odd_values_as_str() -> None:
    document = json.loads(JsonFormatter().format(_record(exc=True, where=("a", 1))))
    assert isinstance(document["exc"], str)
    assert "ValueError: boom" in document["exc"]
    assert "Traceback" in document["exc"]
    assert document["where"] == "('a', 1)"


def test_a_json_line_never_lets_an_extra_field_replace_the_standard_keys() -> None:
    record = _record()
    record.__dict__["level"] = "forged"
    assert json.loads(JsonFormatter().format(record))["level"] == "WARNING"


def test_a_text_line_is_unchanged_without_extra_fields() -> None:
    line = TextFormatter().format(_record())
    assert line.endswith(" level=WARNING logger=gtm.test hello world")


def test_a_text_line_adds_extra_fields_as_key_value_and_quotes_what_would_split_it() -> None:
    line = TextFormatter().format(
        _record(request_id="r1", tenant=None, zone="", path="/v1/x", note="two words", ok=True)
    )
    assert line.endswith(' hello world request_id=r1 path=/v1/x note="two words" ok=true'), line
    assert "tenant" not in line
    assert "zone" not in line


def test_a_text_value_is_quoted_exactly_when_a_character_is_whitespace_a_quote_or_equals() -> None:
    # The one-scan check agrees with str.isspace on every code point (Unicode spaces too).
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        quoted = _text_value(f"a{char}b") != f"a{char}b"
        assert quoted == (char.isspace() or char in '"='), hex(code)


@pytest.mark.parametrize(
    "value", [0, -1, 10**30, 1.5, -0.0, 1e-300, 1e300, float("inf"), float("-inf"), float("nan")]
)
def test_a_number_is_written_as_its_str_unquoted(value: float) -> None:
    assert _text_value(value) == str(value)


def test_a_text_line_times_each_record_as_logging_does_within_and_across_seconds() -> None:
    ours, reference = TextFormatter(), logging.Formatter()
    for created in (1.0, 1.5, 1.999, 2.0, 1_700_000_000.123, 1_700_000_000.9995, 1.25):
        record = _record()
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert ours.formatTime(record) == reference.formatTime(record)


def test_fields_are_the_extras_in_the_order_given() -> None:
    assert list(fields(_record(b=1, a=2))) == [("b", 1), ("a", 2)]


def test_configure_leaves_a_root_with_foreign_handlers_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = logging.getLogger()
    foreign = logging.NullHandler()
    monkeypatch.setattr(root, "handlers", [foreign])
    monkeypatch.setattr(root, "level", logging.WARNING)
    configure("debug", LogFormat.JSON)
    assert root.handlers == [foreign]
    assert root.level == logging.WARNING
    assert configured_format() is LogFormat.TEXT


def test_configure_writes_json_lines_and_announce_follows_the_format(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    stream = io.StringIO()
    configure("info", LogFormat.JSON, stream)
    assert configured_format() is LogFormat.JSON
    logging.getLogger("gtm.x").info("started", extra={"port": 8080})
    assert json.loads(stream.getvalue())["port"] == 8080
    announce("zone agent listening on http://127.0.0.1:1")
    announced = json.loads(capsys.readouterr().out)
    assert announced["msg"] == "zone agent listening on http://127.0.0.1:1"
    assert announced["level"] == "INFO"

    configure("info", LogFormat.TEXT)  # the same handler, the other format
    assert len(root.handlers) == 1
    assert configured_format() is LogFormat.TEXT
    announce("zone agent listening on http://127.0.0.1:1")
    assert capsys.readouterr().out == "zone agent listening on http://127.0.0.1:1\n"


ACCESS_FIELDS: dict[str, object] = {
    "request_id": "0123abcd",
    "decision_id": None,
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "zone": "",
    "status": 200,
    "end": "ok",
    "ttft_ms": 1.2,
    "note": 'says "hi" = x',
    "duration_ms": 3.0,
}


@pytest.mark.parametrize("log_format", list(LogFormat))
@pytest.mark.parametrize("created", [1_767_225_600.25, 1_767_225_601.9995, 1_767_225_602.0])
def test_a_line_writer_writes_the_bytes_logging_writes(
    monkeypatch: pytest.MonkeyPatch, log_format: LogFormat, created: float
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    stream = io.StringIO()
    configure("warning", log_format, stream)
    log = logging.getLogger("gtm.access.unit")
    monkeypatch.setattr(log, "level", logging.INFO)
    monkeypatch.setattr("time.time", lambda: created)  # logging's clock and the writer's
    log.info("POST /v1/chat/completions 200", extra=ACCESS_FIELDS)
    through_logging = stream.getvalue()
    stream.seek(0)
    stream.truncate()
    assert LineWriter(log).write("POST /v1/chat/completions 200", ACCESS_FIELDS)
    assert stream.getvalue() == through_logging
    assert through_logging.count("\n") == 1


def test_a_line_writer_leaves_a_line_to_logging_when_another_handler_or_a_filter_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    stream = io.StringIO()
    configure("info", LogFormat.TEXT, stream)
    log = logging.getLogger("gtm.access.unit2")
    parent, ours = logging.getLogger("gtm.access"), root.handlers[0]
    writer = LineWriter(log)
    assert writer.handler() is ours
    formatter = ours.formatter
    adds: tuple[Callable[[], None], ...] = (
        lambda: parent.addHandler(logging.NullHandler()),
        lambda: root.addFilter(logging.Filter("gtm.other")),
        lambda: ours.addFilter(logging.Filter("gtm.other")),
        lambda: ours.setFormatter(logging.Formatter()),
    )
    for add in adds:
        add()
        assert writer.handler() is None
        assert not writer.write("GET / 200", {"status": 200})
        assert "root handlers" in writer.why_not()
        parent.handlers.clear()
        root.filters.clear()
        ours.filters.clear()
        ours.setFormatter(formatter)
        assert writer.handler() is ours
    monkeypatch.setattr(root, "handlers", [*root.handlers, logging.NullHandler()])
    assert writer.handler() is None
    assert stream.getvalue() == ""


# --- the batch: one write per event-loop iteration ------------------------------------


class CountingStream(io.StringIO):
    """A text stream that counts its ``write`` calls (each a system call on stderr)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str, /) -> int:
        self.writes += 1
        return super().write(text)


class BrokenStream(io.StringIO):
    """A stream whose reader went away: every write is EPIPE."""

    def write(self, text: str, /) -> int:
        raise BrokenPipeError(32, "Broken pipe")


async def iteration_end() -> None:
    """Return once the running loop's current iteration has run its callbacks: a
    callback scheduled now runs after every one scheduled before it (asyncio runs
    ``call_soon`` callbacks in order)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_soon(done.set_result, None)
    await done


def gtm_handler(
    monkeypatch: pytest.MonkeyPatch,
    log_format: LogFormat,
    stream: io.StringIO,
    flush_interval: float = 0.0,
) -> tuple[logging.Handler, LineWriter]:
    """gtm's handler alone on the root, writing ``stream``, and an access writer. The
    batch is written at the end of each loop iteration (``flush_interval`` 0) unless
    the test gives an interval."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    configure("warning", log_format, stream)
    log = logging.getLogger("gtm.access.batch")
    monkeypatch.setattr(log, "level", logging.INFO)
    writer = LineWriter(log)
    handler = writer.handler()
    assert isinstance(handler, logs._Handler)
    handler.flush_interval = flush_interval
    return handler, writer


def messages(stream: io.StringIO, log_format: LogFormat) -> list[str]:
    lines = stream.getvalue().splitlines()
    if log_format is LogFormat.JSON:
        return [json.loads(line)["msg"] for line in lines]
    return [line.split(" logger=")[1].split(" ", 1)[1].split(" status=")[0] for line in lines]


@pytest.mark.parametrize("log_format", list(LogFormat))
async def test_a_loop_iterations_lines_are_one_write_at_its_end(
    monkeypatch: pytest.MonkeyPatch, log_format: LogFormat
) -> None:
    stream = CountingStream()
    _, writer = gtm_handler(monkeypatch, log_format, stream)
    for n in range(3):
        assert writer.write(f"GET /{n} 200", {"status": 200})
    assert (stream.getvalue(), stream.writes) == ("", 0)
    await iteration_end()
    assert messages(stream, log_format) == ["GET /0 200", "GET /1 200", "GET /2 200"]
    assert stream.writes == 1
    assert writer.write("GET /3 200", {"status": 200})  # the next iteration: a batch again
    await iteration_end()
    assert stream.writes == 2
    assert messages(stream, log_format)[-1] == "GET /3 200"


class WriteAwaited(CountingStream):
    """A counting stream whose writes a test can await (no sleeping for them)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def write(self, text: str, /) -> int:
        if not self.written.done():
            self.written.set_result(asyncio.get_running_loop().time())
        return super().write(text)


@pytest.mark.parametrize("log_format", list(LogFormat))
async def test_lines_of_many_iterations_are_one_write_once_the_interval_is_over(
    monkeypatch: pytest.MonkeyPatch, log_format: LogFormat
) -> None:
    stream = WriteAwaited()
    interval = 0.05
    _, writer = gtm_handler(monkeypatch, log_format, stream, flush_interval=interval)
    loop = asyncio.get_running_loop()
    first = loop.time()
    for n in range(3):  # a request per loop iteration: the case one write each cost most
        assert writer.write(f"GET /{n} 200", {"status": 200})
        await iteration_end()
    assert stream.writes == 0
    written_at = await stream.written
    assert written_at - first >= interval * 0.99  # (the loop's clock rounds timers)
    assert stream.writes == 1
    assert messages(stream, log_format) == ["GET /0 200", "GET /1 200", "GET /2 200"]


async def test_a_line_after_an_early_write_still_waits_at_most_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = WriteAwaited()
    _, writer = gtm_handler(monkeypatch, LogFormat.TEXT, stream, flush_interval=0.05)
    writer.write("GET /a 200", {"status": 200})
    logging.getLogger("gtm.other").warning("in between")  # writes the batch first
    assert messages(stream, LogFormat.TEXT) == ["GET /a 200", "in between"]
    stream.written = asyncio.get_running_loop().create_future()
    writer.write("GET /b 200", {"status": 200})  # the first line's timer writes it
    await stream.written
    assert messages(stream, LogFormat.TEXT)[-1] == "GET /b 200"


async def test_a_line_joining_a_scheduled_batch_does_not_ask_for_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Python 3.11's get_running_loop() makes a getpid(2) each call: one per access line.
    stream = WriteAwaited()
    _, writer = gtm_handler(monkeypatch, LogFormat.TEXT, stream, flush_interval=0.05)
    asked = 0
    running = asyncio.get_running_loop

    def counting() -> asyncio.AbstractEventLoop:
        nonlocal asked
        asked += 1
        return running()

    monkeypatch.setattr(asyncio, "get_running_loop", counting)  # what gtm.logs calls
    for n in range(5):
        writer.write(f"GET /{n} 200", {"status": 200})
    assert asked == 1  # the first line schedules the write; the others join it
    await stream.written
    assert messages(stream, LogFormat.TEXT) == [f"GET /{n} 200" for n in range(5)]


async def test_a_line_from_a_thread_without_a_loop_joins_the_scheduled_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = WriteAwaited()
    _, writer = gtm_handler(monkeypatch, LogFormat.TEXT, stream, flush_interval=0.05)
    writer.write("GET /loop 200", {"status": 200})
    await asyncio.to_thread(writer.write, "GET /thread 200", {"status": 200})
    assert stream.writes == 0  # bounded by the loop's timer, not written alone
    await stream.written
    assert messages(stream, LogFormat.TEXT) == ["GET /loop 200", "GET /thread 200"]


def test_the_handler_configure_installs_waits_the_documented_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    configure("warning", LogFormat.TEXT, io.StringIO())
    (handler,) = root.handlers
    assert isinstance(handler, logs._Handler)
    assert handler.flush_interval == logs.FLUSH_INTERVAL_S > 0


@pytest.mark.parametrize("log_format", list(LogFormat))
async def test_another_line_of_the_handler_comes_after_the_batch_written_before_it(
    monkeypatch: pytest.MonkeyPatch, log_format: LogFormat
) -> None:
    stream = io.StringIO()
    _, writer = gtm_handler(monkeypatch, log_format, stream)
    writer.write("GET /a 200", {"status": 200})
    logging.getLogger("gtm.other").warning("in between")
    writer.write("GET /b 200", {"status": 200})
    assert messages(stream, log_format) == ["GET /a 200", "in between"]
    await iteration_end()
    assert messages(stream, log_format) == ["GET /a 200", "in between", "GET /b 200"]


@pytest.mark.parametrize("log_format", list(LogFormat))
async def test_logging_shutdown_writes_the_batch(
    monkeypatch: pytest.MonkeyPatch, log_format: LogFormat
) -> None:
    stream = io.StringIO()
    handler, writer = gtm_handler(monkeypatch, log_format, stream)
    writer.write("GET /a 200", {"status": 200})
    assert stream.getvalue() == ""
    handler.flush()  # setStream's way, and logging.shutdown's first step
    assert messages(stream, log_format) == ["GET /a 200"]
    writer.write("GET /b 200", {"status": 200})
    logging.shutdown([weakref.ref(handler)])  # what atexit runs at a clean exit
    assert messages(stream, log_format) == ["GET /a 200", "GET /b 200"]


async def test_closing_the_handler_writes_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    handler, writer = gtm_handler(monkeypatch, LogFormat.TEXT, stream)
    writer.write("GET /a 200", {"status": 200})
    handler.close()
    assert messages(stream, LogFormat.TEXT) == ["GET /a 200"]


def test_without_a_running_loop_each_line_is_written_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = CountingStream()
    _, writer = gtm_handler(monkeypatch, LogFormat.TEXT, stream)
    writer.write("GET /a 200", {"status": 200})
    assert (messages(stream, LogFormat.TEXT), stream.writes) == (["GET /a 200"], 1)


def test_a_batch_left_by_a_closed_loop_is_written_before_the_next_loops_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    _, writer = gtm_handler(monkeypatch, LogFormat.TEXT, stream)
    first = asyncio.new_event_loop()
    first.call_soon(writer.write, "GET /1 200", {"status": 200})
    first.call_soon(first.stop)  # the loop stops before the iteration that would write
    first.run_forever()
    first.close()
    assert stream.getvalue() == ""

    async def second() -> None:
        writer.write("GET /2 200", {"status": 200})
        await iteration_end()

    asyncio.run(second())
    assert messages(stream, LogFormat.TEXT) == ["GET /1 200", "GET /2 200"]


async def test_a_batch_of_64_kib_goes_to_its_slices_without_waiting_for_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = CountingStream()
    handler, writer = gtm_handler(monkeypatch, LogFormat.TEXT, stream, flush_interval=3600.0)
    assert isinstance(handler, logs._Handler)
    # A line not yet formatted counts LATER_CHARS towards the limit.
    lines = BATCH_LIMIT // LATER_CHARS
    fields_ = {"status": 200, "pad": "x" * 1000}
    for _ in range(lines - 1):
        writer.write("GET / 200", fields_)
    assert handler._slicing is None  # below the limit: the interval's timer only
    writer.write("GET / 200", fields_)
    assert stream.writes == 0  # at the limit: not formatted in the adding request's way
    for _ in range(-(-lines // SLICE_LINES)):
        await iteration_end()
    # Every line written, well before the interval (an hour); a write once 64 KiB of
    # text is ready (the text is over twice that), and one for the rest.
    text = stream.getvalue()
    assert len(text.splitlines()) == lines
    assert 1 < stream.writes <= -(-len(text) // BATCH_LIMIT)


@pytest.mark.parametrize("log_format", list(LogFormat))
async def test_a_batch_is_formatted_a_slice_per_iteration_and_written_once(
    monkeypatch: pytest.MonkeyPatch, log_format: LogFormat
) -> None:
    # A request arriving while a batch is formatted waits for one slice, not the batch.
    stream = CountingStream()
    _, writer = gtm_handler(monkeypatch, log_format, stream)
    events: list[str] = []

    class Told(_Source):
        def message(self) -> str:
            events.append("line")
            return super().message()

    count = 2 * SLICE_LINES + 5
    for n in range(count):
        writer.write_line(Told(n), ("status", "end"))
    loop = asyncio.get_running_loop()
    ticks = 0

    def tick() -> None:  # another callback chain: one step per iteration
        nonlocal ticks
        events.append("tick")
        ticks += 1
        if ticks < 5:
            loop.call_soon(tick)

    loop.call_soon(tick)
    for _ in range(5):
        await iteration_end()
    runs = [len(run) for run in "".join("L" if e == "line" else " " for e in events).split()]
    assert runs == [SLICE_LINES, SLICE_LINES, 5]
    assert stream.writes == 1  # one write, once every line is formatted
    assert messages(stream, log_format) == [f"GET /{n} 200" for n in range(count)]


async def test_lines_far_behind_their_slices_are_formatted_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = CountingStream()
    handler, writer = gtm_handler(monkeypatch, LogFormat.TEXT, stream, flush_interval=3600.0)
    assert isinstance(handler, logs._Handler)
    count = MAX_BEHIND + 200  # made in one iteration: slices would never catch up
    for n in range(count):
        writer.write(f"GET /{n} 200", {"status": 200})
    await iteration_end()
    assert len(stream.getvalue().splitlines()) == count - len(handler._batch)
    assert len(handler._batch) < BATCH_LIMIT // LATER_CHARS  # the batch the timer waits for


class _Source:
    """A line source (an access record's shape) that counts its reads."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reads = 0

    def message(self) -> str:
        self.reads += 1
        return f"GET /{self.n} 200"

    def values(self) -> tuple[object, ...]:
        return (self.n, "ok")


@pytest.mark.parametrize("log_format", list(LogFormat))
async def test_a_line_is_formatted_when_its_batch_is_written_with_the_time_it_was_added(
    monkeypatch: pytest.MonkeyPatch, log_format: LogFormat
) -> None:
    stream = io.StringIO()
    _, writer = gtm_handler(monkeypatch, log_format, stream)
    added, written = 1_700_000_000.25, 1_700_000_060.75
    monkeypatch.setattr("time.time", lambda: added)
    sources = [_Source(n) for n in range(3)]
    for source in sources:
        assert writer.write_line(source, ("status", "end"))
    assert writer.write_fields("GET /x 200", ("status",), (404,))
    # Held unformatted: nothing read yet.
    assert [s.reads for s in sources] == [0, 0, 0]
    monkeypatch.setattr("time.time", lambda: written)
    await iteration_end()
    assert [s.reads for s in sources] == [1, 1, 1]
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4
    # Each line as the formatter writes it at the time it was added, not written.
    formatter = logs.formatter(log_format)
    assert isinstance(formatter, TextFormatter | JsonFormatter)
    name = "gtm.access.batch"
    expected = [
        formatter.info_fields(name, f"GET /{n} 200", ("status", "end"), (n, "ok"), added)
        for n in range(3)
    ] + [formatter.info_fields(name, "GET /x 200", ("status",), (404,), added)]
    assert lines == expected
    assert formatter.info_fields(name, "GET /x 200", ("status",), (404,), written) != lines[3]


@pytest.mark.parametrize("log_format", list(LogFormat))
async def test_a_broken_pipe_goes_to_handle_error_and_never_into_the_request(
    monkeypatch: pytest.MonkeyPatch, log_format: LogFormat
) -> None:
    handler, writer = gtm_handler(monkeypatch, log_format, BrokenStream())
    errors: list[tuple[logging.LogRecord, BaseException | None]] = []
    monkeypatch.setattr(
        handler, "handleError", lambda record: errors.append((record, sys.exc_info()[1]))
    )
    assert writer.write("GET /a 200", {"status": 200})
    assert writer.write("GET /b 200", {"status": 200})
    await iteration_end()
    assert len(errors) == 1  # one batch, one error
    assert isinstance(errors[0][1], BrokenPipeError)
    assert errors[0][0].getMessage() == "2 buffered lines"
    logging.getLogger("gtm.other").warning("after")  # the handler goes on as before
    assert len(errors) == 2


@pytest.mark.parametrize("log_format", list(LogFormat))
def test_a_line_that_cannot_be_formatted_goes_to_handle_error(
    monkeypatch: pytest.MonkeyPatch, log_format: LogFormat
) -> None:
    handler, writer = gtm_handler(monkeypatch, log_format, io.StringIO())
    errors: list[BaseException | None] = []
    monkeypatch.setattr(handler, "handleError", lambda record: errors.append(sys.exc_info()[1]))

    def broken(name: str, message: str, keys: object, values: object, created: float) -> str:
        raise RuntimeError("cannot format")

    monkeypatch.setattr(handler.formatter, "info_fields", broken)
    assert writer.write("GET /a 200", {"msg": "a record's own name", "status": 200})
    assert [type(error) for error in errors] == [RuntimeError]


async def test_a_closed_stream_goes_to_handle_error(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    handler, writer = gtm_handler(monkeypatch, LogFormat.JSON, stream)
    errors: list[BaseException | None] = []
    monkeypatch.setattr(handler, "handleError", lambda record: errors.append(sys.exc_info()[1]))
    writer.write("GET /a 200", {"status": 200})
    stream.close()
    await iteration_end()
    assert len(errors) == 1
    assert isinstance(errors[0], ValueError)  # I/O operation on closed file


def test_a_term_signal_at_shutdown_loses_no_line(tmp_path: Path) -> None:
    """A daemon's way out (gtm.serve.until_signalled, then asyncio.run's end and the
    interpreter's exit) writes the lines its last requests added, with no iteration
    left to end: a real process, a real SIGTERM."""
    child = subprocess.Popen(
        [sys.executable, "-c", _SIGTERM_CHILD],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=30)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, stderr
    lines = stderr.splitlines()
    assert [json.loads(line)["msg"] for line in lines] == [f"GET /{n} 200" for n in range(100)]


_SIGTERM_CHILD = """
import asyncio, logging, sys
from gtm.logs import LineWriter, LogFormat, configure
from gtm.serve import until_signalled

async def main():
    configure("warning", LogFormat.JSON)
    log = logging.getLogger("gtm.access.zone")
    log.setLevel(logging.INFO)
    writer = LineWriter(log)
    waiting = asyncio.create_task(until_signalled())
    await asyncio.sleep(0)  # one iteration: its first step installed the handlers
    print("ready", flush=True)
    await waiting
    for n in range(100):  # the requests the stop grace let finish, nothing awaited since
        assert writer.write(f"GET /{n} 200", {"status": 200})

asyncio.run(main())
"""


# --- the fast formatting is the reference's, byte for byte ----------------------------


class _Kind(StrEnum):
    OK = "ok"
    ODD = "a b"


#: Access fields, the JSON head's keys, a LogRecord's own attributes, a private one.
_NAMED = "request_id model status ts level logger msg levelname message args _private exc end"
_KEYS = st.one_of(st.sampled_from(_NAMED.split()), st.text(min_size=1, max_size=8))
_VALUES = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", '"', "=", "a=b", "\x00", "\u2028", "é ü", "\\"]),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(),
    st.none(),
    st.booleans(),
    st.sampled_from(list(_Kind)),
    st.tuples(st.integers(), st.text(max_size=3)),
)


@settings(max_examples=200, deadline=None)
@given(
    extra=st.dictionaries(_KEYS, _VALUES, max_size=8),
    message=st.text(max_size=12),
    created=st.floats(min_value=1e9, max_value=4e9),
)
def test_info_line_is_byte_for_byte_what_format_writes(
    extra: dict[str, object], message: str, created: float
) -> None:
    name = "gtm.access.zone"
    text, document = TextFormatter(), JsonFormatter()
    with mock.patch("time.time", return_value=created):
        record = logging.LogRecord(name, logging.INFO, __file__, 0, message, (), None)
        lines = [
            (text.info_line(name, message, extra), document.info_line(name, message, extra))
            for _ in range(2)
        ]
    for key, value in extra.items():  # as makeRecord's extra=, without its KeyError
        if key not in record.__dict__ and key not in {"message", "asctime"}:
            record.__dict__[key] = value
    reference = (TextFormatter().format(record), JsonFormatter().format(record))
    assert lines == [reference, reference]  # the second from what each remembered


def test_what_a_formatter_remembers_is_bounded_and_forgetting_changes_no_line() -> None:
    text, document = TextFormatter(), JsonFormatter()
    name = "gtm.access.zone"
    with mock.patch("time.time", return_value=1_767_225_600.25):
        for n in range(_REMEMBERED + 10):  # a new value per line, under a key not *_id
            extra = {"route": f"r {n}", "model": "m", f"key{n % 7}": n}
            lines = (text.info_line(name, "m", extra), document.info_line(name, "m", extra))
            assert len(text._texts) <= _REMEMBERED
            assert len(document._texts) <= _REMEMBERED
            if n % 1000 == 0 or n >= _REMEMBERED - 2:  # before and after forgetting
                record = logging.LogRecord(name, logging.INFO, __file__, 0, "m", (), None)
                record.__dict__.update(extra)
                assert lines == (TextFormatter().format(record), JsonFormatter().format(record))


def test_ids_are_written_without_being_remembered() -> None:
    # A request id never repeats: remembering it would push out, every few thousand
    # lines, the values that do (a model, a zone), and then empty the memo.
    text, document = TextFormatter(), JsonFormatter()
    name = "gtm.access.zone"
    with mock.patch("time.time", return_value=1_767_225_600.25):
        for n in range(_REMEMBERED + 10):
            extra = {"request_id": f"r{n}", "decision_id": f"d{n}", "model": "m"}
            line = text.info_line(name, "m", extra)
            assert f"request_id=r{n} decision_id=d{n}" in line
            assert f'"request_id":"r{n}","decision_id":"d{n}"' in document.info_line(
                name, "m", extra
            )
    assert set(text._texts) == {"m"}
    assert set(document._texts) == {"m"}


# --- the fields' two forms: gtm/_logline.c and its Python twin -------------------------


FIELD_FORMS = {"compiled": logs._fields_text, "python": logs._fields_text_python}


def test_the_field_kernel_is_compiled_where_it_must_be() -> None:
    expected = expected_state()
    assert native.kernel("gtm._logline").state is expected
    assert logs.COMPILED is (expected is not native.KernelState.PYTHON)


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.sampled_from(["", "a=", "request_id=", "x_id=", "id="]), _VALUES)),
    limit=st.integers(min_value=1, max_value=4),
    remembered=st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=4),
)
def test_both_forms_write_the_same_fields_and_remember_the_same_texts(
    pairs: list[tuple[str, object]], limit: int, remembered: dict[object, str]
) -> None:
    prefixes = tuple(p for p, _ in pairs)
    values = tuple(v for _, v in pairs)
    got = []
    for form in FIELD_FORMS.values():
        texts = dict(remembered)
        got.append((form(prefixes, values, texts, limit, logs._text_value), texts))
    assert got[0] == got[1]


@pytest.mark.parametrize("form", list(FIELD_FORMS.values()), ids=list(FIELD_FORMS))
def test_both_forms_refuse_prefixes_and_values_of_different_lengths(
    form: Callable[..., str],
) -> None:
    texts: dict[object, str] = {}
    with pytest.raises(ValueError, match="2 prefixes for 1 values"):
        form(("a=", "b="), ("x",), texts, 8, logs._text_value)
    assert texts == {}  # nothing remembered from a refused line


@pytest.mark.parametrize("form", list(FIELD_FORMS.values()), ids=list(FIELD_FORMS))
def test_an_error_from_a_values_text_reaches_the_caller(form: Callable[..., str]) -> None:
    def broken(value: object) -> str:
        raise RuntimeError("no text")

    with pytest.raises(RuntimeError, match="no text"):
        form(("a=",), (object(),), {}, 8, broken)


@pytest.mark.parametrize("form", list(FIELD_FORMS))
@settings(max_examples=100, deadline=None)
@given(extra=st.dictionaries(_KEYS, _VALUES, max_size=8), message=st.text(max_size=12))
def test_info_line_by_either_form_is_what_format_writes(
    form: str, extra: dict[str, object], message: str
) -> None:
    name = "gtm.access.zone"
    created = 1_767_225_600.25
    with (
        mock.patch("time.time", return_value=created),
        mock.patch.object(logs, "_fields_text", FIELD_FORMS[form]),
    ):
        record = logging.LogRecord(name, logging.INFO, __file__, 0, message, (), None)
        lines = [TextFormatter().info_line(name, message, extra) for _ in range(2)]
    for key, value in extra.items():
        if key not in record.__dict__ and key not in {"message", "asctime"}:
            record.__dict__[key] = value
    assert lines == [TextFormatter().format(record)] * 2
