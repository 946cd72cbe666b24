"""Who sends the simulated requests, from where, and when.

* **Clients** are GeoNames' 5,000 most populous places (``geo/cities_top5000.csv`` of
  :mod:`gtm.data`, CC BY 4.0), drawn by population × a diurnal factor of the *local*
  hour (time zone from the file), so demand follows the sun across regions (SkyWalker's premise).
* **Sessions**: every request of one conversation (same first Mooncake prefix block)
  comes from one client place and tenant, drawn deterministically from the session key
  and the seed — so shared prefixes arrive at the same region, as real users' do.
* **Tenants** come from the example policies (``policies/examples/tenants.yaml``): the
  EU-resident tenant's clients are in Europe, the US healthcare tenant's in the US.
* **ServeGen** (Alibaba, Apache-2.0): :func:`servegen_shape` reads the per-window
  aggregate rate of one category/model, to shape arrival rates over a day.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import hashlib
import io
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from gtm import data
from gtm.errors import ConfigError
from gtm.models import GeoPoint

CITIES_FILE = "geo/cities_top5000.csv"
SERVEGEN_FILE = "servegen/servegen_aggregate_rate.csv"

#: Relative demand by local hour (0–23): low at night, peaking in the afternoon. Shape
#: after the diurnal curves of the Azure LLM 2024 week trace (DynamoLLM, HPCA'25: ~3×
#: between trough and peak); an assumption where no per-hour figure is published.
DIURNAL = (
    0.35, 0.3, 0.28, 0.27, 0.28, 0.32, 0.42, 0.6, 0.8, 0.95, 1.0, 1.0,
    0.98, 0.97, 0.98, 1.0, 0.98, 0.92, 0.85, 0.78, 0.7, 0.6, 0.5, 0.42,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Place:
    city: str
    country: str
    continent: str
    point: GeoPoint
    population: int
    utc_offset_h: float


@dataclass(frozen=True, slots=True)
class TenantMix:
    """A tenant's share of sessions and the continents its clients are on (empty: any)."""

    tenant: str
    share: float
    continents: tuple[str, ...] = ()
    #: Countries restricted further (empty: any in the continents).
    countries: tuple[str, ...] = ()


#: The example policies' tenants (their residency rules decide where each may go).
DEFAULT_TENANTS = (
    TenantMix("demo-global", 0.7),
    TenantMix("demo-eu", 0.2, ("EU",)),
    TenantMix("acme-health", 0.1, ("NA",), ("US",)),
)


def read_places(path: Path) -> tuple[Place, ...]:
    """GeoNames rows with their UTC offsets (standard time on 2024-01-15); ``path`` may
    be stored compressed (:func:`gtm.data.read_text`)."""
    when = datetime(2024, 1, 15, 12, tzinfo=UTC)
    offsets: dict[str, float] = {}
    out: list[Place] = []
    try:
        for row in csv.DictReader(io.StringIO(data.read_text(path))):
            tz = row["timezone"]
            if tz not in offsets:
                delta = when.astimezone(ZoneInfo(tz)).utcoffset()
                offsets[tz] = 0.0 if delta is None else delta.total_seconds() / 3600.0
            out.append(
                Place(
                    row["city"],
                    row["country_iso"],
                    row["continent"],
                    GeoPoint(lat=float(row["lat"]), lon=float(row["lon"])),
                    int(row["population"]),
                    offsets[tz],
                )
            )
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read client places: {exc}") from None
    if not out:
        raise ConfigError(f"{path}: no places")
    return tuple(out)


def _unit(*parts: object) -> float:
    """A deterministic uniform draw in [0, 1) from ``parts``."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class Geography:
    """Samples (tenant, place) for a session at a simulated time."""

    def __init__(
        self,
        places: tuple[Place, ...],
        tenants: tuple[TenantMix, ...] = DEFAULT_TENANTS,
        *,
        seed: int = 0,
        start_utc_h: float = 14.0,
        bucket_s: float = 600.0,
    ) -> None:
        total = sum(t.share for t in tenants)
        if total <= 0:
            raise ConfigError("tenant shares must add up to more than 0")
        self._tenants = tenants
        self._tenant_cdf = list(_cumulative([t.share / total for t in tenants]))
        self._pools = {t.tenant: self._pool(places, t) for t in tenants}
        self._seed = seed
        self._start_h = start_utc_h
        self._bucket_s = bucket_s
        self._cdfs: dict[tuple[str, int], list[float]] = {}

    @staticmethod
    def _pool(places: tuple[Place, ...], tenant: TenantMix) -> tuple[Place, ...]:
        pool = tuple(
            p
            for p in places
            if (not tenant.continents or p.continent in tenant.continents)
            and (not tenant.countries or p.country in tenant.countries)
        )
        if not pool:
            raise ConfigError(f"tenant {tenant.tenant}: no client place matches")
        return pool

    def _cdf(self, tenant: str, bucket: int) -> list[float]:
        key = (tenant, bucket)
        found = self._cdfs.get(key)
        if found is None:
            utc_h = self._start_h + bucket * self._bucket_s / 3600.0
            weights = [
                p.population * DIURNAL[int(utc_h + p.utc_offset_h) % 24]
                for p in self._pools[tenant]
            ]
            total = sum(weights)
            found = self._cdfs[key] = list(_cumulative([w / total for w in weights]))
        return found

    def sample(self, session: int, at_s: float) -> tuple[str, Place]:
        tenant = self._tenants[_pick(self._tenant_cdf, _unit(self._seed, "t", session))]
        bucket = int(at_s // self._bucket_s)
        pool = self._pools[tenant.tenant]
        place = pool[_pick(self._cdf(tenant.tenant, bucket), _unit(self._seed, "p", session))]
        return tenant.tenant, place

    def demand_factor(self, at_s: float, places: tuple[Place, ...]) -> float:
        """World demand at ``at_s`` relative to its daily peak (population-weighted)."""
        utc_h = self._start_h + at_s / 3600.0
        return sum(p.population * DIURNAL[int(utc_h + p.utc_offset_h) % 24] for p in places) / sum(
            p.population for p in places
        )


def _cumulative(values: list[float]) -> list[float]:
    out, acc = [], 0.0
    for v in values:
        acc += v
        out.append(acc)
    return out


def _pick(cdf: list[float], u: float) -> int:
    return min(len(cdf) - 1, bisect.bisect_right(cdf, u * cdf[-1]))


def servegen_shape(path: Path, category: str = "language", model: str = "") -> tuple[float, ...]:
    """Relative arrival rate per 10-minute window (mean 1) of one ServeGen series
    (``servegen_aggregate_rate.csv``, optionally gzipped); ``model`` empty = the first
    model of ``category``."""
    opener = gzip.open if path.suffix == ".gz" else open
    rates: list[float] = []
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row["category"] != category:
                    continue
                if not model:
                    model = row["model"]
                if row["model"] == model:
                    rates.append(float(row["total_rate_rps"]))
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"{path}: not a ServeGen aggregate-rate file: {exc}") from None
    mean = sum(rates) / len(rates) if rates else 0.0
    if mean <= 0 or not math.isfinite(mean):
        raise ConfigError(f"{path}: no positive rates for {category}/{model or '*'}")
    return tuple(r / mean for r in rates)
