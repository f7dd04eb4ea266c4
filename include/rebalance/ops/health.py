"""The service's health in three lines (``make status``): is the DAG paused, is the job
writing windows, and how did the last run end.

* ``dag``: paused or not (a paused DAG plans nothing, and nothing else says so);
* ``job``: the age of the newest window in ``key_histograms``, from its files' statistics
  in the Delta log (through delta-rs: no Spark, no table scan);
* ``last run``: the DAG's newest run, its state, and what it did: a plan applied, or
  where it skipped and why (:func:`run_text`).

``make status`` reads Airflow through its REST API (:func:`dag_lines`; a skip's reason
from the task's log), the Rebalance view from the metadata database (:func:`db_lines`;
the reason the task kept as XCom). Each line says what it could not find out instead of
failing: ``make status`` also runs while the service is half up.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The newest commits read for the window length the job records: every micro-batch of
#: the job is one commit.
NEWEST_COMMITS = 20
#: The DAG's task that makes a plan live: a run where it succeeded applied a plan.
APPLY_TASK = "apply"


def newest_window(table: Path | str, newest: int = NEWEST_COMMITS
                  ) -> tuple[dt.datetime | None, float | None]:
    """The largest ``window_start`` of the table (from its files' statistics,
    :func:`rebalance.spark.delta_rs.max_value`) and the window length the job recorded in
    its newest commits (their ``window_seconds`` commit metadata); (None, None) without
    table or rows."""
    from rebalance.spark import delta_rs

    try:
        best = delta_rs.max_value(table, "window_start")
        commits = delta_rs.history(table, newest) if best is not None else []
    except delta_rs.DeltaRsError:
        return None, None
    seconds = next((_window_seconds(c.metadata) for c in commits
                    if _window_seconds(c.metadata) is not None), None)
    return best, seconds


def _window_seconds(meta: dict[str, Any]) -> float | None:
    try:
        value = meta.get("window_seconds")
        return float(value) if value else None
    except (ValueError, TypeError):
        return None


def job_line(tables: Path | str, running: bool | None, window_seconds: float | None = None,
             now: dt.datetime | None = None) -> str:
    """The job's line: running or not (None: not known here), and when its newest window
    closed (``window_seconds``: if the commits do not record it)."""
    from rebalance.spark.paths import join

    now = now or dt.datetime.now(dt.timezone.utc)
    state = {True: "running; ", False: "NOT running; ", None: ""}[running]
    top, recorded = newest_window(join(tables, "key_histograms"))
    if top is None:
        return f"{state}no window written yet"
    closed = top + dt.timedelta(seconds=recorded or window_seconds or 0)
    age = (now - closed).total_seconds()
    return (f"{state}newest window {top:%Y-%m-%d %H:%M:%S} UTC, closed {_ago(age)} "
            "(event time)")


def _ago(seconds: float) -> str:
    if seconds < 0:
        return "in the future"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def dag_text(is_paused: bool | None) -> str:
    """The DAG's line: paused or not (None: not registered yet)."""
    if is_paused is None:
        return "not parsed yet (the dag-processor registers it within a minute)"
    return ("PAUSED: nothing is scheduled; unpause it in the UI or run `make up`" if is_paused
            else "active (unpaused)")


def run_text(run_id: str | None, state: Any, ended: Any = None, applied: bool = False,
             skipped: Mapping[str, str] | None = None) -> str:
    """The last run's line: its id, state and end (None: no run yet), then what it did:
    a plan applied, or the first task that skipped and why (``skipped``: the reason by
    task id of each task that ended skipped with one, in the order they ended)."""
    if run_id is None:
        return "none yet"
    ended = ended.strftime("%Y-%m-%d %H:%M:%S UTC") if isinstance(ended, dt.datetime) else ended
    text = f"{run_id}: {getattr(state, 'value', state)}" + (f", ended {ended}" if ended else "")
    if applied:
        return text + "; a plan was applied"
    task, reason = next(iter((skipped or {}).items()), (None, None))
    return text + (f"; skipped at {task}: {reason}" if task else "")


def dag_lines(api: Any, dag_id: str) -> list[tuple[str, str]]:
    """The DAG's line and the last run's, from Airflow's REST API (``api``:
    :class:`rebalance.ops.airflow_client.AirflowClient`)."""
    from rebalance.ops.airflow_client import AirflowError

    try:
        dag = api.get(f"/api/v2/dags/{dag_id}")
    except AirflowError as exc:
        if exc.status == 404:
            return [("dag", dag_text(None))]
        return [("dag", f"unknown: {exc}")]
    lines = [("dag", dag_text(bool(dag.get("is_paused"))))]
    try:
        runs = api.get(f"/api/v2/dags/{dag_id}/dagRuns?order_by=-run_after&limit=1")["dag_runs"]
    except (AirflowError, KeyError) as exc:
        return lines + [("last run", f"unknown: {exc}")]
    if not runs:
        return lines + [("last run", run_text(None, None))]
    run, applied, reasons = runs[0], False, {}
    if run["state"] == "success":
        try:
            tis = api.task_instances(dag_id, run["dag_run_id"])
            applied = tis.get(APPLY_TASK, {}).get("state") == "success"
            reasons = {} if applied else api.skip_reasons(dag_id, run["dag_run_id"], tis)
        except AirflowError:
            pass
    return lines + [("last run", run_text(run["dag_run_id"], run["state"], run.get("end_date"),
                                          applied, reasons))]


def db_lines(dag_id: str) -> tuple[str, str, dict[str, str]]:
    """The DAG's line, the last run's line (:func:`run_text`) and why its tasks skipped
    (task id -> reason), from Airflow's metadata database (in the api-server: the
    Rebalance view). One query for the newest run, one for its tasks that applied or
    ended skipped, with the reason each kept (XCom ``control.errors.SKIP_REASON``)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel as X
    from airflow.utils.session import create_session
    from sqlalchemy import and_, or_, select

    from rebalance.control.errors import SKIP_REASON

    with create_session() as session:
        dag = DagModel.get_dagmodel(dag_id, session=session)
        dag_line = dag_text(None if dag is None else bool(dag.is_paused))
        run = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)
                              .order_by(DagRun.run_after.desc()).limit(1)).first()
        if run is None:
            return dag_line, run_text(None, None), {}
        kept = and_(X.dag_run_id == run.id, X.task_id == TI.task_id,
                    X.map_index == TI.map_index, X.key == SKIP_REASON)
        tis = session.execute(
            select(TI.task_id, TI.state, X.value.label("value")).outerjoin(X, kept)
            .where(TI.dag_id == dag_id, TI.run_id == run.run_id,
                   or_(TI.task_id == APPLY_TASK, TI.state == "skipped"))
            .order_by(TI.end_date)).all()
        applied = any(t.task_id == APPLY_TASK and t.state == "success" for t in tis)
        skipped = {t.task_id: str(X.deserialize_value(t)) for t in tis
                   if t.state == "skipped" and t.value is not None}
        return dag_line, run_text(run.run_id, run.state, run.end_date, applied, skipped), skipped


def service_lines(service: Any, states: dict[str, str],
                  dag_id: str | None = None) -> list[tuple[str, str]]:
    """``make status``'s health lines for a :class:`rebalance.ops.service.Service` whose
    components are in ``states`` (name -> "running ..." / "stopped" / "dead ..."): its
    DAG, its job's newest window and its DAG's last run, for every job of the registry
    (the first's as ``dag``, ``job``, ``last run``; another's prefixed by its name).
    ``dag_id``: the first job's DAG (default: the registry's)."""
    from rebalance.ops.airflow_client import AirflowClient, AirflowError

    api, why = None, "unknown: the api-server is not running"
    if states.get("api-server", "").startswith("running"):
        try:
            api = AirflowClient(service.s.api_url, *service.login(), timeout=10)
        except AirflowError as exc:
            why = f"unknown: {exc}"
    out = []
    for i, (component, job) in enumerate(service.s.job_components.items()):
        prefix = "" if i == 0 else f"{job.name} "
        line = ("job", job_line(job.tables_root(service.s.data),
                                states.get(component, "").startswith("running"),
                                service.s.window_seconds))
        if api is None:
            lines = [("dag", why), line]
        else:
            dag, *last = dag_lines(api, dag_id if i == 0 and dag_id else job.dag_id)
            lines = [dag, line, *last]
        out += [(prefix + name, text) for name, text in lines]
    return out
