"""gtm.logs: JSON and text lines, their structured fields, and who configures the root."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from gtm.logs import (
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
