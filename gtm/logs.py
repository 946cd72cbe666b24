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

**The access lines are written in batches.** :class:`LineWriter` (the access line's
way to gtm's handler) does not write each line: it adds it to the handler's batch, and
the batch is written with one ``write`` at most :data:`FLUSH_INTERVAL_S` after its
first line (a loop timer; with an interval of 0, at the end of the event-loop iteration
that added it), from the next iteration when it reaches :data:`BATCH_LIMIT`, and at
once when no loop runs in the thread. So a proxy makes one system call for the lines
of many requests, not one each, even when it finishes one request per loop iteration;
a line waits at most the interval (Envoy's file access logs are flushed every second by
default, ``file_flush_interval_msec``), plus its batch's formatting. A line is formatted
when its batch is written, not when it is added: the writer keeps its time
(``time.time()`` then), its message and its values (:meth:`LineWriter.write_line` keeps
the access record itself, which makes them when read), so a proxy's request ends
without the line's formatting, and a batch formats its lines one after another,
:data:`SLICE_LINES` per loop iteration: a request that arrives meanwhile waits for one
slice, not for the batch (a batch of a hundred lines formatted at once held the loop
for a millisecond, in the tail of every request that arrived then). The text is
written once every line taken is formatted, or per :data:`BATCH_LIMIT` of it; lines
more than :data:`MAX_BEHIND` behind their slices are formatted at once. Invariants:

* order: every other line the handler writes (a warning, an error) writes the batch
  first, so lines keep the order they were made in (lines written to stderr past
  gtm's handler, such as ``print(file=sys.stderr)``, may come before a batch made
  earlier in the same iteration);
* nothing is lost on a clean way out: ``flush`` and ``close`` write the batch, and
  ``logging.shutdown`` (run at interpreter exit) calls both; a daemon stopped by
  SIGTERM or SIGINT leaves its loop through :func:`gtm.serve.until_signalled` and
  exits normally, so its last lines are written then; a batch left by a loop that
  stopped before its timer fired is written by the next line's batch or at exit;
* what a SIGKILL (or a crash of the interpreter) can lose is the current batch: the
  lines of at most :data:`FLUSH_INTERVAL_S`, bounded by :data:`BATCH_LIMIT`. That is the
  bound nginx's buffered access log documents: with ``access_log … buffer=size``
  lines are written "if the next log line does not fit into the buffer", after
  ``flush=time``, or when a worker re-opens its logs or shuts down
  (https://nginx.org/en/docs/http/ngx_http_log_module.html#access_log), so a killed
  worker loses what its buffer held; here the buffer is written every interval;
* a write that fails (EPIPE from a reader that went away, a closed stream) goes to the
  handler's ``handleError`` as ``logging``'s own lines' do, and never raises into the
  request that wrote the line; the batch is dropped.

Lines are written whole and one write holds whole lines, so a reader never sees half a
line from one process. Several processes sharing one pipe for stderr (one ``gtm up``
child per log file does not) could see a batch larger than the pipe's atomic write
size (``PIPE_BUF``) interleaved with another process's writes when the pipe is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from json.encoder import encode_basestring as _json_string
from typing import IO, Protocol, TypeVar


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
    if type(value) is str:  # the usual value, and its own str
        return value if value and _NEEDS_QUOTES.search(value) is None else json.dumps(value)
    cls = type(value)
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
        #: Each key's ``key=`` ("" when not a structured field, :func:`_is_extra`) by
        #: the tuple of a line's keys, and a str value's text (:func:`_text_value`),
        #: remembered (:func:`_remember`): a regex scan per value is most of a line's
        #: cost, and most values repeat line after line.
        self._prefixes: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._texts: dict[object, str] = {}  # str keys only

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
        ``message`` and the structured fields ``extra``, made now (:class:`LineWriter`).

        :meth:`formatMessage` and :func:`_text_value` are the reference; this is the same
        text (:meth:`info_fields`), pinned against the reference by a property test."""
        return self.info_fields(name, message, tuple(extra), tuple(extra.values()))

    def info_fields(
        self,
        name: str,
        message: str,
        keys: tuple[str, ...],
        values: Sequence[object],
        created: float | None = None,
    ) -> str:
        """:meth:`info_line` of the fields ``zip(keys, values)`` (distinct keys): what a
        caller writing the same keys line after line (the access line) calls, so each
        key's ``key=`` (or that it is no field) is looked up once per line, by the tuple.
        ``created``: the line's time (``time.time()``; None: now).

        The fields are written by :func:`_fields_text` (in C when built): the access
        line's usual values (str, int, float, None) told apart by exact type in one
        loop, str values written as remembered."""
        if created is None:
            created = time.time()
        msecs = int((created - int(created)) * 1000) + 0.0  # as logging.LogRecord
        when = self._asctime(created, msecs)
        head = f"{when} level=INFO logger={name} {message}"
        prefixes = self._prefixes.get(keys)
        if prefixes is None:
            prefixes = _remember(
                self._prefixes, keys, tuple(f"{key}=" if _is_extra(key) else "" for key in keys)
            )
        written = _fields_text(prefixes, values, self._texts, _REMEMBERED, _text_value)
        if not written:
            return head
        return f"{head if message else head[:-1]} {written}"


#: How many keys or values a formatter remembers how to write before it starts over:
#: the access line's values mostly repeat (a model, a zone, a path), a request id never.
#: So the values of fields named ``*_id`` (request, decision, trace ids) are written
#: without being remembered: each is new, and remembering them would push out, every
#: few thousand lines, the values that do repeat.
_REMEMBERED = 4096

_K = TypeVar("_K")
_V = TypeVar("_V")


def _remember(memo: dict[_K, _V], key: _K, value: _V, limit: int = _REMEMBERED) -> _V:
    """``memo[key] = value``, emptying ``memo`` first when it holds ``limit``."""
    if len(memo) >= limit:
        memo.clear()
    memo[key] = value
    return value


def _fields_text_python(
    prefixes: Sequence[str],
    values: Sequence[object],
    texts: dict[object, str],
    limit: int,
    text_value: Callable[[object], str],
) -> str:
    """A text line's fields, ``prefix + text`` joined by spaces: the Python form of
    ``gtm/_logline.c``'s ``fields_text`` (that file says which fields are written and
    how; tests/unit/gtm/test_logs.py pins the two together and to the reference,
    :meth:`TextFormatter.formatMessage`)."""
    if len(prefixes) != len(values):
        raise ValueError(f"{len(prefixes)} prefixes for {len(values)} values")
    parts: list[str] = []
    add = parts.append
    for prefix, value in zip(prefixes, values, strict=True):
        if value is None or not prefix:
            continue
        if type(value) is str:
            if value:
                text = texts.get(value)
                if text is None:
                    text = text_value(value)
                    if prefix[-4:] != "_id=":  # ids never repeat (_REMEMBERED)
                        _remember(texts, value, text, limit)
                add(prefix + text)
        elif type(value) is int or type(value) is float:
            add(f"{prefix}{value}")  # format(x, "") is str(x) for both
        elif value != "":
            add(prefix + text_value(value))
    return " ".join(parts)


_fields_text: Callable[
    [Sequence[str], Sequence[object], dict[object, str], int, Callable[[object], str]], str
]
try:  # the compiled form (setup.py builds it when it can)
    from gtm._logline import fields_text as _fields_text
except ImportError:  # pragma: no cover - an install without a C compiler
    _fields_text = _fields_text_python

#: Whether a text line's fields are written by the compiled kernel (``gtm --version``
#: says so too, and ``gtm up`` warns at start when it is not: :mod:`gtm.native`).
COMPILED = _fields_text is not _fields_text_python


def _is_extra(key: str) -> bool:
    """Whether :func:`fields` would read ``key`` back from a record's ``extra=``."""
    return key not in _STANDARD and key[:1] != "_"


def _with_extra(line: str, message: str, extra: str) -> str:
    if not extra:
        return line
    return f"{line} {extra}" if message else f"{line}{extra}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        #: What ``json.dumps(…, ensure_ascii=False, separators=(",", ":"))`` builds per
        #: call, built once: the same encoder, so the same text.
        self._encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
        #: The last second stamped and its ``YYYY-MM-DDTHH:MM:SS`` (as TextFormatter's).
        self._second: tuple[int, str] = (-1, "")
        #: Each key's ``,"key":`` ("" when not written, :func:`_json_key`) by the tuple of
        #: a line's keys, and a str value's JSON string, remembered (:func:`_remember`).
        self._prefixes: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._texts: dict[object, str] = {}  # str keys only

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
        """As :meth:`TextFormatter.info_line`: :meth:`format`'s text for an INFO record
        (:meth:`info_fields`), pinned against :meth:`format` by a property test."""
        return self.info_fields(name, message, tuple(extra), tuple(extra.values()))

    def info_fields(
        self,
        name: str,
        message: str,
        keys: tuple[str, ...],
        values: Sequence[object],
        created: float | None = None,
    ) -> str:
        """As :meth:`TextFormatter.info_fields`, written as the encoder would write its
        document: the time stamped from a per-second cache (:meth:`_stamp`), each key's
        ``,"key":`` remembered by the keys' tuple and each str value's JSON string
        remembered, an int or float as the encoder writes it, anything else through the
        encoder."""
        parts = [
            f'{{"ts":"{self._stamp(time.time() if created is None else created)}",'
            f'"level":"INFO","logger":'
            f'{_json_string(name)},"msg":{_json_string(message)}'
        ]
        prefixes = self._prefixes.get(keys)
        if prefixes is None:
            prefixes = _remember(self._prefixes, keys, tuple(map(_json_key, keys)))
        texts, add = self._texts, parts.append
        for prefix, value in zip(prefixes, values, strict=True):
            if not prefix:
                continue  # not a field, or one of the head's keys (they win, as in format)
            cls = type(value)
            if cls is str:
                text = texts.get(value)
                if text is None:
                    text = _json_string(str(value))  # (exactly a str: itself)
                    if prefix[-5:] != '_id":':  # ids never repeat (_REMEMBERED)
                        _remember(texts, value, text)
                add(prefix + text)
            elif value is None:
                add(prefix + "null")
            elif cls is int or (type(value) is float and math.isfinite(value)):
                add(f"{prefix}{value!r}")  # the encoder's int and float repr
            else:
                add(prefix + self._encoder.encode(_scalar(value)))
        add("}")
        return "".join(parts)

    def _stamp(self, created: float) -> str:
        """``_json_head``'s ``ts`` for ``created``: datetime rounds the fraction to
        microseconds half to even, carrying into the second, and isoformat truncates
        that to milliseconds; the date and time of the second are cached."""
        fraction, whole = math.modf(created)
        micros = round(fraction * 1e6)
        second = int(whole)
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        cached, text = self._second
        if cached != second:
            text = datetime.fromtimestamp(second, UTC).isoformat()[:19]
            self._second = (second, text)
        return f"{text}.{micros // 1000:03d}Z"


#: The keys every JSON line starts with; a structured field of the same name is left out.
_JSON_HEAD = frozenset({"ts", "level", "logger", "msg"})


def _json_key(key: str) -> str:
    """``,"key":`` for a structured field not named as one of the head's keys, else ""."""
    return f",{_json_string(key)}:" if _is_extra(key) and key not in _JSON_HEAD else ""


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


#: The batch of lines :class:`LineWriter` holds is written at once when it reaches this
#: many characters, before its interval ends (nginx's default ``access_log``
#: buffer is as large).
BATCH_LIMIT = 64 * 1024

#: What a line not yet formatted counts towards :data:`BATCH_LIMIT` (an access line is
#: 300-500 characters).
LATER_CHARS = 512

#: Lines a batch formats per event-loop iteration. A request that arrives while its
#: batch is formatted waits for one slice, not for the whole batch (up to ~128 lines at
#: the limit, in the tail of every request that arrived then); the slice's cost in the
#: zone agent is in CHANGELOG.md.
SLICE_LINES = 8

#: Lines waiting for their slices beyond which the rest is formatted at once: the
#: loop's iterations no longer keep up with the lines made, and memory is bounded
#: before latency.
MAX_BEHIND = 4096

#: The longest a batched line waits for its write, s (0: the end of its loop
#: iteration). Short enough that ``tail -f`` shows a request as it ends, long enough
#: that one ``write(2)`` carries the lines of hundreds of requests at a few thousand a
#: second (the access line's was one per request at one request per iteration).
FLUSH_INTERVAL_S = 0.1


#: What a handler without a lock is held with (``Handler.acquire`` does nothing then).
_UNLOCKED = contextlib.nullcontext()


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure` installs (told apart from a host's own), and the
    batch of lines :class:`LineWriter` gave it that are not written yet.

    The batch is our own list, written with one ``stream.write`` when flushed, rather
    than lines written one by one to the stream's binary buffer: ``sys.stderr`` is
    line-buffered, so each line written to it would be its own ``write(2)``; its binary
    buffer would skip the text layer's encoding and error handling and reorder our
    lines with text written to the stream past this handler; and a host's stream (a
    test's ``StringIO``) need not have one. Every path out of the handler writes the
    batch first: :meth:`emit` (so any other line stays after the batch's),
    :meth:`flush` (``logging.shutdown`` at exit, ``setStream``) and :meth:`close`.
    Every method that touches the batch holds the handler's lock.
    """

    def __init__(self, stream: IO[str], flush_interval: float = FLUSH_INTERVAL_S) -> None:
        super().__init__(stream)
        #: The lines to format and write.
        self._batch: list[_Later] = []
        self._batch_chars = 0
        #: The loop that will write the batch (None: no write scheduled).
        self._flush_loop: asyncio.AbstractEventLoop | None = None
        #: Lines taken from batches and formatted a slice per iteration (those before
        #: :attr:`_next` are done), their texts, and the loop whose iteration formats
        #: the next slice (None: none scheduled).
        self._taken: list[_Later] = []
        self._next = 0
        self._ready: list[str] = []
        self._ready_chars = 0
        self._slicing: asyncio.AbstractEventLoop | None = None
        #: How long a line may wait for its write, s (0: the end of its iteration).
        self.flush_interval = flush_interval

    def add(self, line: _Later) -> None:
        """Hold ``line`` (formatted when its batch is written) for one write at most
        :attr:`flush_interval` later on the running loop (or on the loop whose write is
        already scheduled); write at once without either, or when the batch reaches
        :data:`BATCH_LIMIT` (a line counted as :data:`LATER_CHARS`). The caller holds
        the lock."""
        self._batch.append(line)
        self._batch_chars += LATER_CHARS
        if self._batch_chars >= BATCH_LIMIT:
            # Formatted from the next iteration on (not in this request's way), or at
            # once without a loop.
            self._take_batch(later=True)
            return
        pending = self._flush_loop
        if pending is not None and pending.is_running():
            # Its timer writes the batch (under the lock, whichever thread added the
            # line): no need to ask for the running loop, which on Python 3.11 costs a
            # getpid(2) per line.
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: nothing would end an iteration
            self._write_batch(flush=True)
            return
        if self._flush_loop is not loop:  # none scheduled, or on a loop that has stopped
            # (A batch written before the timer, at the limit or by another line, leaves
            # it scheduled: the next lines wait for it, still less than the interval.)
            if self.flush_interval > 0:
                loop.call_later(self.flush_interval, self._flush_batch)
            else:
                loop.call_soon(self._flush_batch)
            self._flush_loop = loop

    def _flush_batch(self) -> None:
        """The interval is over (or the iteration ended): format the batch, a slice per
        iteration, and write it."""
        with self.lock or _UNLOCKED:  # held as acquire() would, without its call
            self._flush_loop = None
            self._take_batch()

    def _take_batch(self, *, later: bool = False) -> None:
        """Hand the batch to the slices (after the lines taken before it); the first
        slice runs now (``later``: in the next iteration), unless one is scheduled on a
        running loop. Without a running loop, everything is written at once. The caller
        holds the lock."""
        self._taken += self._batch
        self._batch, self._batch_chars = [], 0
        slicing = self._slicing
        if slicing is not None and slicing.is_running():
            # Its next slice goes on with these lines (the running loop's, or another
            # thread's loop, which takes the lock for it).
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: nothing would run a slice
            self._write_batch(flush=True)
            return
        if later:
            loop.call_soon(self._next_slice)
            self._slicing = loop
        else:
            self._slice()

    def _next_slice(self) -> None:
        with self.lock or _UNLOCKED:
            self._slice()

    def _slice(self) -> None:
        """Format the next :data:`SLICE_LINES` lines taken (all of them when more than
        :data:`MAX_BEHIND` wait); write the texts once every line taken is, or once
        they reach :data:`BATCH_LIMIT`; else leave the rest to the next iteration. The
        caller holds the lock and runs on a loop."""
        taken, start = self._taken, self._next
        behind = len(taken) - start
        end = len(taken) if behind > MAX_BEHIND else start + SLICE_LINES
        texts = self._texts(taken[start:end])
        self._ready += texts
        self._ready_chars += sum(map(len, texts))
        if end >= len(taken):
            self._taken, self._next, self._slicing = [], 0, None
            self._write_ready(flush=True)
            return
        self._next = end
        if self._ready_chars >= BATCH_LIMIT:
            self._write_ready(flush=True)
        loop = asyncio.get_running_loop()
        loop.call_soon(self._next_slice)
        self._slicing = loop

    def _write_batch(self, *, flush: bool) -> None:
        """Write every line held (the texts formatted, the lines taken and not yet
        formatted, the batch) in one ``stream.write`` (and flush the stream); an error
        goes to :meth:`handleError`, as :meth:`emit`'s do, and the lines are dropped."""
        rest = self._taken[self._next :]
        rest += self._batch
        self._taken, self._next, self._batch, self._batch_chars = [], 0, [], 0
        if rest:
            self._ready += self._texts(rest)
        self._write_ready(flush=flush)

    def _write_ready(self, *, flush: bool) -> None:
        ready = self._ready
        if not ready:
            return
        self._ready, self._ready_chars = [], 0
        try:
            self.stream.write("".join(ready))
            if flush:
                self.stream.flush()
        except Exception:  # as StreamHandler.emit: logging never raises into the caller
            record = logging.LogRecord(
                __name__, logging.INFO, __file__, 0, "%d buffered lines", (len(ready),), None
            )
            self.handleError(record)

    def _texts(self, batch: list[_Later]) -> list[str]:
        """The batch's lines, formatted now (their terminators included); one that
        cannot be goes to :meth:`handleError` (as a record's would) and is left out."""
        texts: list[str] = []
        terminator = self.terminator
        for line in batch:
            formatter, name, created, source, keys, values = line
            message = "a line that could not be formatted"
            try:
                if isinstance(source, str):
                    message = source
                else:  # a LineSource: its message and values read now
                    message = source.message()
                    values = source.values()
                text = formatter.info_fields(name, message, keys, values, created)
            except Exception:  # as StreamHandler.emit: logging never raises into the caller
                # Without extra=: makeRecord raises on a field named as a record's attribute.
                record = logging.LogRecord(name, logging.INFO, __file__, 0, message, (), None)
                self.handleError(record)
                continue
            texts.append(text + terminator)
        return texts

    def emit(self, record: logging.LogRecord) -> None:
        self.acquire()  # handle() holds it already; a direct call may not
        try:
            self._write_batch(flush=False)  # the record's own write flushes both
            super().emit(record)
        finally:
            self.release()

    def flush(self) -> None:
        self.acquire()
        try:
            self._write_batch(flush=False)
            super().flush()
        finally:
            self.release()

    def close(self) -> None:
        self.acquire()
        try:
            self._write_batch(flush=True)
        finally:
            self.release()
        super().close()


class LineSource(Protocol):
    """A line whose message and field values are read when its batch is written
    (:meth:`LineWriter.write_line`): an immutable record, such as an access line's."""

    def message(self) -> str: ...

    def values(self) -> Sequence[object]: ...


#: A line held unformatted in a batch: the formatter, the logger's name, the line's
#: time (``time.time()``), its message (or a :class:`LineSource`), its keys and values
#: (read from the source when it is one).
_Later = tuple[
    "TextFormatter | JsonFormatter",
    str,
    float,
    "str | LineSource",
    tuple[str, ...],
    Sequence[object],
]


class LineWriter:
    """Writes one logger's INFO lines itself, as the handler :func:`configure` installs
    would write them, without a ``LogRecord`` and the walk through ``logging``'s
    machinery (the per-request access line, :mod:`gtm.access`).

    It can only while that handler is the one every line of the logger reaches: no
    filter and no other handler on the way up to the root, and the root's handler ours,
    with one of our formatters (:meth:`handler`, checked on each line, so a handler a
    test or a host adds later is honoured). Otherwise :meth:`write` answers False and
    the caller logs the line the usual way; the logger must be enabled for INFO.

    A line written here goes into the handler's batch, written to the stream at most
    :data:`FLUSH_INTERVAL_S` later (see the module docstring).
    """

    def __init__(self, log: logging.Logger) -> None:
        self._log = log

    def handler(self) -> _Handler | None:
        """The handler that writes every line, when this writer may write them."""
        log: logging.Logger | None = self._log
        root = logging.root  # getLogger()'s answer, without its call
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
        when this writer may not (:meth:`handler`): nothing was written. Never raises:
        an error formatting or writing goes to the handler's ``handleError``."""
        return self.write_fields(message, tuple(extra), tuple(extra.values()))

    def write_fields(self, message: str, keys: tuple[str, ...], values: Sequence[object]) -> bool:
        """:meth:`write` of the fields ``zip(keys, values)`` (distinct keys; a caller
        writing the same keys every line passes the same tuple). The values are read
        when the batch is written: pass ones that do not change (a tuple)."""
        return self._later(message, keys, values)

    def write_line(self, source: LineSource, keys: tuple[str, ...]) -> bool:
        """:meth:`write_fields` of ``source``'s message and values, read when the batch is
        written (then, not per request: most of a line's cost is its formatting, and a
        batch formats its lines one after another, off the request's way)."""
        return self._later(source, keys, ())

    def _later(
        self, source: str | LineSource, keys: tuple[str, ...], values: Sequence[object]
    ) -> bool:
        handler = self.handler()
        if handler is None:
            return False
        # handler() checked the formatter's type (a cast would be a call per line).
        formatter: TextFormatter | JsonFormatter = handler.formatter  # type: ignore[assignment]
        with handler.lock or _UNLOCKED:  # held as Handler.acquire would, without its call
            # The line's time is now; its text is made when the batch is written.
            handler.add((formatter, self._log.name, time.time(), source, keys, values))
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
