"""How every gtm process logs: one line per record on stderr, as text or as JSON.

``gtm --log-format text|json`` (``GTM_LOG_FORMAT``) picks the format for the process
and, through ``gtm up``, for every process it starts (:func:`configured_format` tells
``gtm up`` what the parent runs with):

* **text** (the default): ``<time> level=<LEVEL> logger=<name> <message>``, then the
  record's structured fields (``extra=``) as ``key=value``; a value with a space, a
  quote or an ``=`` is written as a JSON string, and an empty one is left out, so a line
  stays one line and compact;
* **json**: one object per line: ``ts`` (RFC 3339, UTC, milliseconds), ``level``,
  ``logger``, ``msg``, the record's structured fields as keys, and ``exc`` (the
  traceback as one string) when the record has one. Values that are not JSON scalars
  are written as their ``str``. A daemon's announcement on stdout (``listening on …``,
  :func:`announce`) is such an object too, so stdout and stderr read together are JSON.

The structured fields are whatever a call passes as ``extra=`` (the per-request access
line, :mod:`gtm.access`, is the main user); the formatters know nothing of their names.
No third-party dependency: the standard library's ``logging`` and ``json``.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import IO, cast


class LogFormat(StrEnum):
    """``--log-format``."""

    TEXT = "text"
    JSON = "json"


#: A LogRecord's own attributes: everything else on a record came from ``extra=``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

_TEXT_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"

_Scalar = str | int | float | bool | None


def fields(record: logging.LogRecord) -> list[tuple[str, object]]:
    """The record's structured fields (its ``extra=``), in the order they were given."""
    return [
        (key, value)
        for key, value in record.__dict__.items()
        if key not in _STANDARD and key[:1] != "_"
    ]


def _scalar(value: object) -> _Scalar:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


#: What makes a text value a JSON string: whitespace (re's ``\s`` on str is the set
#: ``str.isspace`` answers for, code point by code point), a quote or an ``=``. One
#: regex scan: the access line writes a score of values per request.
_NEEDS_QUOTES = re.compile(r'[\s"=]')


def _text_value(value: object) -> str:
    cls = type(value)
    if cls is str:  # the usual value, and its own str
        text = cast(str, value)
        return text if text and _NEEDS_QUOTES.search(text) is None else json.dumps(text)
    if cls is int or cls is float:
        return str(value)  # digits, a sign, a point, an exponent, inf or nan: never quoted
    text = "true" if value is True else "false" if value is False else str(value)
    if not text or _NEEDS_QUOTES.search(text) is not None:
        return json.dumps(text)
    return text


class TextFormatter(logging.Formatter):
    """``<time> level=… logger=… <message> key=value…`` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)
        #: The last second formatted and its text (the access log writes many lines a
        #: second, each of which would format the same date and time again).
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self._asctime(record.created, record.msecs)

    def _asctime(self, created: float, msecs: float) -> str:
        second, text = self._second
        if second != int(created):
            second = int(created)
            text = time.strftime(self.default_time_format, self.converter(created))
            self._second = (second, text)
        msec = self.default_msec_format
        return text if not msec else msec % (text, msecs)

    def formatMessage(self, record: logging.LogRecord) -> str:
        extra = " ".join(
            [
                f"{key}={_text_value(value)}"
                for key, value in fields(record)
                if value is not None and value != ""
            ]
        )
        return _with_extra(super().formatMessage(record), record.message, extra)

    def info_line(self, name: str, message: str, extra: Mapping[str, object]) -> str:
        """The line :meth:`format` writes for an INFO record of logger ``name`` with
        ``message`` and the structured fields ``extra``, made now (:class:`LineWriter`)."""
        created = time.time()
        msecs = int((created - int(created)) * 1000) + 0.0  # as logging.LogRecord
        head = f"{self._asctime(created, msecs)} level=INFO logger={name} {message}"
        text = " ".join(
            [
                f"{key}={_text_value(value)}"
                for key, value in extra.items()
                if value is not None and value != "" and _is_extra(key)
            ]
        )
        return _with_extra(head, message, text)


def _is_extra(key: str) -> bool:
    """Whether :func:`fields` would read ``key`` back from a record's ``extra=``."""
    return key not in _STANDARD and key[:1] != "_"


def _with_extra(line: str, message: str, extra: str) -> str:
    if not extra:
        return line
    return f"{line} {extra}" if message else f"{line}{extra}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        document = _json_head(record.created, record.levelname, record.name, record.getMessage())
        for key, value in fields(record):
            document.setdefault(key, _scalar(value))
        if record.exc_info:
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            document["exc"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, ensure_ascii=False, separators=(",", ":"))

    def info_line(self, name: str, message: str, extra: Mapping[str, object]) -> str:
        """As :meth:`TextFormatter.info_line`."""
        document = _json_head(time.time(), "INFO", name, message)
        for key, value in extra.items():
            if _is_extra(key):
                document.setdefault(key, _scalar(value))
        return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


def _json_head(created: float, level: str, name: str, message: str) -> dict[str, object]:
    return {
        "ts": datetime.fromtimestamp(created, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        "level": level,
        "logger": name,
        "msg": message,
    }


def formatter(log_format: LogFormat) -> logging.Formatter:
    return JsonFormatter() if log_format is LogFormat.JSON else TextFormatter()


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure` installs (told apart from a host's own)."""


class LineWriter:
    """Writes one logger's INFO lines itself, as the handler :func:`configure` installs
    would write them, without a ``LogRecord`` and the walk through ``logging``'s
    machinery (the per-request access line, :mod:`gtm.access`).

    It can only while that handler is the one every line of the logger reaches: no
    filter and no other handler on the way up to the root, and the root's handler ours,
    with one of our formatters (:meth:`handler`, checked on each line, so a handler a
    test or a host adds later is honoured). Otherwise :meth:`write` answers False and
    the caller logs the line the usual way; the logger must be enabled for INFO.
    """

    def __init__(self, log: logging.Logger) -> None:
        self._log = log

    def handler(self) -> _Handler | None:
        """The handler that writes every line, when this writer may write them."""
        log: logging.Logger | None = self._log
        root = logging.getLogger()
        while log is not None and log is not root:
            if log.filters or log.handlers or not log.propagate:
                return None
            log = log.parent
        handlers = root.handlers
        if root.filters or len(handlers) != 1:
            return None
        handler = handlers[0]
        if type(handler) is not _Handler or handler.filters or handler.level > logging.INFO:
            return None
        if type(handler.formatter) not in _DIRECT_FORMATTERS:
            return None
        return handler

    def why_not(self) -> str:
        """Why :meth:`handler` is None (for a log line)."""
        root = logging.getLogger()
        formatters = [type(h.formatter).__name__ for h in root.handlers]
        return (
            f"logger {self._log.name} reaches handlers other than gtm's own "
            f"(root handlers: {[type(h).__name__ for h in root.handlers]}, "
            f"formatters: {formatters}) or a filter"
        )

    def write(self, message: str, extra: Mapping[str, object]) -> bool:
        """Write an INFO line of ``message`` and the fields ``extra`` (in order); False
        when this writer may not (:meth:`handler`): nothing was written."""
        handler = self.handler()
        if handler is None:
            return False
        formatter = cast(TextFormatter | JsonFormatter, handler.formatter)
        handler.acquire()
        try:
            line = formatter.info_line(self._log.name, message, extra)
            handler.stream.write(line + handler.terminator)
            handler.flush()
        except Exception:  # as StreamHandler.emit: logging never raises into the caller
            record = self._log.makeRecord(
                self._log.name, logging.INFO, __file__, 0, message, (), None, "write", extra
            )
            handler.handleError(record)
        finally:
            handler.release()
        return True


_DIRECT_FORMATTERS = (TextFormatter, JsonFormatter)


def configure(level: str, log_format: LogFormat, stream: IO[str] | None = None) -> None:
    """Log at ``level`` in ``log_format`` to ``stream`` (stderr) from the root logger.

    As ``logging.basicConfig``: a root logger that already has handlers it did not get
    from here (a test runner's, an embedding program's) is left alone; one configured
    here before gets the new format and level.
    """
    root = logging.getLogger()
    ours = [h for h in root.handlers if isinstance(h, _Handler)]
    if root.handlers and not ours:
        return
    if not ours:
        ours = [_Handler(sys.stderr if stream is None else stream)]
        root.addHandler(ours[0])
    for handler in ours:
        handler.setFormatter(formatter(log_format))
    root.setLevel(level.upper())


def configured() -> bool:
    """Whether :func:`configure` set up this process's root logger (a ``gtm`` command),
    rather than a host (a test runner) that keeps its own."""
    return any(isinstance(h, _Handler) for h in logging.getLogger().handlers)


def configured_format() -> LogFormat:
    """The format the root logger writes (``text`` when it has no gtm formatter): what
    ``gtm up`` passes on to the processes it starts."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, JsonFormatter):
            return LogFormat.JSON
    return LogFormat.TEXT


def announce(message: str, name: str = "gtm") -> None:
    """Say on stdout what a daemon serves (``listening on …``): the plain line in text
    format, one JSON object as :class:`JsonFormatter` writes it (logger ``name``, INFO)
    in JSON format, so a collector reading stdout and stderr together meets JSON only."""
    if configured_format() is LogFormat.JSON:
        record = logging.LogRecord(name, logging.INFO, "", 0, message, (), None)
        message = JsonFormatter().format(record)
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


__all__ = [
    "JsonFormatter",
    "LineWriter",
    "LogFormat",
    "TextFormatter",
    "announce",
    "configure",
    "configured",
    "configured_format",
    "fields",
    "formatter",
]
