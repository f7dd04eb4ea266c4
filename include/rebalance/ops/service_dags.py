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

The run the scheduler creates when the DAG first appears (its interval ends before the job
stored two windows) would hold that first run back (``max_active_runs=1``) until the job's
first window after it let it skip. So the first run's interval begins at that run's if
earlier, and ``up`` marks that run's ``windows`` and every task after skipped at once, with
a note saying why (:func:`skip_held_back`).
"""

from __future__ import annotations

import datetime as dt
import time

from rebalance.control.params import RunParams
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


def first_interval(generator_started: float, window_seconds: int, now: dt.datetime,
                   min_windows: int = RunParams.min_windows) -> tuple[str, str]:
    """The first run's data interval, ISO 8601 in UTC: from the start of the window in which
    the generator started (epoch-aligned, as the job's windows are) to ``now``, or to the
    end of the ``min_windows``-th window from there if that is later (a run plans on the
    windows that start in its interval: one triggered a few seconds after the generator
    started would otherwise hold one window, too few)."""
    begin = generator_started - generator_started % window_seconds
    end = max(now, dt.datetime.fromtimestamp(begin + min_windows * window_seconds,
                                             dt.timezone.utc))
    return (dt.datetime.fromtimestamp(begin, dt.timezone.utc).isoformat(), end.isoformat())


def trigger_first_run(service, generator_started: float, dag_id: str) -> str | None:
    """Trigger ``dag_id``'s first run (the run id) on the windows since
    ``generator_started`` (epoch seconds), or say in one line why not (None).

    A scheduled run already waiting (the one the scheduler creates when the DAG first
    appears) would hold the first run back until it skipped at the job's first window
    after its interval (``max_active_runs=1``). The first run's interval starts early
    enough to hold every such run's interval, and those runs are marked skipped from
    ``windows`` on, with a note (:func:`skip_held_back`): the first run plans on all
    their windows."""
    s = service.s
    if s.schedule.strip().lower() in ("none", "manual"):
        return None
    now = dt.datetime.now(dt.timezone.utc)
    interval = first_interval(generator_started, s.window_seconds, now)
    deadline = time.monotonic() + PARSE_SECONDS
    while True:
        try:
            api = AirflowClient(s.api_url, *service.login(), timeout=30)
            waiting = _waiting_runs(api, dag_id, dt.datetime.fromisoformat(interval[1]))
            begin = min([dt.datetime.fromisoformat(interval[0]),
                         *[start for start, _ in waiting.values()]])
            interval = (begin.isoformat(), interval[1])
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
        skip_held_back(service, api, dag_id, (begin, dt.datetime.fromisoformat(interval[1])),
                       run["dag_run_id"])
        return run["dag_run_id"]


#: How long ``up`` looks for a scheduled run holding the first run back.
HELD_BACK_SECONDS = 30.0
#: States of a ``windows`` task that has not found its windows yet (None: not started).
WAITING = (None, "scheduled", "queued", "running", "deferred", "up_for_retry",
           "up_for_reschedule")
#: The note on the ``windows`` task of a run :func:`skip_held_back` skipped.
SKIP_NOTE = ("make up: skipped so that it does not hold back the first run, {first}, whose "
             "interval holds this run's ({start} to {end}): that run plans on its windows")


def _waiting_runs(api: AirflowClient, dag_id: str, before: dt.datetime
                  ) -> dict[str, tuple[dt.datetime, dt.datetime]]:
    """The scheduled runs of ``dag_id`` queued or running whose data interval ended by
    ``before``: run id -> (interval start, interval end)."""
    found = {}
    for run in api.unfinished_runs(dag_id, "scheduled"):
        start, end = run.get("data_interval_start"), run.get("data_interval_end")
        if start is None or end is None:
            continue
        end_at = dt.datetime.fromisoformat(end.replace("Z", "+00:00"))
        if end_at <= before:
            found[run["dag_run_id"]] = (dt.datetime.fromisoformat(start.replace("Z", "+00:00")),
                                        end_at)
    return found


def skip_held_back(service, api: AirflowClient, dag_id: str,
                   interval: tuple[dt.datetime, dt.datetime], first_run_id: str) -> list[str]:
    """Mark skipped, from ``windows`` on, every scheduled run of ``dag_id`` not finished
    whose data interval lies within ``interval`` (the first run's) and whose ``windows``
    task has not found its windows yet; return their run ids.
    Looks again until the first run ``first_run_id`` left the queue, at most
    :data:`HELD_BACK_SECONDS` (the scheduler may create such a run just after the
    trigger)."""
    skipped: list[str] = []
    deadline = time.monotonic() + HELD_BACK_SECONDS
    while True:
        try:
            for run_id, (start, end) in _waiting_runs(api, dag_id, interval[1]).items():
                if run_id in skipped or start < interval[0]:
                    continue
                if api.task_instance(dag_id, run_id, "windows")["state"] not in WAITING:
                    continue   # past its windows: the run goes on as it is
                api.skip_from(dag_id, run_id, "windows", SKIP_NOTE.format(
                    first=first_run_id, start=start.isoformat(), end=end.isoformat()))
                skipped.append(run_id)
                service.out(f"{dag_id:14s} run {run_id} skipped: the first run plans on its "
                            "windows")
            if api.run(dag_id, first_run_id)["state"] != "queued":
                return skipped
        except AirflowError as exc:
            service.out(f"{dag_id:14s} could not look for runs holding the first run back "
                        f"({exc}); they skip at the job's first window")
            return skipped
        if time.monotonic() > deadline:
            return skipped
        time.sleep(2)

