from __future__ import annotations

import json
import struct
from importlib import resources
from pathlib import Path

import pytest

from gtmctl.up.worldmap import main, project, read_polygon_rings, simplify, svg_path


def test_projection_is_equirectangular_in_degrees() -> None:
    assert project(-180.0, 90.0) == (0.0, 0.0)
    assert project(0.0, 0.0) == (180.0, 90.0)
    assert project(-6.2603, 53.3498) == pytest.approx((173.7397, 36.6502))


def test_simplify_drops_points_within_tolerance_keeps_corners() -> None:
    line = [(0.0, 0.0), (1.0, 0.01), (2.0, 0.0), (3.0, 5.0), (4.0, 0.0)]
    assert simplify(line, 0.1) == [(0.0, 0.0), (2.0, 0.0), (3.0, 5.0), (4.0, 0.0)]
    assert simplify(line, 10.0) == [(0.0, 0.0), (4.0, 0.0)]
    assert simplify(line[:2], 1.0) == line[:2]


def _shapefile(rings: list[list[tuple[float, float]]]) -> bytes:
    """A one-record polygon shapefile (ESRI 1998 layout), as a test fixture."""
    points = [p for ring in rings for p in ring]
    parts, start = [], 0
    for ring in rings:
        parts.append(start)
        start += len(ring)
    body = struct.pack("<i4d", 5, 0, 0, 0, 0) + struct.pack("<ii", len(rings), len(points))
    body += struct.pack(f"<{len(parts)}i", *parts)
    body += struct.pack(f"<{2 * len(points)}d", *[c for p in points for c in p])
    record = struct.pack(">ii", 1, len(body) // 2) + body
    header = struct.pack(">i", 9994) + bytes(20) + struct.pack(">i", (100 + len(record)) // 2)
    header += struct.pack("<ii", 1000, 5) + bytes(64)
    return header + record


SQUARE = [(0.0, 0.0), (10.0, 0.0), (10.0, 10.0), (0.0, 10.0), (0.0, 0.0)]
SPECK = [(50.0, 50.0), (50.1, 50.0), (50.0, 50.1), (50.0, 50.0)]


def test_reads_every_ring_of_a_shapefile() -> None:
    rings = read_polygon_rings(_shapefile([SQUARE, SPECK]))
    assert rings == [SQUARE, SPECK]
    with pytest.raises(ValueError, match="not an ESRI shapefile"):
        read_polygon_rings(b"nope" * 30)


def test_svg_path_drops_specks(tmp_path: Path) -> None:
    assert svg_path([SQUARE, SPECK]) == "M180.0 90.0L190.0 90.0L190.0 80.0L180.0 80.0L180.0 90.0Z"
    shp, out = tmp_path / "w.shp", tmp_path / "w.json"
    shp.write_bytes(_shapefile([SQUARE]))
    assert main([str(shp), str(out)]) == 0
    assert json.loads(out.read_text())["path"].startswith("M180.0 90.0")
    assert main([]) == 2


def test_shipped_map_is_a_whole_world() -> None:
    world = json.loads((resources.files("gtmctl.up") / "static" / "world.json").read_text())
    assert "public domain" in world["source"]
    assert world["path"].count("M") > 100  # continents, islands, countries
    assert len(world["path"]) < 100_000
