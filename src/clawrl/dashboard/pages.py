"""HTML of the dashboard: Jinja2 templates (autoescaped: conversations are user input) and the score chart.

The pages are plain server-rendered HTML with inline CSS and SVG: no scripts, nothing fetched
from elsewhere, so they work on a machine with no internet and through any proxy.
"""

from __future__ import annotations

import time
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from clawrl.dashboard.views import VERSION_METRICS

CHART_WIDTH, CHART_HEIGHT, CHART_MARGIN = 640, 200, 32
LIVE_SCORE_ROWS = 12  # versions listed under the chart, newest first (the chart has them all)


def _environment() -> Environment:
    environment = Environment(loader=PackageLoader("clawrl.dashboard", "templates"), autoescape=select_autoescape(["html"]))
    environment.filters["when"] = lambda timestamp: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))
    environment.filters["number"] = lambda value: "" if value is None else f"{value:.3g}"
    environment.filters["signed"] = lambda score: {1: "+1", -1: "-1"}.get(score, "0")
    return environment


_ENVIRONMENT = _environment()


def score_chart(live_score: list[dict[str, Any]]) -> dict[str, Any]:
    """Coordinates of the mean judge score (-1..+1) per policy version, for an inline SVG."""
    plot_width, plot_height = CHART_WIDTH - 2 * CHART_MARGIN, CHART_HEIGHT - 2 * CHART_MARGIN
    versions = [point["version"] for point in live_score]
    low, high = (min(versions), max(versions)) if versions else (0, 1)
    span = max(high - low, 1)

    def x(version: int) -> float:
        return CHART_MARGIN + plot_width * (version - low) / span

    def y(score: float) -> float:
        return CHART_MARGIN + plot_height * (1 - score) / 2

    points = [{**point, "x": round(x(point["version"]), 1), "y": round(y(point["mean_score"]), 1)} for point in live_score]
    return {
        "width": CHART_WIDTH, "height": CHART_HEIGHT, "points": points,
        "polyline": " ".join(f"{point['x']},{point['y']}" for point in points),
        "gridlines": [{"label": f"{score:+g}", "y": round(y(score), 1)} for score in (1, 0, -1)],
        "left": CHART_MARGIN, "right": CHART_WIDTH - CHART_MARGIN,
        "first": low, "last": high,
    }  # fmt: skip


def render_overview(data: dict[str, Any], refresh_s: float, title: str) -> str:
    return _ENVIRONMENT.get_template("overview.html").render(
        data=data, chart=score_chart(data["live_score"]), metric_columns=VERSION_METRICS, refresh_s=refresh_s, title=title,
        live_score_rows=LIVE_SCORE_ROWS,
    )


def render_session(data: dict[str, Any], title: str) -> str:
    return _ENVIRONMENT.get_template("session.html").render(session=data, title=title)


def render_not_found(message: str, title: str) -> str:
    return _ENVIRONMENT.get_template("not_found.html").render(message=message, title=title)
