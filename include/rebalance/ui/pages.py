"""The Rebalance view's HTML: Jinja2 templates (``templates/``, autoescaped) over the dicts
of :mod:`rebalance.ui.views`, and the geometry of its SVG charts.

The Airflow plugin (``plugins/rebalance_view.py``) serves these pages; nothing here reads
a table. Every value from the data is escaped by the templates; only the page's own
markup is written unescaped.

>>> html = render_index(loads, realised, history, versions, health)   # doctest: +SKIP
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

PREFIX = "/rebalance"
DAG_ID = "rebalance"
ROLLBACK_DAG_ID = "rebalance_rollback"
#: Moved keys listed on a plan's page (the rest are in its JSON).
MOVED_ROWS_SHOWN = 500
COLORS = ["#1971c2", "#e8590c", "#2f9e44", "#c2255c", "#5f3dc4", "#0c8599", "#f08c00", "#495057"]


def _f(value: Any) -> str:
    return "–" if value is None else f"{float(value):.3f}"


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * float(value):.2f} %"


def _n(value: Any) -> str:
    return "–" if value is None else f"{float(value):,.0f}"


def _theta(value: Any) -> str:
    return "–" if value is None else f"{float(value):g}"


def _over(realised: Any, theta: Any) -> bool | None:
    """Whether a realised imbalance is above ``1 + theta`` (None: one of them unknown)."""
    if realised is None or theta is None:
        return None
    return float(realised) > 1 + float(theta)


ENV = Environment(loader=PackageLoader("rebalance.ui", "templates"),
                  autoescape=select_autoescape(["html"]), undefined=StrictUndefined,
                  trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
ENV.filters.update(f3=_f, pct=_pct, n=_n, theta=_theta, url=lambda v: quote(str(v), safe=""),
                   path=lambda v: quote(str(v)), s=lambda v: "" if v is None else v,
                   json=lambda v, sort_keys=False: json.dumps(v, sort_keys=sort_keys, default=str))
ENV.globals.update(zip=zip)
ENV.globals.update(PREFIX=PREFIX, DAG_ID=DAG_ID, ROLLBACK_DAG_ID=ROLLBACK_DAG_ID,
                   COLORS=COLORS, over=_over)


# ----------------------------------------------------------------------- chart geometry
def loads_chart(loads: dict[str, Any], width: int = 860, height: int = 220) -> dict[str, Any]:
    """Lines of instance load per window, the assignment version under each window."""
    windows, matrix = loads["windows"], loads["loads"]
    if not windows:
        return {}
    pad, top = 46, 10
    ymax = max(max(row) for row in matrix) or 1.0
    n = len(windows)
    x = (lambda i: pad + (width - pad - 10) * (i / max(n - 1, 1)))  # noqa: E731
    y = (lambda v: top + (height - top - 30) * (1 - v / ymax))  # noqa: E731
    imb = [v for v in loads["imbalance"] if v is not None]
    return {
        "width": width, "height": height, "pad": pad, "top": top, "x_end": width - 10,
        "y0": y(0), "ymax_y": y(ymax) + 4, "ymax": f"{ymax:,.0f}",
        "switches": [{"x": x(i), "label_x": x(i) + 3, "version": loads["versions"][i]}
                     for i in range(1, n) if loads["versions"][i] != loads["versions"][i - 1]],
        "lines": [{"color": COLORS[j % len(COLORS)], "instance": inst,
                   "points": " ".join(f"{x(i):.1f},{y(row[j]):.1f}"
                                      for i, row in enumerate(matrix))}
                  for j, inst in enumerate(loads["instances"])],
        "first": windows[0][:19], "last": windows[-1][:19], "last_x": width - 170,
        "latest_imbalance": f"{imb[-1]:.3f}" if imb else None,
    }


def imbalance_chart(data: dict[str, Any], width: int = 860, height: int = 220) -> dict[str, Any]:
    """Realised imbalance per window against ``1 + theta`` (the theta of the plan live in
    each window), assignment switches, and every plan's verify result at its first
    verified window."""
    windows, values = data["windows"], data["imbalance"]
    if not windows:
        return {}
    pad, top = 46, 10
    bounds = [1 + t for t in data["theta"]]
    seen = [v for v in values if v is not None] + bounds
    ymin, ymax = 1.0, max(seen) * 1.05 if seen else 2.0
    n = len(windows)
    x = (lambda i: pad + (width - pad - 10) * (i / max(n - 1, 1)))  # noqa: E731
    y = (lambda v: top + (height - top - 30) * (1 - (v - ymin) / (ymax - ymin)))  # noqa: E731
    steps = []
    for i, b in enumerate(bounds):
        if i:
            steps.append(f"{x(i):.1f},{y(bounds[i - 1]):.1f}")
        steps.append(f"{x(i):.1f},{y(b):.1f}")
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    index = {w[:19]: i for i, w in enumerate(windows)}
    checks = []
    for c in data["checks"]:
        i = index.get((c["window"] or "")[:19])
        if i is None or c["realised"] is None:
            continue
        checks.append({"status": c["status"], "x": f"{x(i) - 5:.1f}",
                       "y": f"{y(c['realised']) - 5:.1f}", "ok": c["status"] == "verified",
                       "plan": c["plan_id"][:12], "realised": f"{c['realised']:.3f}"})
    return {
        "width": width, "height": height, "pad": pad, "top": top, "x_end": width - 10,
        "y1": f"{y(1):.1f}", "ymax_y": f"{y(ymax) + 4:.1f}", "ymax": f"{ymax:.2f}",
        "switches": [{"x": f"{x(i):.1f}", "label_x": f"{x(i) + 3:.1f}",
                      "version": data["versions"][i]}
                     for i in range(1, n) if data["versions"][i] != data["versions"][i - 1]],
        "bound": " ".join(steps),
        "line": " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in pts),
        "points": [{"over": v > bounds[i], "x": f"{x(i):.1f}", "y": f"{y(v):.1f}",
                    "window": windows[i][:19], "value": f"{v:.3f}",
                    "bound": f"{bounds[i]:.3f}", "version": data["versions"][i]}
                   for i, v in pts],
        "checks": checks,
        "first": windows[0][:19], "last": windows[-1][:19], "last_x": width - 170,
        "within": sum(1 for i, v in pts if v <= bounds[i]), "judged": len(pts),
    }


def bars_chart(loads: dict[str, Any], width: int = 620, height: int = 220) -> dict[str, Any]:
    """Grouped bars: each instance's load before and after the plan, and the mean after."""
    inst, before, after = loads["instance"], loads["before"], loads["after"]
    if not inst:
        return {}
    pad, top = 46, 10
    ymax = max(before + after) or 1.0
    mean = sum(after) / len(after)
    slot = (width - pad - 10) / len(inst)
    y = (lambda v: top + (height - top - 30) * (1 - v / ymax))  # noqa: E731
    bars = []
    for i, (b, a) in enumerate(zip(before, after)):
        x0, w = pad + i * slot + slot * 0.15, slot * 0.35
        bars.append({"instance": inst[i], "x": f"{x0:.1f}", "x_after": f"{x0 + w:.1f}",
                     "w": f"{w:.1f}", "y_before": f"{y(b):.1f}", "h_before": f"{y(0) - y(b):.1f}",
                     "y_after": f"{y(a):.1f}", "h_after": f"{y(0) - y(a):.1f}",
                     "before": f"{b:,.1f}", "after": f"{a:,.1f}"})
    return {"width": width, "height": height, "pad": pad, "x_end": width - 10,
            "ymax_y": y(ymax) + 4, "ymax": f"{ymax:,.0f}", "y0": y(0), "bars": bars,
            "label_y": height - 12, "mean_y": f"{y(mean):.1f}", "mean_label_x": width - 60,
            "mean_label_y": f"{y(mean) - 3:.1f}"}


# ------------------------------------------------------------------------------- pages
def render_index(loads: dict[str, Any], realised: dict[str, Any], history: list[dict[str, Any]],
                 versions: list[dict[str, Any]], health: dict[str, str],
                 triggered: str | None = None, error: str | None = None) -> str:
    """``/rebalance/``: the health strip, both charts, the plans and the assignment versions."""
    return ENV.get_template("index.html").render(
        loads=loads, loads_chart=loads_chart(loads), imbalance_chart=imbalance_chart(realised),
        history=history, versions=versions, live=next((v for v in versions if v["live"]), None),
        health=health, triggered=triggered, error=error)


def render_plan(p: dict[str, Any]) -> str:
    """``/rebalance/plans/<plan_id>``: one plan, its checks, its commits."""
    bt, v = p.get("backtest") or {}, p.get("verification") or {}
    why = [r for r in (bt.get("decision"), bt.get("theta_plan_reason"), bt.get("choice_reason"))
           if r]
    return ENV.get_template("plan.html").render(
        p=p, bt=bt, verification=v, why=why, validation=p["validation"] or {},
        moved=p["moved"][:MOVED_ROWS_SHOWN], bars=bars_chart(p["instance_loads"]))
