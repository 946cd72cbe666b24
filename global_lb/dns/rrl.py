"""Response rate limiting per client prefix, with slip (after BIND 9's RRL).

An authoritative server is a reflection amplifier: a spoofed query of ~40 bytes buys
a response several times larger sent to the victim. RRL caps responses per client
prefix (/24 for IPv4, /56 for IPv6, BIND's defaults ``ipv4-prefix-length 24`` /
``ipv6-prefix-length 56``) with a token bucket; responses over the limit are dropped,
except every ``slip``-th one, which is sent truncated (TC=1, no records) — too small to
amplify, and a real client behind a busy resolver retries over TCP, which RRL does not
limit (TCP cannot be spoofed). BIND's default slip is 2.

The default rate is generous (1,000 responses/s per prefix) because a big resolver's
/24 legitimately sends many queries; operators tune it to their traffic. 0 disables.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import Enum

from pydantic import Field

from gtm.clock import Clock
from gtm.models import Frozen

#: Prefixes remembered; past this the table is cleared (an attack across many prefixes
#: must not grow memory without bound; clearing only forgives, it never blocks).
MAX_TRACKED = 200_000


class RrlConfig(Frozen):
    rate: float = Field(default=1000.0, ge=0.0, le=1e9)
    burst: float | None = Field(default=None, gt=0.0, le=1e9)
    slip: int = Field(default=2, ge=0, le=100)
    ipv4_prefix: int = Field(default=24, ge=0, le=32)
    ipv6_prefix: int = Field(default=56, ge=0, le=128)


class RrlAction(Enum):
    ANSWER = "answer"
    DROP = "drop"
    SLIP = "slip"


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    dropped: int = 0


class ResponseRateLimiter:
    """``check(address_bytes)`` per UDP response: answer, drop, or slip."""

    def __init__(self, config: RrlConfig, clock: Clock) -> None:
        self._rate = config.rate
        self._burst = config.burst if config.burst is not None else max(1.0, config.rate)
        self._slip = config.slip
        self._v4 = config.ipv4_prefix
        self._v6 = config.ipv6_prefix
        self._clock = clock
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        #: A plain attribute, not a property: read on every UDP query.
        self.enabled = self._rate > 0.0

    def prefix(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[int, int]:
        if address.version == 4:
            return 4, int(address) >> (32 - self._v4) if self._v4 else 0
        return 6, int(address) >> (128 - self._v6) if self._v6 else 0

    def check(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> RrlAction:
        if self._rate <= 0.0:
            return RrlAction.ANSWER
        key = self.prefix(address)
        now = self._clock.monotonic()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_TRACKED:
                self._buckets.clear()
            bucket = self._buckets[key] = _Bucket(self._burst, now)
        else:
            bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.updated) * self._rate)
            bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return RrlAction.ANSWER
        bucket.dropped += 1
        if self._slip and bucket.dropped % self._slip == 0:
            return RrlAction.SLIP
        return RrlAction.DROP
