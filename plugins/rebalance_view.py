"""The Rebalance view: an Airflow plugin (FastAPI app at ``/rebalance``).

Read-only pages for a newcomer and an auditor alike, shown as the **Rebalance** tab of
every DAG page and in the navigation:

* ``/rebalance/``: realised imbalance of recent windows against ``1 + theta`` with every
  plan's verify result (chart), instance loads over recent windows (chart), the plan
  history (status, method, imbalance before / predicted / backtested / realised, theta
  and theta_plan, migration, moved keys, table size, lower bound, link to the DAG run),
  assignment versions with the live one marked;
* ``/rebalance/plans/{plan_id}``: predicted, backtested and realised imbalance side by
  side with ``1 + theta`` and ``1 + theta_plan``, the load model and why, loads before
  and after per instance (chart), moved keys with their state bytes, every validation
  expectation with its result, the verification, and the Delta commits behind the plan;
* JSON for scripts: ``/rebalance/api/plans``, ``/rebalance/api/plans/{plan_id}``,
  ``/rebalance/api/assignments``, ``/rebalance/api/loads``, ``/rebalance/api/imbalance``,
  ``/rebalance/api/health`` (the health strip at the top of ``/rebalance/``: the DAG paused
  or not, the job's newest window, the last run).

Every endpoint requires an authenticated Airflow user allowed to read the ``rebalance``
DAG (anonymous: 401, or a redirect to the login page for pages). The only action,
**rollback**, triggers a run of the ``rebalance_rollback`` DAG through Airflow's own REST
API with the caller's credentials; nothing here writes to Delta. Data is read through
:mod:`rebalance.ui.views` on the control plane's Spark (the Spark Connect server of
``make up``, ``REBALANCE_SPARK_REMOTE``).
"""

from __future__ import annotations

import html
import json
import os
from typing import Any
from urllib.parse import quote, urlsplit

from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

DAG_ID = "rebalance"
ROLLBACK_DAG_ID = "rebalance_rollback"
PREFIX = "/rebalance"

can_read = Depends(requires_access_dag("GET", param_dag_id=DAG_ID))
app = FastAPI(title="Rebalance", description=__doc__.split("\n\n")[0],
              dependencies=[can_read])


def _spark():
    from rebalance.control.inputs import spark_session

    if not os.environ.get("REBALANCE_SPARK_REMOTE"):
        raise HTTPException(503, "the Rebalance view reads through the Spark Connect server of "
                                 "`make up` (REBALANCE_SPARK_REMOTE is not set in the api-server)")
    return spark_session()


# ------------------------------------------------------------------------------ JSON API
@app.get("/api/plans")
def api_plans(limit: int = 200) -> JSONResponse:
    from rebalance.ui import views
    return JSONResponse(views.plans(_spark(), limit=limit))


@app.get("/api/plans/{plan_id}")
def api_plan(plan_id: str) -> JSONResponse:
    from rebalance.ui import views
    try:
        return JSONResponse(json.loads(json.dumps(views.plan(_spark(), plan_id), default=str)))
    except views.NotFound as exc:
        raise HTTPException(404, str(exc)) from None


@app.get("/api/assignments")
def api_assignments() -> JSONResponse:
    from rebalance.ui import views
    return JSONResponse(views.assignments(_spark()))


@app.get("/api/loads")
def api_loads(windows: int = 30) -> JSONResponse:
    from rebalance.ui import views
    return JSONResponse(views.instance_loads(_spark(), windows=windows))


@app.get("/api/health")
def api_health() -> JSONResponse:
    return JSONResponse(_health())


def _health() -> dict[str, str]:
    """The health strip (as ``make status`` ends): the DAG paused or not and its newest
    run, from Airflow's metadata database; the job's newest window, from the Delta log."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from rebalance.ops.health import dag_text, job_line, run_text
    from rebalance.spark.paths import data_dir

    with create_session() as session:
        dag = DagModel.get_dagmodel(DAG_ID, session=session)
        run = session.scalars(select(DagRun).where(DagRun.dag_id == DAG_ID)
                              .order_by(DagRun.run_after.desc()).limit(1)).first()
        last = (run_text(None, None) if run is None else
                run_text(run.run_id, run.state, run.end_date))
    return {
        "dag": dag_text(None if dag is None else bool(dag.is_paused)),
        "job": job_line(data_dir() / "tables", None),
        "last run": last,
    }


@app.get("/api/imbalance")
def api_imbalance(windows: int = 60) -> JSONResponse:
    from rebalance.ui import views
    return JSONResponse(views.realised_imbalance(_spark(), windows=windows))


# --------------------------------------------------------------------------------- pages
@app.get("/", response_class=HTMLResponse)
def index(request: Request, triggered: str | None = None, error: str | None = None) -> str:
    from rebalance.ui import views
    spark = _spark()
    loads = views.instance_loads(spark, windows=30)
    realised = views.realised_imbalance(spark, windows=60)
    history = views.plans(spark, limit=100)
    versions = views.assignments(spark)
    notice = ""
    if triggered:
        notice = (f'<p class="ok">Rollback requested: DAG run '
                  f'{_run_link(ROLLBACK_DAG_ID, triggered)} of <code>{ROLLBACK_DAG_ID}</code>.</p>')
    if error:
        notice = f'<p class="bad">{_e(error)}</p>'
    live = next((v for v in versions if v["live"]), None)
    head = (f"live assignment <b>v{live['version']}</b> ({live['n_instances']} instances, "
            f"{live['routing_keys']} keys in the routing table)" if live else
            "no assignment published yet: every key on its default instance")
    health = _health()
    strip = " · ".join(f'<span class="{"bad" if v.startswith("PAUSED") else "ok"}">'
                       f"<b>{_e(k)}</b> {_e(v)}</span>" for k, v in health.items())
    body = [
        "<h1>Rebalance</h1>", f'<p id="health">{strip}</p>', notice,
        f'<p>{head}. {len(history)} plan(s). '
        f'<a href="/dags/{DAG_ID}" target="_top">DAG {DAG_ID}</a> · '
        f'<a href="{PREFIX}/api/plans">JSON</a></p>',
        "<h2>Realised imbalance against 1 + theta</h2>", _imbalance_chart(realised),
        "<h2>Instance loads, recent windows</h2>", _loads_chart(loads),
        "<h2>Plans</h2>", _plans_table(history),
        "<h2>Assignment versions</h2>", _versions_table(versions),
    ]
    return _page("Rebalance", body)


@app.get("/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(plan_id: str) -> str:
    from rebalance.ui import views
    try:
        p = views.plan(_spark(), plan_id)
    except views.NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    v = p["validation"] or {}
    checks = v.get("expectations") or []
    summary = [("status", _status(p["status"])), ("method", _e(p["method"])),
               ("run", _run_link(p["dag_id"], p["run_id"])), ("run type", _e(p["run_type"])),
               ("apply mode", _e(p["apply_mode"])),
               ("data interval", f'{_e(p["data_interval_start"])} – {_e(p["data_interval_end"])}'),
               ("load model", _e(p["load_model"] or "–")),
               ("migration", f'{_pct(p["migration_fraction"])} of state, '
                             f'{_n(p["migration_bytes"])} bytes, {_n(p["moved_keys"])} keys'),
               ("lower bound on migration", f'{_pct(p["lower_bound_migration_fraction"])}'),
               ("routing table", f'{_n(p["table_size"])} keys'),
               ("assignment version", f'v{p["base_assignment_version"]} → ' + (
                   f'v{p["assignment_version"]}' if p["assignment_version"] is not None
                   else "not published")),
               ("reasons", "<br>".join(_e(r) for r in p["reasons"]) or "–")]
    body = [
        f'<p><a href="{PREFIX}/">← all plans</a> · '
        f'<a href="{PREFIX}/api/plans/{quote(plan_id)}">JSON</a></p>',
        f"<h1>Plan <code>{_e(plan_id)}</code></h1>",
        "<table class='kv'>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in summary)
        + "</table>",
        "<h2>Imbalance: predicted, backtested, realised</h2>", _imbalance_table(p),
        "<h2>Instance loads before and after</h2>", _bars_chart(p["instance_loads"]),
        _moved_section(p["moved"], plan_id),
        *([f"<h2>Split keys ({len(p['split'])})</h2>", _table(
            ["key", "instance: share of its events"],
            [[_e(x["key"]), ", ".join(f"{i}: {s:.1%}" for i, s in zip(x["instances"],
                                                                   x["shares"]))]
             for x in p["split"]], "split")] if p.get("split") else []),
        f"<h2>Validation (Great Expectations): {v.get('evaluated_expectations', '?')} "
        f"expectations, {v.get('unsuccessful_expectations', '?')} failed</h2>",
        _table(["suite", "expectation", "arguments", "result", "seen"],
               [[_e(c["suite"]), _e(c["expectation"]), _e(json.dumps(c["kwargs"], default=str)),
                 _status("passed" if c["success"] else "failed"),
                 _e(json.dumps(c.get("seen"), default=str))
                 if not c["success"] or c.get("seen") is not None else ""]
                for c in checks], "validation"),
        "<h2>Verification</h2>", _table(
            ["field", "value"], [[_e(k), _e(json.dumps(val, default=str))]
                                 for k, val in (p["verification"] or {}).items()], "verification"),
        "<h2>Delta commits</h2>", _table(
            ["table", "version", "time", "action", "userMetadata"],
            [[_e(c["table"]), c["version"], _e(c["timestamp"]), _e(c["action"]),
              f'<code class="meta">{_e(json.dumps(c["userMetadata"], sort_keys=True, default=str))}</code>']
             for c in p["commits"]], "commits"),
    ]
    return _page(f"Plan {plan_id}", body)


@app.post("/rollback")
async def rollback(request: Request, to_version: int = Form(...),
                   dry_run: bool = Form(False)) -> RedirectResponse:
    """Trigger ``rebalance_rollback`` through Airflow's REST API as the calling user."""
    import httpx

    origin = request.headers.get("origin")
    if origin and urlsplit(origin).netloc != request.url.netloc:
        raise HTTPException(403, f"cross-origin rollback request from {origin} refused")
    token = request.cookies.get("_token") or request.headers.get("authorization", "").removeprefix("Bearer ")
    base = f"{request.url.scheme}://{request.url.netloc}"
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        resp = await client.post(
            f"/api/v2/dags/{ROLLBACK_DAG_ID}/dagRuns",
            headers={"Authorization": f"Bearer {token}"},
            json={"logical_date": None, "conf": {"to_version": to_version, "dry_run": dry_run},
                  "note": f"rollback to assignment version {to_version} from the Rebalance view"})
    if resp.status_code >= 300:
        detail = resp.json().get("detail", resp.text) if resp.headers.get(
            "content-type", "").startswith("application/json") else resp.text
        return RedirectResponse(f"{PREFIX}/?error=" + quote(f"rollback refused by Airflow "
                                                            f"({resp.status_code}): {detail}"),
                                status_code=303)
    return RedirectResponse(f"{PREFIX}/?triggered={quote(resp.json()['dag_run_id'])}",
                            status_code=303)


@app.exception_handler(HTTPException)
async def _errors(request: Request, exc: HTTPException):
    """401 for the API; a redirect to Airflow's login for a person's page."""
    wants_page = (not request.url.path.startswith(f"{PREFIX}/api")
                  and "text/html" in request.headers.get("accept", ""))
    if exc.status_code == 401 and wants_page:
        from airflow.api_fastapi.app import get_auth_manager

        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)),
                                status_code=302)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


# ------------------------------------------------------------------------------ rendering
CSS = """
body{font-family:system-ui,sans-serif;margin:16px 24px;color:#1f2933;font-size:14px}
h1{font-size:22px;margin:4px 0 8px} h2{font-size:16px;margin:22px 0 6px}
table{border-collapse:collapse;margin:4px 0 8px}
td,th{border-bottom:1px solid #e4e7eb;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f5f7fa;font-weight:600} table.kv th{width:260px}
.st{padding:1px 7px;border-radius:9px;font-size:12px;color:#fff;background:#7b8794}
.st.verified,.st.applied,.st.passed,.st.published{background:#2f9e44}.st.rejected,.st.failed,.st.diverged{background:#c92a2a}
.st.what-if{background:#5f3dc4}.st.proposed,.st.validated{background:#1971c2}
code.meta{font-size:11px;white-space:pre-wrap;word-break:break-all} .ok{color:#2f9e44}.bad{color:#c92a2a}
svg text{font-size:11px;fill:#52606d} button{cursor:pointer}
"""
COLORS = ["#1971c2", "#e8590c", "#2f9e44", "#c2255c", "#5f3dc4", "#0c8599", "#f08c00", "#495057"]


def _page(title: str, body: list[str]) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _f(value: Any) -> str:
    return "–" if value is None else f"{float(value):.3f}"


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * float(value):.2f} %"


def _n(value: Any) -> str:
    return "–" if value is None else f"{float(value):,.0f}"


def _status(status: str) -> str:
    return f'<span class="st {_e(status)}">{_e(status)}</span>'


def _run_link(dag_id: str, run_id: str) -> str:
    if not run_id or not dag_id or dag_id == "rebalance-cli":
        return _e(run_id or "–")
    return (f'<a target="_top" href="/dags/{quote(dag_id)}/runs/{quote(run_id, safe="")}">'
            f"{_e(run_id)}</a>")


MOVED_ROWS_SHOWN = 500


def _moved_section(moved: list[dict[str, Any]], plan_id: str) -> str:
    """The moved keys, largest state first. A plan over 10^6 keys may move 10^5 of them: the
    page lists the first ``MOVED_ROWS_SHOWN`` and points to the JSON for the rest."""
    shown = moved[:MOVED_ROWS_SHOWN]
    note = "" if len(shown) == len(moved) else (
        f'<p id="moved-truncated">the {len(shown)} with the most state are shown; all '
        f'{len(moved)} are in the <a href="{PREFIX}/api/plans/{quote(plan_id)}">JSON</a></p>')
    return (f"<h2>Moved keys ({len(moved)})</h2>" + note + _table(
        ["key", "from", "to", "load", "state bytes"],
        [[_e(m["key"]), m["from"], m["to"], _f(m["load"]), _n(m["state_bytes"])]
         for m in shown], "moved"))


def _table(header: list[str], rows: list[list[Any]], css_id: str) -> str:
    if not rows:
        return f'<p id="{css_id}">none</p>'
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{css_id}"><tr>{head}</tr>{body}</table>'


def _plans_table(history: list[dict[str, Any]]) -> str:
    rows = [[f'<a href="{PREFIX}/plans/{quote(p["plan_id"])}"><code>{_e(p["plan_id"][:12])}</code></a>',
             _status(p["status"]), _e(p["method"]), _e((p["created_at"] or "")[:19]),
             _f(p["imbalance_before"]), _f(p["predicted_imbalance"]),
             _f(p["backtested_imbalance"]), _within(p["realised_imbalance"], p["theta"]),
             _theta(p["theta"]), _theta(p["theta_plan"]),
             _pct(p["migration_fraction"]), _n(p["moved_keys"]), _n(p["table_size"]),
             _pct(p["lower_bound_migration_fraction"]),
             "–" if p["assignment_version"] is None else f'v{p["assignment_version"]}',
             _run_link(p["dag_id"], p["run_id"])] for p in history]
    return _table(["plan", "status", "method", "created (UTC)", "imbalance before", "predicted",
                   "backtested", "realised", "theta", "theta_plan", "migration", "moved keys",
                   "table size", "lower bound", "version", "DAG run"], rows, "plans")


def _theta(value: Any) -> str:
    return "–" if value is None else f"{float(value):g}"


def _within(realised: Any, theta: Any) -> str:
    """A realised imbalance, red when above ``1 + theta``."""
    if realised is None or theta is None:
        return _f(realised)
    over = float(realised) > 1 + float(theta)
    return f'<span class="{"bad" if over else "ok"}">{_f(realised)}</span>'


def _imbalance_table(p: dict[str, Any]) -> str:
    """Predicted, backtested and realised imbalance side by side with the bounds.

    predicted: the plan on the loads it was made for (the forecast of its load model),
    held to ``1 + theta_plan``; backtested: the same way of planning replayed on recent
    windows it had not seen (mean realised imbalance), beside keeping the live
    assignment over the same windows; realised: the verified window(s) after it went
    live, held to ``1 + theta``."""
    bt, v = p.get("backtest") or {}, p.get("verification") or {}
    theta, theta_plan = p.get("theta"), p.get("theta_plan")
    held_out = bt.get("held_out") or []
    rows = [
        ["before (live assignment, planned windows)", _f(p["imbalance_before"]), "–", ""],
        ["predicted (plan, on its forecast)", _f(p["predicted_imbalance"]),
         "–" if theta_plan is None else _f(1 + float(theta_plan)),
         "planning bound 1 + theta_plan"],
        ["backtested (plan made the same way, on held-out windows)",
         _f(bt.get("planned")), "–" if theta is None else _f(1 + float(theta)),
         f"{len(held_out)} held-out window(s)" if held_out else ""],
        ["backtested staying (live assignment, same windows)", _f(bt.get("staying")),
         "–" if theta is None else _f(1 + float(theta)), ""],
        ["realised (verified window(s) after the switch)",
         _within(p["realised_imbalance"], theta),
         "–" if theta is None else _f(1 + float(theta)),
         "" if "tolerance" not in v else f"verify accepts up to {_f(v.get('limit'))} "
                                         f"(verify_tolerance {v['tolerance']:g})"],
    ]
    why = [r for r in (bt.get("decision"), bt.get("theta_plan_reason"), bt.get("choice_reason"))
           if r]
    return (_table(["imbalance", "value", "bound", "note"], rows, "imbalance")
            + f"<p>theta {_theta(theta)} · theta_plan {_theta(theta_plan)} · load model "
              f"{_e(p.get('load_model') or '–')}</p>"
            + ("<ul id='backtest-reasons'>" + "".join(f"<li>{_e(r)}</li>" for r in why)
               + "</ul>" if why else ""))


def _versions_table(versions: list[dict[str, Any]]) -> str:
    rows = []
    for v in versions:
        action = ("<b>live</b>" if v["live"] else
                  f'<form method="post" action="{PREFIX}/rollback" style="margin:0">'
                  f'<input type="hidden" name="to_version" value="{v["version"]}">'
                  f'<button type="submit" title="trigger the {ROLLBACK_DAG_ID} DAG">'
                  f'roll back to v{v["version"]}</button></form>')
        rows.append([f'v{v["version"]}', _e((v["timestamp"] or "")[:19]), _e(v["action"]),
                     f'<a href="{PREFIX}/plans/{quote(v["plan_id"])}">'
                     f'<code>{_e(v["plan_id"][:12])}</code></a>' if v["plan_id"] else "–",
                     _e(v["apply_mode"]), _n(v["routing_keys"]), action])
    return _table(["version", "published (UTC)", "action", "plan", "apply mode", "routing keys", ""],
                  rows, "versions")


def _loads_chart(loads: dict[str, Any], width: int = 860, height: int = 220) -> str:
    """Lines of instance load per window (SVG), the assignment version under each window."""
    windows, matrix = loads["windows"], loads["loads"]
    if not windows:
        return '<p id="loads-chart">no instance histograms yet</p>'
    pad, top = 46, 10
    ymax = max(max(row) for row in matrix) or 1.0
    n = len(windows)
    x = (lambda i: pad + (width - pad - 10) * (i / max(n - 1, 1)))  # noqa: E731
    y = (lambda v: top + (height - top - 30) * (1 - v / ymax))  # noqa: E731
    parts = [f'<svg id="loads-chart" width="{width}" height="{height}" role="img" '
             f'aria-label="instance loads per window">',
             f'<line x1="{pad}" y1="{y(0)}" x2="{width - 10}" y2="{y(0)}" stroke="#9aa5b1"/>',
             f'<text x="4" y="{y(ymax) + 4}">{ymax:,.0f}</text><text x="4" y="{y(0)}">0</text>']
    for i in range(1, n):
        if loads["versions"][i] != loads["versions"][i - 1]:
            parts.append(f'<line x1="{x(i)}" y1="{top}" x2="{x(i)}" y2="{y(0)}" stroke="#adb5bd" '
                         f'stroke-dasharray="4 3"/><text x="{x(i) + 3}" y="{top + 10}">'
                         f'v{loads["versions"][i]}</text>')
    for j, inst in enumerate(loads["instances"]):
        pts = " ".join(f"{x(i):.1f},{y(row[j]):.1f}" for i, row in enumerate(matrix))
        parts.append(f'<polyline fill="none" stroke="{COLORS[j % len(COLORS)]}" stroke-width="2" '
                     f'points="{pts}"><title>instance {inst}</title></polyline>')
    parts.append(f'<text x="{pad}" y="{height - 8}">{_e(windows[0][:19])}</text>'
                 f'<text x="{width - 170}" y="{height - 8}">{_e(windows[-1][:19])}</text>')
    parts.append("</svg>")
    legend = " ".join(f'<span style="color:{COLORS[j % len(COLORS)]}">■ instance {inst}</span>'
                      for j, inst in enumerate(loads["instances"]))
    imb = [v for v in loads["imbalance"] if v is not None]
    last = f" · imbalance of the latest window {imb[-1]:.3f}" if imb else ""
    return "".join(parts) + f"<div>{legend}{last}</div>"


def _imbalance_chart(data: dict[str, Any], width: int = 860, height: int = 220) -> str:
    """Realised imbalance per window (line) against ``1 + theta`` (dashed red steps: the
    theta of the plan live in each window), assignment switches (grey), and every plan's
    verify result at its first verified window (green: verified, red: diverged)."""
    windows, values = data["windows"], data["imbalance"]
    if not windows:
        return '<p id="imbalance-chart">no instance histograms yet</p>'
    pad, top = 46, 10
    bounds = [1 + t for t in data["theta"]]
    seen = [v for v in values if v is not None] + bounds
    ymin, ymax = 1.0, max(seen) * 1.05 if seen else 2.0
    n = len(windows)
    x = (lambda i: pad + (width - pad - 10) * (i / max(n - 1, 1)))  # noqa: E731
    y = (lambda v: top + (height - top - 30) * (1 - (v - ymin) / (ymax - ymin)))  # noqa: E731
    parts = [f'<svg id="imbalance-chart" width="{width}" height="{height}" role="img" '
             f'aria-label="realised imbalance per window against 1 + theta">',
             f'<line x1="{pad}" y1="{y(1):.1f}" x2="{width - 10}" y2="{y(1):.1f}" stroke="#9aa5b1"/>',
             f'<text x="4" y="{y(ymax) + 4:.1f}">{ymax:.2f}</text>'
             f'<text x="4" y="{y(1):.1f}">1.00</text>']
    for i in range(1, n):
        if data["versions"][i] != data["versions"][i - 1]:
            parts.append(f'<line x1="{x(i):.1f}" y1="{top}" x2="{x(i):.1f}" y2="{y(1):.1f}" '
                         f'stroke="#adb5bd" stroke-dasharray="4 3"/><text x="{x(i) + 3:.1f}" '
                         f'y="{top + 10}">v{data["versions"][i]}</text>')
    steps = []
    for i, b in enumerate(bounds):
        if i:
            steps.append(f"{x(i):.1f},{y(bounds[i - 1]):.1f}")
        steps.append(f"{x(i):.1f},{y(b):.1f}")
    parts.append(f'<polyline id="bound" fill="none" stroke="#c92a2a" stroke-width="1.5" '
                 f'stroke-dasharray="6 3" points="{" ".join(steps)}"><title>1 + theta'
                 f'</title></polyline>')
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    parts.append('<polyline fill="none" stroke="#1971c2" stroke-width="2" points="'
                 + " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in pts) + '"/>')
    for i, v in pts:
        over = v > bounds[i]
        parts.append(f'<circle class="{"over" if over else "within"}" cx="{x(i):.1f}" '
                     f'cy="{y(v):.1f}" r="2.5" fill="{"#c92a2a" if over else "#1971c2"}">'
                     f'<title>{_e(windows[i][:19])}: {v:.3f} (bound {bounds[i]:.3f}, '
                     f'v{data["versions"][i]})</title></circle>')
    index = {w[:19]: i for i, w in enumerate(windows)}
    for c in data["checks"]:
        i = index.get((c["window"] or "")[:19])
        if i is None or c["realised"] is None:
            continue
        ok = c["status"] == "verified"
        parts.append(f'<rect class="check {_e(c["status"])}" x="{x(i) - 5:.1f}" '
                     f'y="{y(c["realised"]) - 5:.1f}" width="10" height="10" fill="none" '
                     f'stroke="{"#2f9e44" if ok else "#c92a2a"}" stroke-width="2"><title>plan '
                     f'{_e(c["plan_id"][:12])} {_e(c["status"])}: realised {c["realised"]:.3f}'
                     f'</title></rect>')
    parts.append(f'<text x="{pad}" y="{height - 8}">{_e(windows[0][:19])}</text>'
                 f'<text x="{width - 170}" y="{height - 8}">{_e(windows[-1][:19])}</text></svg>')
    within = sum(1 for i, v in pts if v <= bounds[i])
    return "".join(parts) + (
        f'<div><span style="color:#1971c2">■ realised imbalance</span> '
        f'<span style="color:#c92a2a">- - 1 + theta</span> '
        f'<span style="color:#2f9e44">□ verified</span> <span style="color:#c92a2a">□ '
        f'diverged</span> · {within} of {len(pts)} window(s) within 1 + theta</div>')


def _bars_chart(loads: dict[str, Any], width: int = 620, height: int = 220) -> str:
    """Grouped bars: each instance's load before (grey) and after (blue) the plan, and the mean."""
    inst, before, after = loads["instance"], loads["before"], loads["after"]
    if not inst:
        return '<p id="bars-chart">no loads</p>'
    pad, top = 46, 10
    ymax = max(before + after) or 1.0
    mean = sum(after) / len(after)
    slot = (width - pad - 10) / len(inst)
    y = (lambda v: top + (height - top - 30) * (1 - v / ymax))  # noqa: E731
    parts = [f'<svg id="bars-chart" width="{width}" height="{height}" role="img" '
             f'aria-label="instance loads before and after">',
             f'<text x="4" y="{y(ymax) + 4}">{ymax:,.0f}</text><text x="4" y="{y(0)}">0</text>']
    for i, (b, a) in enumerate(zip(before, after)):
        x0 = pad + i * slot + slot * 0.15
        w = slot * 0.35
        parts.append(f'<rect x="{x0:.1f}" y="{y(b):.1f}" width="{w:.1f}" height="{y(0) - y(b):.1f}" '
                     f'fill="#adb5bd"><title>instance {inst[i]} before: {b:,.1f}</title></rect>')
        parts.append(f'<rect x="{x0 + w:.1f}" y="{y(a):.1f}" width="{w:.1f}" height="{y(0) - y(a):.1f}" '
                     f'fill="#1971c2"><title>instance {inst[i]} after: {a:,.1f}</title></rect>')
        parts.append(f'<text x="{x0:.1f}" y="{height - 12}">{inst[i]}</text>')
    parts.append(f'<line x1="{pad}" y1="{y(mean):.1f}" x2="{width - 10}" y2="{y(mean):.1f}" '
                 f'stroke="#2f9e44" stroke-dasharray="5 3"/><text x="{width - 60}" '
                 f'y="{y(mean) - 3:.1f}">mean</text></svg>')
    return "".join(parts) + ('<div><span style="color:#adb5bd">■ before</span> '
                             '<span style="color:#1971c2">■ after</span> (load per instance)</div>')


class RebalancePlugin(AirflowPlugin):
    name = "rebalance"
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "Rebalance"}]
    external_views = [
        {"name": "Rebalance", "href": f"{PREFIX}/", "destination": "dag",
         "url_route": "rebalance-dag"},
        {"name": "Rebalance", "href": f"{PREFIX}/", "destination": "nav",
         "url_route": "rebalance", "category": "browse"},
    ]
