"""Budget charts drawn on the server: each budget's cumulative use over time as an SVG step line.

The chart is data for a template (numbers and path commands only, no text from receipts), so
it needs no script and passes a strict Content-Security-Policy. Long histories are thinned to
at most `MAX_POINTS` steps, always keeping the last one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

WIDTH, HEIGHT = 320.0, 90.0
MAX_POINTS = 240


@dataclass(frozen=True)
class Chart:
    dimension: str
    path: str  # SVG path data in a WIDTH × HEIGHT box, y pointing down
    used: float
    limit: float | None
    limit_y: float | None  # where the limit line is drawn, if there is a limit
    top: float  # the value at the top of the box
    exhausted: bool
    first_at: datetime
    last_at: datetime
    steps: int  # how many times this budget moved


def thin(
    points: list[tuple[datetime, int, float]], most: int = MAX_POINTS
) -> list[tuple[datetime, int, float]]:
    """At most `most` points, evenly spread, the first and last always kept."""
    if len(points) <= most:
        return points
    stride = (len(points) - 1) / (most - 1)
    return [points[round(i * stride)] for i in range(most)]


def _x(when: datetime, start: datetime, span: float) -> float:
    return round((when - start).total_seconds() / span * WIDTH, 2) if span else 0.0


def budget_chart(
    dimension: str, points: list[tuple[datetime, int, float]], limit: float | None, now: datetime
) -> Chart | None:
    """A step chart from `(at, seq, used)` points, up to `now`; None without points."""
    if not points:
        return None
    used = points[-1][2]
    top = max(limit or 0.0, used, 1e-9) * 1.05
    start = points[0][0]
    end = max(now, points[-1][0])
    span = (end - start).total_seconds()

    def y(value: float) -> float:
        return round(HEIGHT - value / top * HEIGHT, 2)

    shown = thin(points)
    commands = [f"M0 {y(shown[0][2])}"]
    for at, _, value in shown[1:]:
        commands.append(f"H{_x(at, start, span)} V{y(value)}")
    commands.append(f"H{WIDTH}")
    return Chart(
        dimension=dimension,
        path=" ".join(commands),
        used=used,
        limit=limit,
        limit_y=None if limit is None else y(limit),
        top=top,
        exhausted=limit is not None and used >= limit,
        first_at=points[0][0],
        last_at=points[-1][0],
        steps=len(points) - 1,
    )
