"""The Rebalance view's HTML: Jinja2 templates (``templates/``, autoescaped) over the dicts
of :mod:`rebalance.ui.views`, and the geometry of its SVG charts.

The Airflow plugin (``plugins/rebalance_view.py``) serves these pages; nothing here reads
a table. Every value from the data is escaped by the templates; only the page's own
markup is written unescaped.

>>> html = render_index(loads, realised, history, versions, health)   # doctest: +SKIP
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
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


def commit_summary(meta: dict[str, Any] | None) -> str:
    """One line for a Delta commit's ``userMetadata`` (the plan's status, method, run,
    assignment versions and metrics); the page shows every field one click away."""
    if not meta:
        return "–"
    m = meta.get("metrics") or {}
    parts = [str(meta[k]) for k in ("status", "method", "apply_mode") if meta.get(k)]
    base, new = meta.get("base_assignment_version"), meta.get("assignment_version")
    if new is not None:
        parts.append(f"v{base if base is not None else '?'} → v{new}")
    if meta.get("rollback_to") is not None:
        parts.append(f"rollback to v{meta['rollback_to']}")
    if m.get("imbalance_before") is not None:
        after = m.get("imbalance_after")
        parts.append(f"imbalance {_f(m['imbalance_before'])}"
                     + (f" → {_f(after)}" if after is not None else ""))
    if m.get("moved_keys") is not None:
        parts.append(f"{_n(m['moved_keys'])} keys moved")
    if meta.get("run_id"):
        parts.append(f"run {meta['run_id']}")
    return " · ".join(parts or ["–"])


ENV = Environment(loader=PackageLoader("rebalance.ui", "templates"),
                  autoescape=select_autoescape(["html"]), undefined=StrictUndefined,
                  trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
ENV.filters.update(f3=_f, pct=_pct, n=_n, theta=_theta, url=lambda v: quote(str(v), safe=""),
                   path=lambda v: quote(str(v)), s=lambda v: "" if v is None else v,
                   json=lambda v, sort_keys=False, indent=None: json.dumps(
                       v, sort_keys=sort_keys, indent=indent, default=str))
ENV.globals.update(zip=zip, commit_summary=lambda meta: commit_summary(meta))
ENV.globals.update(PREFIX=PREFIX, DAG_ID=DAG_ID, ROLLBACK_DAG_ID=ROLLBACK_DAG_ID, JOB=None, Q="",
                   COLORS=COLORS, over=_over)


# ----------------------------------------------------------------------- chart geometry
#: Candidate spacings of the time axis' ticks (seconds): the smallest that gives at most
#: :data:`MAX_TIME_TICKS` ticks is used.
TICK_STEPS = (10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_TIME_TICKS = 8
#: Room around the plot: left for the y labels and the y title, below for the time axis.
LEFT, RIGHT, TOP, BOTTOM = 72, 12, 14, 42


def _when(value: str) -> dt.datetime:
    """A window start (ISO text) as an aware UTC datetime (naive text is UTC)."""
    t = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t.astimezone(dt.timezone.utc)


def time_domain(*series: dict[str, Any]) -> tuple[dt.datetime, dt.datetime] | None:
    """The time range covering the windows of every series (None: no windows at all):
    charts drawn over the same domain share their time axis."""
    starts = [_when(w) for data in series for w in data.get("windows") or []]
    return (min(starts), max(starts)) if starts else None


def time_axis(domain: tuple[dt.datetime, dt.datetime], x0: float, x1: float) -> dict[str, Any]:
    """x of a time over ``domain`` (``x0`` .. ``x1``), ticks at round UTC times (HH:MM, or
    HH:MM:SS below a minute; a tick on a new day also names the day) and the axis title
    with the date."""
    lo, hi = domain[0].timestamp(), domain[1].timestamp()
    span = max(hi - lo, 1.0)

    def x(t: dt.datetime) -> float:
        return x0 + (x1 - x0) * (t.timestamp() - lo) / span if hi > lo else (x0 + x1) / 2

    step = 60 if hi <= lo else next((s for s in TICK_STEPS if span / s < MAX_TIME_TICKS),
                                    TICK_STEPS[-1])
    while span / step >= MAX_TIME_TICKS:          # more than a week shown: whole days
        step *= 2
    fmt = "%H:%M:%S" if step < 60 else "%H:%M"
    ticks, day = [], domain[0].date()
    first = -(-lo // step) * step                  # the first multiple of step >= lo
    for k in range(int((hi - first) // step) + 1):
        t = dt.datetime.fromtimestamp(first + k * step, dt.timezone.utc)
        label = t.strftime(fmt)
        if t.date() != day:
            label, day = t.strftime("%m-%d ") + label, t.date()
        ticks.append({"x": f"{x(t):.1f}", "label": label})
    if not ticks:                                  # a single window off the minute
        ticks.append({"x": f"{x(domain[0]):.1f}", "label": domain[0].strftime("%H:%M:%S")})
    dates = sorted({domain[0].date(), domain[1].date()})
    title = "window start, UTC, " + " to ".join(d.isoformat() for d in dates)
    return {"x": x, "ticks": ticks, "title": title}


def _nice_step(span: float, most: int) -> float:
    """A round step (1, 2, 2.5 or 5 times a power of ten) giving at most ``most`` steps."""
    raw = span / max(most, 1)
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def value_ticks(low: float, high: float, fmt: str, most: int = 5) -> list[tuple[float, str]]:
    """Round values from ``low`` to ``high`` (about ``most`` of them), with their labels."""
    step = _nice_step(high - low, most)
    first = -(-low // step) * step
    out, v = [], first
    while v <= high + step * 1e-9:
        out.append((v, format(v, fmt)))
        v = round(v + step, 10)
    return out


def _frame(width: int, height: int, domain, windows: list[str], y, yticks, title: str
           ) -> dict[str, Any]:
    """What every time chart shares: plot area, time axis, y ticks and titles, and ``x``
    (time -> x) for the caller."""
    x1, base = width - RIGHT, height - BOTTOM
    axis = time_axis(domain or time_domain({"windows": windows}), LEFT, x1)
    return {
        "width": width, "height": height, "pad": LEFT, "top": TOP, "x_end": x1, "base": base,
        "xticks": axis["ticks"], "xtitle": axis["title"], "xtitle_x": (LEFT + x1) / 2,
        "tick_y": base + 14, "xtitle_y": height - 6,
        "yticks": [{"y": f"{y(v):.1f}", "label": label} for v, label in yticks],
        "ylabel_x": LEFT - 6, "ytitle": title, "ytitle_x": 14, "ytitle_y": (TOP + base) / 2,
        "_x": axis["x"],
    }


def _window_step(windows: list[str]) -> int | None:
    """The windows' length in seconds (the most common gap between window starts)."""
    gaps = Counter(round(_when(b).timestamp() - _when(a).timestamp())
                   for a, b in zip(windows, windows[1:]))
    gaps.pop(0, None)
    return gaps.most_common(1)[0][0] if gaps else None


def loads_chart(loads: dict[str, Any], width: int = 900, height: int = 250,
                domain: tuple[dt.datetime, dt.datetime] | None = None) -> dict[str, Any]:
    """Lines of instance load per window, the assignment version under each window; the
    time axis over ``domain`` (default: these windows)."""
    windows, matrix = loads["windows"], loads["loads"]
    if not windows:
        return {}
    ymax = max(max(row) for row in matrix) or 1.0
    ticks = value_ticks(0.0, ymax, ",.0f" if ymax >= 10 else ",.2f")
    ymax = max(ymax, ticks[-1][0])
    base = height - BOTTOM
    y = (lambda v: TOP + (base - TOP) * (1 - v / ymax))  # noqa: E731
    step = _window_step(windows)
    title = f"load per {step}-s window" if step and step < 120 else "load per window"
    c = _frame(width, height, domain, windows, y, ticks, title)
    at = c.pop("_x")
    xs = [at(_when(w)) for w in windows]
    imb = [v for v in loads["imbalance"] if v is not None]
    return {
        **c, "y0": f"{y(0):.1f}",
        "switches": [{"x": f"{xs[i]:.1f}", "label_x": f"{xs[i] + 3:.1f}",
                      "version": loads["versions"][i]}
                     for i in range(1, len(windows))
                     if loads["versions"][i] != loads["versions"][i - 1]],
        "lines": [{"color": COLORS[j % len(COLORS)], "instance": inst,
                   "points": " ".join(f"{xs[i]:.1f},{y(row[j]):.1f}"
                                      for i, row in enumerate(matrix))}
                  for j, inst in enumerate(loads["instances"])],
        "latest_imbalance": f"{imb[-1]:.3f}" if imb else None,
    }


def ratio_chart(data: dict[str, Any], width: int = 900, height: int = 250,
                domain: tuple[dt.datetime, dt.datetime] | None = None) -> dict[str, Any]:
    """The geometry of the chart of :func:`rebalance.ui.views.realised_ratios`: each
    window's max / mean load against ``1 + theta`` (the theta of the plan live in each
    window), assignment switches, and every plan's verify result at its first verified
    window; the time axis over ``domain`` (default: these windows)."""
    windows, values = data["windows"], data["imbalance"]
    if not windows:
        return {}
    bounds = [1 + t for t in data["theta"]]
    seen = [v for v in values if v is not None] + bounds
    ymin = 1.0
    ticks = value_ticks(ymin, max(seen) * 1.05 if seen else 2.0, ".2f")
    ymax = max(ticks[-1][0], max(seen) * 1.05 if seen else 2.0)
    base = height - BOTTOM
    y = (lambda v: TOP + (base - TOP) * (1 - (v - ymin) / (ymax - ymin)))  # noqa: E731
    c = _frame(width, height, domain, windows, y, ticks, "imbalance (max / mean load)")
    at = c.pop("_x")
    xs = [at(_when(w)) for w in windows]
    steps = []
    for i, b in enumerate(bounds):
        if i:
            steps.append(f"{xs[i]:.1f},{y(bounds[i - 1]):.1f}")
        steps.append(f"{xs[i]:.1f},{y(b):.1f}")
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    index = {w[:19]: i for i, w in enumerate(windows)}
    checks = []
    for k in data["checks"]:
        i = index.get((k["window"] or "")[:19])
        if i is None or k["realised"] is None:
            continue
        checks.append({"status": k["status"], "x": f"{xs[i] - 5:.1f}",
                       "y": f"{y(k['realised']) - 5:.1f}", "ok": k["status"] == "verified",
                       "plan": k["plan_id"][:12], "realised": f"{k['realised']:.3f}"})
    return {
        **c, "y1": f"{y(1):.1f}",
        "switches": [{"x": f"{xs[i]:.1f}", "label_x": f"{xs[i] + 3:.1f}",
                      "version": data["versions"][i]}
                     for i in range(1, len(windows))
                     if data["versions"][i] != data["versions"][i - 1]],
        "bound": " ".join(steps),
        "line": " ".join(f"{xs[i]:.1f},{y(v):.1f}" for i, v in pts),
        "points": [{"over": v > bounds[i], "x": f"{xs[i]:.1f}", "y": f"{y(v):.1f}",
                    "window": windows[i][:19], "value": f"{v:.3f}",
                    "bound": f"{bounds[i]:.3f}", "version": data["versions"][i]}
                   for i, v in pts],
        "checks": checks,
        "within": sum(1 for i, v in pts if v <= bounds[i]), "judged": len(pts),
    }


def bars_chart(loads: dict[str, Any], width: int = 620, height: int = 240) -> dict[str, Any]:
    """Grouped bars: each instance's load before and after the plan, and the mean after;
    y ticks with the unit, the instances named below their bars."""
    inst, before, after = loads["instance"], loads["before"], loads["after"]
    if not inst:
        return {}
    top, base = TOP, height - BOTTOM
    peak = max(before + after) or 1.0
    ticks = value_ticks(0.0, peak, ",.0f" if peak >= 10 else ",.2f")
    ymax = max(peak, ticks[-1][0])
    mean = sum(after) / len(after)
    x1 = width - RIGHT
    slot = (x1 - LEFT) / len(inst)
    y = (lambda v: top + (base - top) * (1 - v / ymax))  # noqa: E731
    bars = []
    for i, (b, a) in enumerate(zip(before, after)):
        x0, w = LEFT + i * slot + slot * 0.15, slot * 0.35
        bars.append({"instance": inst[i], "x": f"{x0:.1f}", "x_after": f"{x0 + w:.1f}",
                     "label_x": f"{x0 + w:.1f}",
                     "w": f"{w:.1f}", "y_before": f"{y(b):.1f}", "h_before": f"{y(0) - y(b):.1f}",
                     "y_after": f"{y(a):.1f}", "h_after": f"{y(0) - y(a):.1f}",
                     "before": f"{b:,.1f}", "after": f"{a:,.1f}"})
    return {"width": width, "height": height, "pad": LEFT, "top": top, "x_end": x1,
            "base": base, "y0": f"{y(0):.1f}", "bars": bars,
            "yticks": [{"y": f"{y(v):.1f}", "label": label} for v, label in ticks],
            "ylabel_x": LEFT - 6, "ytitle": "load per instance", "ytitle_x": 14,
            "ytitle_y": (top + base) / 2, "label_y": base + 14, "xtitle": "instance",
            "xtitle_x": (LEFT + x1) / 2, "xtitle_y": height - 6,
            "mean_y": f"{y(mean):.1f}", "mean_label_x": x1 - 40,
            "mean_label_y": f"{y(mean) - 3:.1f}"}


# ------------------------------------------------------------------------------- pages
def job_context(job: str | None, dag_id: str = DAG_ID) -> dict[str, Any]:
    """What a job's pages link with: its DAG, and ``?job=<name>`` on every link when the
    page was asked for a job by name (links stay as they were without one)."""
    return {"JOB": job, "DAG_ID": dag_id, "Q": "" if job is None else f"?job={quote(job)}"}


def render_index(loads: dict[str, Any], realised: dict[str, Any], history: list[dict[str, Any]],
                 versions: list[dict[str, Any]], health: dict[str, str],
                 triggered: str | None = None, error: str | None = None,
                 job: str | None = None, dag_id: str = DAG_ID) -> str:
    """``/rebalance/``: the health strip, both charts, the plans and the assignment versions
    (of ``job``; None: the registry's first)."""
    domain = time_domain(loads, realised)   # both charts over the same time range
    return ENV.get_template("index.html").render(
        loads=loads, loads_chart=loads_chart(loads, domain=domain),
        ratio_chart=ratio_chart(realised, domain=domain),
        history=history, versions=versions, live=next((v for v in versions if v["live"]), None),
        health=health, triggered=triggered, error=error, **job_context(job, dag_id))


def render_plan(p: dict[str, Any], job: str | None = None, dag_id: str = DAG_ID) -> str:
    """``/rebalance/plans/<plan_id>``: one plan, its checks, its commits."""
    bt, v = p.get("backtest") or {}, p.get("verification") or {}
    why = [r for r in (bt.get("decision"), bt.get("theta_plan_reason"), bt.get("choice_reason"))
           if r]
    return ENV.get_template("plan.html").render(
        p=p, bt=bt, verification=v, why=why, validation=p["validation"] or {},
        moved=p["moved"][:MOVED_ROWS_SHOWN], bars=bars_chart(p["instance_loads"]),
        **job_context(job, dag_id))


def render_jobs(rows: list[dict[str, Any]]) -> str:
    """``/rebalance/jobs``: one row per job of the registry (health, live imbalance against
    ``1 + theta``, last plan), each linking to its own page."""
    return ENV.get_template("jobs.html").render(rows=rows)
