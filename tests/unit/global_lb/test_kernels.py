"""global_lb.kernels: compiled (CI installs with a compiler) and equal to its Python twin
and to the RTT formula it replaced (the fused TTFT + load kernel is tested beside its
formula: tests/unit/global_lb/plugins/test_ttft.py)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from global_lb import kernels
from global_lb.view import EARTH_RADIUS_KM, _unit
from gtm import native
from gtm.models import GeoPoint
from gtm.routing.cost import RTT_INTERCEPT_MS, RTT_MS_PER_KM, rtt_ms_from_distance
from gtm.testing.kernels import expected_state, python_twin

TWIN = python_twin("global_lb.kernels")
PER_RADIAN = RTT_MS_PER_KM * 2.0 * EARTH_RADIUS_KM

lats = st.floats(-90.0, 90.0)
lons = st.floats(-180.0, 180.0)
points = st.tuples(lats, lons)


def test_the_kernels_run_compiled() -> None:
    # The README's latency figures are the compiled kernels'; an install that silently
    # fell back to Python must fail CI, not pass slower (GTM_PURE_PYTHON=1 opts out).
    assert native.kernel("global_lb.kernels").state is expected_state()
    assert TWIN.__file__ is not None
    assert TWIN.__file__.endswith("kernels.py")


@given(client=points, places=st.lists(points, min_size=1, max_size=60), data=st.data())
def test_chord_rtts_are_the_distance_fit_of_the_haversine(
    client: tuple[float, float], places: list[tuple[float, float]], data: st.DataObject
) -> None:
    units = [_unit(lat, lon) for lat, lon in places]
    xs, ys, zs = (tuple(u[axis] for u in units) for axis in range(3))
    positions = tuple(sorted(data.draw(st.sets(st.integers(0, len(places) - 1), min_size=1))))
    here = _unit(*client)
    rows = []
    for module in (kernels, TWIN):
        row = [math.nan] * len(places)
        module.fill_chord_rtts(row, xs, ys, zs, here, positions, RTT_INTERCEPT_MS, PER_RADIAN)
        rows.append(row)
    compiled, python = rows
    assert compiled == [python[i] if i in positions else compiled[i] for i in range(len(places))]
    point = GeoPoint(lat=client[0], lon=client[1])
    for i in range(len(places)):
        if i not in positions:
            assert math.isnan(compiled[i])  # untouched
            continue
        place = GeoPoint(lat=places[i][0], lon=places[i][1])
        expected = rtt_ms_from_distance(point.distance_km(place))
        assert math.isclose(compiled[i], expected, rel_tol=1e-9, abs_tol=1e-6)
