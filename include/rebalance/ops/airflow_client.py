"""Airflow's REST API (``/api/v2``) and the Rebalance view's JSON, as one user.

:class:`AirflowClient` is a small REST client (the standard library only: no Airflow
import) behind ``rebalance trigger`` (:mod:`rebalance.cli.trigger`), ``make up``'s
unpausing of the DAG, the service benchmark and the service tests. It logs in with
``POST /auth/token`` (Airflow 3's token endpoint) and sends the token as a bearer.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

#: Run states after which nothing changes (Airflow 3 ``DagRunState``).
FINISHED = ("success", "failed")
SKIPPED = "skipped: "  # how control.errors.RunSkipped logs its reason in the task's log
#: Answers after which a new run is asked for again (its run id makes that safe): the
#: api-server's own failures (on its SQLite home, "database is locked" while another
#: process holds the write lock is one) and no answer at all.
RETRIED = (None, 500, 502, 503, 504)
#: Seconds before each further attempt to create a run.
TRIGGER_BACKOFF = (1.0, 3.0, 9.0)


class AirflowError(RuntimeError):
    """Airflow refused a request or cannot be reached; ``status`` is the HTTP status
    (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AirflowClient:
    """Airflow 3's REST API (``/api/v2``) and the Rebalance view's JSON, as one user."""

    def __init__(self, base_url: str, user: str, password: str | None,
                 timeout: float = 120.0) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        if not password:
            raise AirflowError(f"no password for Airflow user {user!r}: pass --password or set "
                               "REBALANCE_AIRFLOW_PASSWORD (is the service up? `make up`)")
        self.token = self.call("POST", "/auth/token",
                               {"username": user, "password": password}, auth=False)["access_token"]

    def call(self, method: str, path: str, body: Any = None, auth: bool = True) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            raise AirflowError(f"{method} {path}: HTTP {exc.code}: {_detail(exc)}",
                               exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AirflowError(f"{method} {path}: Airflow at {self.base} does not answer "
                               f"({reason})") from None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.call("POST", path, body)

    # ------------------------------------------------------------------ DAG runs
    def trigger(self, dag_id: str, conf: Mapping[str, Any], run_id: str | None = None,
                logical_date: str | None = None, data_interval: tuple[str, str] | None = None,
                note: str | None = None,
                backoff: Sequence[float] = TRIGGER_BACKOFF) -> dict:
        """Create a manual run; Airflow's answer (``dag_run_id``, ``state``, ...).

        ``logical_date`` None: a run without one (Airflow 3), its data interval "now".
        ``run_id`` None: ``manual__<now>``, as Airflow names a manual run. The run id is
        chosen here so that asking again is safe: an answer in :data:`RETRIED` is followed
        by another attempt after each delay of ``backoff``, and if an earlier attempt did
        create the run (HTTP 409 on a retry), that run is returned, so a run is created
        once whatever the api-server answered.
        """
        run_id = run_id or f"manual__{dt.datetime.now(dt.timezone.utc).isoformat()}"
        body: dict[str, Any] = {"dag_run_id": run_id, "logical_date": logical_date,
                                "conf": dict(conf)}
        if data_interval:
            body["data_interval_start"], body["data_interval_end"] = data_interval
        if note:
            body["note"] = note
        path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns"
        delays, retry = iter(backoff), False
        while True:
            try:
                return self.post(path, body)
            except AirflowError as exc:
                if retry and exc.status == 409:  # an earlier attempt created it
                    return self.run(dag_id, run_id)
                delay = next(delays, None)
                if exc.status not in RETRIED or delay is None:
                    raise
            time.sleep(delay)
            retry = True

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.get(_run_path(dag_id, run_id))

    def unfinished_runs(self, dag_id: str, run_type: str, limit: int = 20) -> list[dict]:
        """The runs of ``dag_id`` of ``run_type`` (``scheduled``, ``manual``, ...) that are
        queued or running."""
        return self.get(f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns?run_type="
                        f"{quote(run_type, safe='')}&state=queued&state=running"
                        f"&limit={int(limit)}")["dag_runs"]

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.get(_task_path(dag_id, run_id, task_id))

    def skip_from(self, dag_id: str, run_id: str, task_id: str, note: str) -> Any:
        """Mark the task and every task downstream of it ``skipped``, with ``note`` on it."""
        return self.call("PATCH", _task_path(dag_id, run_id, task_id),
                         {"new_state": "skipped", "include_downstream": True, "note": note})

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        """The run's task instances by task id (mapped tasks: the last map index)."""
        got = self.get(_run_path(dag_id, run_id) + "/taskInstances")
        return {t["task_id"]: t for t in got["task_instances"]}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> Any:
        return self.get(f"{_task_path(dag_id, run_id, task_id)}/logs/{try_number}").get("content")

    def skip_reasons(self, dag_id: str, run_id: str,
                     tis: Mapping[str, dict]) -> dict[str, str]:
        """Why each skipped task that ran was skipped, by task id (``tis``: the run's
        :meth:`task_instances`): the reason a task of the rebalance DAG logs when it raises
        ``RunSkipped`` ("too few events: ...", "balanced: ..."). Tasks skipped without
        running (downstream of a skip) have no reason."""
        reasons = {}
        for task_id, ti in tis.items():
            if ti["state"] != "skipped" or not ti.get("try_number"):
                continue
            try:
                content = self.task_log(dag_id, run_id, task_id, ti["try_number"])
            except AirflowError:  # no log kept for it: no reason to show
                continue
            said = [e["event"][len(SKIPPED):] for e in content or []
                    if isinstance(e, dict) and str(e.get("event", "")).startswith(SKIPPED)]
            if said:  # the last one skipped it (a task may wait out an earlier reason)
                reasons[task_id] = said[-1]
        return reasons

    def hitl_detail(self, dag_id: str, run_id: str, task_id: str) -> dict:
        """A human-in-the-loop task's request and its answer (``chosen_options``,
        ``responded_by_user``) once a person answered."""
        return self.get(f"{_task_path(dag_id, run_id, task_id)}/-1/hitlDetails")

    def wait(self, dag_id: str, run_id: str, timeout: float, every: float = 3.0) -> dict:
        """Poll the run until it is finished; a busy api-server (no answer) is asked again.
        Raises :class:`TimeoutError` with the tasks' states after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                run = self.run(dag_id, run_id)
                if run["state"] in FINISHED:
                    return run
            except AirflowError as exc:
                if exc.status is not None:
                    raise
            if time.monotonic() >= deadline:
                states = {k: v["state"] for k, v in self.task_instances(dag_id, run_id).items()}
                raise TimeoutError(f"run {run_id} not finished after {timeout:.0f} s: {states}")
            time.sleep(every)

    def plans(self, limit: int = 200, job: str | None = None) -> list[dict]:
        """The plan history (newest first) of ``job`` (None: the registry's first) from the
        Rebalance view's JSON."""
        also = "" if job is None else f"&job={quote(job, safe='')}"
        return self.get(f"/rebalance/api/plans?limit={int(limit)}{also}")


def _run_path(dag_id: str, run_id: str) -> str:
    return f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}"


def _task_path(dag_id: str, run_id: str, task_id: str) -> str:
    return f"{_run_path(dag_id, run_id)}/taskInstances/{quote(task_id, safe='')}"


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read().decode(errors="replace")
    except OSError:
        return exc.reason
    try:
        detail = json.loads(body).get("detail", body)
    except (ValueError, AttributeError):
        detail = body
    return (json.dumps(detail) if not isinstance(detail, str) else detail)[:500]
