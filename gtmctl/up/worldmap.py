"""The status page's world map: land outlines as one SVG path, equirectangular.

The machines that run gtm may be offline, so the map is data in the package
(``gtmctl/up/static/world.json``), not tiles from a server. It was generated once from
Natural Earth's 1:110m admin-0 countries (public domain, naturalearthdata.com, v4.1.0)
with this module::

    python -m gtmctl.up.worldmap ne_110m_admin_0_countries.shp gtmctl/up/static/world.json

Each polygon ring is projected equirectangularly (x = lon + 180, y = 90 - lat, in
degrees: the page's SVG ``viewBox`` is in degrees too, so a region's marker goes at its
lat/lon with the same arithmetic) and simplified with Douglas–Peucker at 0.3°, which
keeps coastlines recognisable at a few hundred pixels wide in ~40 KB.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Sequence
from pathlib import Path

Point = tuple[float, float]

#: Douglas–Peucker tolerance, degrees: about 33 km at the equator, under a pixel of a
#: 1,000-pixel-wide map (0.36° per pixel).
TOLERANCE_DEG = 0.3
#: Rings smaller than this (after simplification) are dropped: specks, not land.
MIN_RING_POINTS = 4

_SHP_POLYGON = 5  # ESRI Shapefile Technical Description (1998), shape type 5


def project(lon: float, lat: float) -> Point:
    """Equirectangular, in degrees: x right from the antimeridian, y down from the pole."""
    return (lon + 180.0, 90.0 - lat)


def _distance_to_segment(p: Point, a: Point, b: Point) -> float:
    (px, py), (ax, ay), (bx, by) = p, a, b
    dx, dy = bx - ax, by - ay
    if dx == 0 and dy == 0:
        return math.hypot(px - ax, py - ay)
    t = max(0.0, min(1.0, ((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy)))
    return math.hypot(px - (ax + t * dx), py - (ay + t * dy))


def simplify(points: Sequence[Point], tolerance: float) -> list[Point]:
    """Douglas–Peucker (1973), iterative: keep the points farther than ``tolerance``
    from the chord of their span."""
    if len(points) < 3:
        return list(points)
    keep = [False] * len(points)
    keep[0] = keep[-1] = True
    stack = [(0, len(points) - 1)]
    while stack:
        first, last = stack.pop()
        worst, index = 0.0, -1
        for i in range(first + 1, last):
            d = _distance_to_segment(points[i], points[first], points[last])
            if d > worst:
                worst, index = d, i
        if index >= 0 and worst > tolerance:
            keep[index] = True
            stack += [(first, index), (index, last)]
    return [p for p, kept in zip(points, keep, strict=True) if kept]


def read_polygon_rings(data: bytes) -> list[list[Point]]:
    """Every ring of every polygon record of a shapefile's ``.shp`` bytes (lon, lat)."""
    if len(data) < 100 or struct.unpack(">i", data[:4])[0] != 9994:
        raise ValueError("not an ESRI shapefile (.shp)")
    rings: list[list[Point]] = []
    offset = 100
    while offset + 8 <= len(data):
        _, words = struct.unpack(">ii", data[offset : offset + 8])
        body = data[offset + 8 : offset + 8 + 2 * words]
        offset += 8 + 2 * words
        if len(body) < 44 or struct.unpack("<i", body[:4])[0] != _SHP_POLYGON:
            continue
        num_parts, num_points = struct.unpack("<ii", body[36:44])
        parts = list(struct.unpack(f"<{num_parts}i", body[44 : 44 + 4 * num_parts]))
        start = 44 + 4 * num_parts
        coords = struct.unpack(f"<{2 * num_points}d", body[start : start + 16 * num_points])
        points = list(zip(coords[0::2], coords[1::2], strict=True))
        for begin, end in zip(parts, [*parts[1:], num_points], strict=True):
            rings.append(points[begin:end])
    return rings


def svg_path(rings: Sequence[Sequence[Point]], tolerance: float = TOLERANCE_DEG) -> str:
    """One SVG path (``M…L…Z`` per ring) of the projected, simplified rings."""
    parts = []
    for ring in rings:
        projected = simplify([project(lon, lat) for lon, lat in ring], tolerance)
        if len(projected) < MIN_RING_POINTS:
            continue
        head, *rest = projected
        parts.append(
            f"M{head[0]:.1f} {head[1]:.1f}" + "".join(f"L{x:.1f} {y:.1f}" for x, y in rest) + "Z"
        )
    return "".join(parts)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m gtmctl.up.worldmap COUNTRIES.shp OUT.json", file=sys.stderr)
        return 2
    rings = read_polygon_rings(Path(argv[0]).read_bytes())
    document = {
        "source": "Natural Earth 1:110m admin-0 countries v4.1.0 (public domain)",
        "projection": "equirectangular, degrees: x = lon + 180, y = 90 - lat",
        "tolerance_deg": TOLERANCE_DEG,
        "path": svg_path(rings),
    }
    Path(argv[1]).write_text(json.dumps(document) + "\n", "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
