"""What ``make up`` does with the service's DAGs once Airflow runs: :func:`unpause` them,
and :func:`trigger_first_run` of ``rebalance`` on the windows of the job it started.

Left to the schedule, the first plan waits for the schedule's grid: the run created when
the DAG first appears covers an interval that ended before the job started (nothing to
plan on), and the first run whose interval holds ``min_windows`` of the job's windows
comes one or two intervals after the job's start. So when ``up`` starts the job, it
triggers one run whose data interval runs from the window in which the generator started
(no event of this start is older) to now. Its ``windows`` task waits, as a scheduled
run's does (``REBALANCE_WINDOWS_WAIT_SECONDS``), for ``min_windows`` of those windows;
detect, the backtest, the gate, apply and verify are the same as for any run, on the
DAG's default params. Not with a manual schedule (``none``): the service then runs only
what a person triggers.
"""

from __future__ import annotations

import datetime as dt
import time

from rebalance.ops.airflow_client import AirflowClient, AirflowError

#: How long ``up`` waits for the DAG processor to register a job's DAG (HTTP 404 until then).
PARSE_SECONDS = 120.0


def unpause(service, dag_ids) -> None:
    """The service's DAGs (``dag_ids``: ``Settings.dag_ids``) run
    from ``up`` on.
    A new DAG is created unpaused (``dags_are_paused_at_creation`` False), but one
    registered earlier, paused (Airflow's default: ``make demo``, ``airflow dags test``),
    keeps its flag in Airflow's database: unpause it, and say so."""
    api = None
    for dag_id in dag_ids:
        try:
            api = api or AirflowClient(service.s.api_url, *service.login(), timeout=30)
            if api.get(f"/api/v2/dags/{dag_id}")["is_paused"]:
                api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
                service.out(f"{dag_id:14s} unpaused (it was registered paused earlier)")
        except AirflowError as exc:
            if exc.status != 404:  # 404: not parsed yet, it will be created unpaused
                service.out(f"{dag_id:14s} could not be unpaused: {exc}; unpause it in the UI")


def first_interval(generator_started: float, window_seconds: int,
                   now: dt.datetime) -> tuple[str, str]:
    """The first run's data interval: from the start of the window in which the generator
    started (epoch-aligned, as the job's windows are) to ``now``, ISO 8601 in UTC."""
    begin = generator_started - generator_started % window_seconds
    return (dt.datetime.fromtimestamp(begin, dt.timezone.utc).isoformat(), now.isoformat())


def trigger_first_run(service, generator_started: float, dag_id: str) -> str | None:
    """Trigger ``dag_id``'s first run (the run id) on the windows since
    ``generator_started`` (epoch seconds), or say in one line why not (None)."""
    s = service.s
    if s.schedule.strip().lower() in ("none", "manual"):
        return None
    now = dt.datetime.now(dt.timezone.utc)
    interval = first_interval(generator_started, s.window_seconds, now)
    deadline = time.monotonic() + PARSE_SECONDS
    while True:
        try:
            api = AirflowClient(s.api_url, *service.login(), timeout=30)
            run = api.trigger(dag_id, {}, run_id=f"manual__first__{now.isoformat()}",
                              logical_date=now.isoformat(), data_interval=interval,
                              note="make up: the first run, on the windows of the job it started")
        except AirflowError as exc:
            if exc.status == 404 and time.monotonic() < deadline:  # not parsed yet
                time.sleep(2)
                continue
            service.out(f"{dag_id:14s} no first run triggered ({exc}); the schedule runs it")
            return None
        service.out(f"{dag_id:14s} first run {run['dag_run_id']} triggered on the job's "
                    f"windows since {interval[0]}")
        return run["dag_run_id"]
