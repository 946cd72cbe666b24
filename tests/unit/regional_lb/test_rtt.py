from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gtm.models import GeoPoint
from regional_lb.rtt import UNKNOWN_PEER_RTT_MS, RegionRtt, load_example_rtts

SHARED = Path(__file__).resolve().parents[3] / "data" / "latency"
AZURE = {
    "us-east": "eastus",
    "us-west": "westus2",
    "eu-west": "northeurope",
    "eu-central": "germanywestcentral",
    "ap-northeast": "japaneast",
    "ap-southeast": "southeastasia",
}


def test_the_committed_table_has_every_directed_pair_of_the_example_regions() -> None:
    table = load_example_rtts()
    assert len(table) == 30
    assert table[("eu-west", "eu-central")] == 26.0
    assert table[("us-east", "ap-southeast")] == 222.0


def test_the_committed_table_matches_the_shared_azure_data() -> None:
    with (SHARED / "azure_inter_region_rtt.csv").open() as source:
        rows = {
            (r["src_region"], r["dst_region"]): float(r["rtt_ms"]) for r in csv.DictReader(source)
        }
    for (src, dst), rtt in load_example_rtts().items():
        assert rows[(AZURE[src], AZURE[dst])] == rtt


def test_between_prefers_measurements_then_distance() -> None:
    rtt = RegionRtt(
        {("a", "b"): 40.0},
        {"a": GeoPoint(lat=0, lon=0), "c": GeoPoint(lat=0, lon=1)},
    )
    assert rtt.between("a", "a") == 0.0
    assert rtt.between("a", "b") == 40.0
    assert rtt.between("b", "a") == 40.0  # either direction
    assert rtt.between("a", "c") == pytest.approx(26 + 0.0143 * 111.2, rel=1e-3)
    assert rtt.between("a", "z") == UNKNOWN_PEER_RTT_MS
    assert rtt.with_locations({"z": GeoPoint(lat=0, lon=0)}).between("a", "z") == 26.0
