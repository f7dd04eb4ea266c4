"""The Rebalance view: an Airflow plugin (FastAPI app at ``/rebalance``).

Read-only pages for a newcomer and an auditor alike, shown as the **Rebalance** tab of
every DAG page and in the navigation:

* ``/rebalance/jobs`` (the navigation's entry): every job of the registry, its health (the
  last run: a plan applied, or where and why it skipped), the newest window's imbalance
  against ``1 + theta``, its last plan; each page below takes ``?job=<name>`` (default: the first);
* ``/rebalance/``: realised imbalance of the latest windows against ``1 + theta`` with every
  plan's verify result (chart), instance loads over the same windows (chart), the plan
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
  or not, the job's newest window, the last run and, if it skipped, where and why).

Every endpoint requires an authenticated Airflow user allowed to read the ``rebalance``
DAG (anonymous: 401, or a redirect to the login page for pages). The only action,
**rollback**, triggers a run of the ``rebalance_rollback`` DAG through Airflow's own REST
API with the caller's credentials; nothing here writes to Delta. Data is read through
:mod:`rebalance.ui.views` with delta-rs in the api-server (the ``spark`` argument is None:
no JVM round trip, local or ``s3a://`` tables alike) and rendered by the Jinja2 templates
of :mod:`rebalance.ui.pages` (autoescaped: every value from the data is escaped).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from urllib.parse import quote, urlsplit

from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from rebalance.ui.pages import DAG_ID, PREFIX, ROLLBACK_DAG_ID

can_read = Depends(requires_access_dag("GET", param_dag_id=DAG_ID))
app = FastAPI(title="Rebalance", description=__doc__.split("\n\n")[0],
              dependencies=[can_read])


@contextmanager
def _job(name: str | None, dag: str | None = None):
    """Read as the registry's job ``name``, else the job whose DAG is ``dag`` (the DAG
    tab's link), else the first; an unknown name: 404 naming the jobs. Yields the job and
    the name a page's links carry (``?job=``; None for the registry's first job)."""
    from rebalance.core import registry

    try:
        reg = registry.load()
        job = reg.job(name) if name is not None else (dag and reg.by_dag(dag)) or reg.job()
    except registry.RegistryError as exc:
        raise HTTPException(404, str(exc)) from None
    with registry.job_scope(job):
        yield job, (None if job == reg.job() else job.name)


# ------------------------------------------------------------------------------ JSON API
# Every endpoint takes ``?job=<name>``, a job of the registry (default: the first).
@app.get("/api/plans")
def api_plans(limit: int = 200, job: str | None = None) -> JSONResponse:
    from rebalance.ui import views
    with _job(job):
        return JSONResponse(views.plans(None, limit=limit))


@app.get("/api/plans/{plan_id}")
def api_plan(plan_id: str, job: str | None = None) -> JSONResponse:
    from rebalance.ui import views
    with _job(job):
        try:
            return JSONResponse(json.loads(json.dumps(views.plan(None, plan_id),
                                                      default=str)))
        except views.NotFound as exc:
            raise HTTPException(404, str(exc)) from None


@app.get("/api/assignments")
def api_assignments(job: str | None = None) -> JSONResponse:
    from rebalance.ui import views
    with _job(job):
        return JSONResponse(views.assignments(None))


@app.get("/api/loads")
def api_loads(windows: int = 60, job: str | None = None) -> JSONResponse:
    from rebalance.ui import views
    with _job(job):
        return JSONResponse(views.instance_loads(None, windows=windows))


@app.get("/api/health")
def api_health(job: str | None = None) -> JSONResponse:
    with _job(job) as (config, _):
        return JSONResponse(_health(config.dag_id)[0])


def _health(dag_id: str) -> tuple[dict[str, str], dict[str, str]]:
    """The health strip (as ``make status`` ends) of the current job: its DAG paused or not
    and its newest run with what it did (a plan applied, or where it skipped and why),
    from Airflow's metadata database; its newest window, from the Delta log. Also why
    that run's tasks skipped, by task id (:func:`rebalance.ops.health.db_lines`)."""
    from rebalance.ops.health import db_lines, job_line
    from rebalance.spark import tables

    dag, last, skipped = db_lines(dag_id)
    return {"dag": dag, "job": job_line(tables.tables_root(), None), "last run": last}, skipped


@app.get("/api/imbalance")
def api_ratios(windows: int = 60, job: str | None = None) -> JSONResponse:
    """Each window's max / mean load against ``1 + theta`` (:func:`views.realised_ratios`)."""
    from rebalance.ui import views
    with _job(job):
        return JSONResponse(views.realised_ratios(None, windows=windows))


@app.get("/api/jobs")
def api_jobs() -> JSONResponse:
    return JSONResponse(json.loads(json.dumps(_jobs(), default=str)))


def _jobs() -> list[dict]:
    """Per job of the registry: its DAG's health, its last run (``skipped``: why its tasks
    skipped, by task id), the newest window's imbalance against ``1 + theta`` (its
    configured theta), and its last plan."""
    from rebalance.core import registry
    from rebalance.ui import views

    rows = []
    for job in registry.load().jobs:
        with registry.job_scope(job):
            health, skipped = _health(job.dag_id)
            ratios = views.realised_ratios(None, windows=1)
            plans = views.plans(None, limit=1)
        rows.append({"job": job.name, "dag_id": job.dag_id, "theta": job.theta,
                     "dag": health["dag"], "window": health["job"],
                     "last_run": health["last run"], "skipped": skipped,
                     "imbalance": ratios["imbalance"][-1] if ratios["imbalance"] else None,
                     "plan": plans[0] if plans else None})
    return rows


# --------------------------------------------------------------------------------- pages
@app.get("/jobs", response_class=HTMLResponse)
def jobs_page() -> str:
    from rebalance.ui import pages
    return pages.render_jobs(_jobs())


@app.get("/", response_class=HTMLResponse)
def index(request: Request, triggered: str | None = None, error: str | None = None,
          job: str | None = None, dag: str | None = None) -> str:
    from rebalance.ui import pages, views
    with _job(job, dag) as (config, page_job):
        return pages.render_index(views.instance_loads(None, windows=views.CHART_WINDOWS),
                                  views.realised_ratios(None, windows=views.CHART_WINDOWS),
                                  views.plans(None, limit=100), views.assignments(None),
                                  _health(config.dag_id)[0], triggered=triggered, error=error,
                                  job=page_job, dag_id=config.dag_id)


@app.get("/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(plan_id: str, job: str | None = None) -> str:
    from rebalance.ui import pages, views
    with _job(job) as (config, page_job):
        try:
            p = views.plan(None, plan_id)
        except views.NotFound as exc:
            raise HTTPException(404, str(exc)) from None
        return pages.render_plan(p, job=page_job, dag_id=config.dag_id)


@app.post("/rollback")
async def rollback(request: Request, to_version: int = Form(...),
                   dry_run: bool = Form(False), job: str | None = Form(None)
                   ) -> RedirectResponse:
    """Trigger ``rebalance_rollback`` through Airflow's REST API as the calling user."""
    import httpx

    origin = request.headers.get("origin")
    if origin and urlsplit(origin).netloc != request.url.netloc:
        raise HTTPException(403, f"cross-origin rollback request from {origin} refused")
    token = request.cookies.get("_token") or request.headers.get("authorization", "").removeprefix("Bearer ")
    base = f"{request.url.scheme}://{request.url.netloc}"
    also = f"job={quote(job)}&" if job else ""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        resp = await client.post(
            f"/api/v2/dags/{ROLLBACK_DAG_ID}/dagRuns",
            headers={"Authorization": f"Bearer {token}"},
            json={"logical_date": None,
                  "conf": {"to_version": to_version, "dry_run": dry_run,
                           **({"job": job} if job else {})},
                  "note": f"rollback to assignment version {to_version} from the Rebalance view"})
    if resp.status_code >= 300:
        detail = resp.json().get("detail", resp.text) if resp.headers.get(
            "content-type", "").startswith("application/json") else resp.text
        return RedirectResponse(f"{PREFIX}/?{also}error=" + quote(
            f"rollback refused by Airflow ({resp.status_code}): {detail}"), status_code=303)
    return RedirectResponse(f"{PREFIX}/?{also}triggered={quote(resp.json()['dag_run_id'])}",
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


class RebalancePlugin(AirflowPlugin):
    name = "rebalance"
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "Rebalance"}]
    external_views = [
        # Airflow fills in {DAG_ID}: each job's DAG tab opens on that job's page
        {"name": "Rebalance", "href": f"{PREFIX}/?dag={{DAG_ID}}", "destination": "dag",
         "url_route": "rebalance-dag"},
        {"name": "Rebalance", "href": f"{PREFIX}/jobs", "destination": "nav",
         "url_route": "rebalance", "category": "browse"},
    ]
