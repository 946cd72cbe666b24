"""Values in the store are versioned JSON records; this module encodes and decodes them.

Decoding failures become :class:`~gtm.errors.CodecError` naming the key, so one bad
value is reported and skipped by snapshot builders instead of poisoning the whole view.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import ValidationError

from gtm.errors import CodecError
from gtm.models import StoredRecord

R = TypeVar("R", bound=StoredRecord)

#: Values larger than this are refused on decode (etcd's default request limit is 1.5 MiB).
MAX_VALUE_BYTES = 1_572_864


def encode(record: StoredRecord) -> bytes:
    return record.to_json()


def decode(key: str, value: bytes, record_type: type[R]) -> R:
    if len(value) > MAX_VALUE_BYTES:
        raise CodecError(key, f"value is {len(value)} bytes, limit {MAX_VALUE_BYTES}")
    try:
        return record_type.model_validate_json(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise CodecError(key, f"{record_type.__name__}.{where}: {first['msg']}") from exc
