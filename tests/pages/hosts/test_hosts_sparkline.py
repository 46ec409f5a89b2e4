"""A host's sparkline stops where Prometheus has no point (its collector was not scraped) instead of sloping across."""

from __future__ import annotations

import math

from pages.hosts.ui import sparkline

T0 = 1_800_000_000.0
STEP_S = 15.0


def _gaps(values: tuple[object, ...]) -> list[int]:
    return [i for i, v in enumerate(values) if v is None or (isinstance(v, float) and math.isnan(v))]


def test_a_scrape_gap_breaks_the_line_and_its_shading() -> None:
    # 5 min scraped, 3 min down (no points), 5 min again, on Prometheus's step grid.
    points = [(T0 + i * STEP_S, 40.0) for i in range(20)] + [(T0 + (32 + i) * STEP_S, 60.0) for i in range(20)]
    fig = sparkline(points, "#4C78A8", T0, T0 + 52 * STEP_S)
    area, line = fig.data
    assert _gaps(line.y) == [20] and len(line.y) == 41  # one break, every point kept
    shapes = [s for s in "|".join("x" if v is not None else "" for v in area.x).split("||") if s]
    assert len(shapes) == 2 and area.fill == "toself"  # shaded under each stretch, none across the gap
    assert area.fillcolor == "rgba(76,120,168,0.5)" and line.line.color == "#4C78A8"


def test_points_a_step_apart_make_one_unbroken_line() -> None:
    fig = sparkline([(T0 + i * STEP_S, float(i)) for i in range(60)], "#E45756", T0, T0 + 60 * STEP_S)
    assert _gaps(fig.data[1].y) == [] and len(fig.data[1].y) == 60
    assert len(sparkline([], "#E45756", T0, T0 + 60).data[1].y) == 0  # a host with no points yet draws nothing
