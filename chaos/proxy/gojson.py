"""JSON the way Toxiproxy's Go server reads and writes it.

Clients were written against Go's ``encoding/json``, so the edges matter:

- ``json.Decoder.Decode`` reads the *first* JSON value and ignores what follows; an empty
  body is the error ``EOF``.
- Object keys match struct fields case-insensitively, the last occurrence wins, and
  ``null`` leaves a field unchanged. :func:`decode_body` lower-cases keys (keeping the
  last) so that callers can drop ``None`` values and read fields by their lower-case name.
- ``NaN``/``Infinity`` are not JSON (Python's decoder would accept them).
- ``json.Marshal`` escapes ``<``, ``>``, ``&``, U+2028 and U+2029 inside strings, writes no
  spaces, and prints float32 values with the fewest digits that round-trip
  (``0.2``, ``1``), which :func:`float32_value` reproduces.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from chaos.proxy.errors import FaultProxyError

#: Largest finite float32 (IEEE 754 binary32), the range of Toxiproxy's ``toxicity``.
FLOAT32_MAX = 3.4028234663852886e38
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_DECODER = json.JSONDecoder(
    object_pairs_hook=lambda pairs: {key.lower(): value for key, value in pairs},
    parse_constant=lambda name: _reject_constant(name),
)
_WHITESPACE = " \t\n\r"
_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028"}


class GoJsonError(FaultProxyError, ValueError):
    """The body is not a JSON value (the message follows Go where it is cheap to)."""


def _reject_constant(name: str) -> object:
    raise GoJsonError(f"invalid character {name[0]!r} looking for beginning of value")


def decode_body(raw: bytes) -> Any:
    """The first JSON value in ``raw``, with object keys lower-cased (last one wins)."""
    text = raw.decode("utf-8", errors="replace")
    start = len(text) - len(text.lstrip(_WHITESPACE))
    if start == len(text):
        raise GoJsonError("EOF")
    try:
        value, _end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text):
            raise GoJsonError("unexpected EOF") from None
        raise GoJsonError(f"invalid JSON at offset {exc.pos}: {exc.msg}") from None
    except (RecursionError, ValueError) as exc:  # nesting too deep, int too long
        raise GoJsonError(str(exc) or type(exc).__name__) from None
    return value


def json_kind(value: object) -> str:
    """The JSON type name Go uses in ``cannot unmarshal <kind> into …`` messages."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def dumps(value: object) -> str:
    """Serialise like Go's ``json.Marshal`` (compact, HTML-safe escapes, no NaN)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if any(ch in text for ch in "<>&\u2028\u2029"):
        for raw, escaped in _GO_ESCAPES.items():
            text = text.replace(raw, escaped)
        text = text.replace("\u2029", "\\u2029")
    return text


def to_float32(value: float) -> float:
    """Round ``value`` to the nearest float32, as Go does when decoding into one."""
    rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return rounded


def float32_value(value: float) -> int | float:
    """The JSON number Go prints for float32 ``value``: shortest round-trip digits."""
    f32 = to_float32(value)
    text = repr(f32)
    for digits in range(1, 10):
        candidate = f"{f32:.{digits}g}"
        if to_float32(float(candidate)) == f32:
            text = candidate
            break
    number = float(text)
    # Go prints integral floats below 1e21 without a fraction ("1", not "1.0").
    if number.is_integer() and abs(number) < 1e21:
        return int(number)
    return number
