"""Trigger and follow rebalance runs on the running service through Airflow's REST API.

``rebalance trigger`` is the command-line twin of the UI's "Trigger DAG" form: it checks
the run params locally (the same :class:`~rebalance.control.params.RunParams` the DAG
uses), posts ``/api/v2/dags/{dag}/dagRuns`` with them as the run's ``conf``, and with
``--wait`` follows the run to its end and prints its tasks and the plan it stored::

    .venv/bin/rebalance trigger --set force=true --set method=greedy --wait

:class:`AirflowClient` is the small REST client behind it (the standard library only:
no Airflow import), also used by the service benchmark and the service tests. It logs in
with ``POST /auth/token`` (Airflow 3's token endpoint) and sends the token as a bearer.
Credentials: ``--user`` / ``--password``, else ``REBALANCE_AIRFLOW_USER`` /
``REBALANCE_AIRFLOW_PASSWORD``, else the ``admin`` password Airflow generated into the
service's ``AIRFLOW_HOME`` (what ``make up`` prints).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

#: Run states after which nothing changes (Airflow 3 ``DagRunState``).
FINISHED = ("success", "failed")
SKIPPED = "skipped: "  # how control.errors.RunSkipped logs its reason in the task's log


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
                note: str | None = None) -> dict:
        """Create a manual run; Airflow's answer (``dag_run_id``, ``state``, ...).

        ``logical_date`` None: a run without one (Airflow 3), its data interval "now".
        """
        body: dict[str, Any] = {"logical_date": logical_date, "conf": dict(conf)}
        if run_id:
            body["dag_run_id"] = run_id
        if data_interval:
            body["data_interval_start"], body["data_interval_end"] = data_interval
        if note:
            body["note"] = note
        return self.post(f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns", body)

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.get(_run_path(dag_id, run_id))

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

    def plans(self, limit: int = 200) -> list[dict]:
        """The plan history (newest first) from the Rebalance view's JSON."""
        return self.get(f"/rebalance/api/plans?limit={int(limit)}")


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


# ----------------------------------------------------------------------- params
def parse_settings(pairs: list[str], conf_json: str | None) -> dict[str, Any]:
    """The run's conf from ``--conf JSON`` and ``--set name=value`` (values are JSON when
    they parse as JSON, else text: ``force=true``, ``theta=0.2``, ``method=greedy``,
    ``max_table=null``), checked as the DAG checks them. Raises ``ValueError``."""
    from .control.params import PARAMS_SCHEMA, RunParams

    conf: dict[str, Any] = {}
    if conf_json:
        try:
            conf = json.loads(conf_json)
        except RecursionError:
            raise ValueError("--conf is nested too deeply (no run parameter nests)") from None
        except ValueError as exc:
            raise ValueError(f"--conf is not JSON: {exc}") from None
        if not isinstance(conf, dict):
            raise ValueError(f"--conf must be a JSON object, got {type(conf).__name__}")
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--set {pair!r}: expected name=value")
        try:
            value = json.loads(text)
        except RecursionError:
            raise ValueError(f"--set {name.strip()}: value nested too deeply") from None
        except ValueError:
            value = text
        conf[name.strip()] = value
    unknown = sorted(set(conf) - set(PARAMS_SCHEMA))
    if unknown:
        raise ValueError(f"unknown run param(s) {', '.join(map(repr, unknown))}; the DAG's "
                         f"params are: {', '.join(PARAMS_SCHEMA)}")
    for name, value in conf.items():
        problem = _type_problem(name, value)
        if problem:
            raise ValueError(problem)
    RunParams.parse(conf)  # ranges and combinations (InvalidParams is a ValueError)
    return conf


def _type_problem(name: str, value: Any) -> str | None:
    from .control.params import PARAMS_SCHEMA

    spec = PARAMS_SCHEMA[name]
    types = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
    ok = {
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "null": value is None,
    }
    if not any(ok[t] for t in types):
        return f"run param {name!r} must be {' or '.join(types)}, got {value!r}"
    if "enum" in spec and value not in spec["enum"]:
        return f"run param {name!r} must be one of {', '.join(spec['enum'])}, got {value!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = spec.get("minimum"), spec.get("maximum")
        if (low is not None and value < low) or (high is not None and value > high) or (
                "exclusiveMinimum" in spec and value <= spec["exclusiveMinimum"]):
            return f"run param {name!r} is out of range: {value!r}"
    return None


# -------------------------------------------------------------------------- CLI
# (the params module imports pandas: it is imported when the command runs, not when the
# ``rebalance`` parser is built)
def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser(
        "trigger", help="trigger a rebalance run on the running service (Airflow REST API)",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--set", dest="pairs", action="append", default=[], metavar="NAME=VALUE",
                   help="a run param of the DAG's Params form (repeatable), e.g. --set "
                        "force=true --set theta=0.2; an unknown name is refused with the list")
    p.add_argument("--conf", help="the run's params as one JSON object (--set wins)")
    p.add_argument("--wait", action="store_true",
                   help="follow the run to its end; exit 0 on success, 1 on failure")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="--wait: seconds to wait (default 1800)")
    p.add_argument("--dag", help="DAG id (default: the rebalance DAG)")
    p.add_argument("--url", help="Airflow's api-server (default: the service's, "
                                 "http://127.0.0.1:$REBALANCE_API_PORT)")
    p.add_argument("--user", help="Airflow user (default admin, or REBALANCE_AIRFLOW_USER)")
    p.add_argument("--password", help="its password (default REBALANCE_AIRFLOW_PASSWORD, else "
                                      "the one Airflow generated for the service)")
    p.set_defaults(func=_run)


def _client(args: argparse.Namespace) -> AirflowClient:
    from .service import Service, Settings

    service = Service(Settings())
    user = args.user or os.environ.get("REBALANCE_AIRFLOW_USER")
    password = args.password or os.environ.get("REBALANCE_AIRFLOW_PASSWORD")
    if not user or not password:
        default_user, generated = service.login()
        user = user or default_user
        password = password or (generated if user == default_user else None)
    return AirflowClient(args.url or service.s.api_url, user, password)


def _run(args: argparse.Namespace) -> int:
    from .cli import UserError
    from .control.params import DAG_ID

    args.dag = args.dag or DAG_ID
    if not 0 < args.timeout < float("inf"):  # NaN fails too
        raise UserError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    try:
        conf = parse_settings(args.pairs, args.conf)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    try:
        client = _client(args)
        run = client.trigger(args.dag, conf, note="triggered with `rebalance trigger`")
    except AirflowError as exc:
        raise UserError(str(exc)) from None
    run_id = run["dag_run_id"]
    print(f"triggered {args.dag} run {run_id} (conf {json.dumps(conf, sort_keys=True)})")
    print(f"  {client.base}/dags/{quote(args.dag, safe='')}/runs/{quote(run_id, safe='')}")
    if not args.wait:
        return 0
    try:
        run = client.wait(args.dag, run_id, args.timeout)
        tis = client.task_instances(args.dag, run_id)
        skipped = client.skip_reasons(args.dag, run_id, tis)
        plans = [p for p in (client.plans() if args.dag == DAG_ID else [])
                 if p.get("run_id") == run_id]
    except (TimeoutError, AirflowError) as exc:  # the run goes on: only following it stopped
        print(f"rebalance trigger: {exc}", file=sys.stderr)
        return 1
    for ti in sorted(tis.values(),  # in the order they ran
                     key=lambda ti: (ti.get("start_date") or "~", ti["task_id"])):
        why = skipped.get(ti["task_id"])
        print(f"  {ti['task_id']:20s} {ti['state']}" + (f": {why}" if why else ""))
    if args.dag == DAG_ID and not plans:
        print("no plan stored by this run" + ("" if skipped else
                                               " (the skipped task's log says why)"))
    for plan in plans:
        print(f"plan {plan['plan_id']}: {plan['status']}, imbalance "
              f"{_fmt(plan.get('imbalance_before'))} -> {_fmt(plan.get('predicted_imbalance'))}"
              f" predicted, {_fmt(plan.get('realised_imbalance'))} realised; moves "
              f"{plan.get('moved_keys')} keys; assignment version "
              f"{plan.get('assignment_version')}")
    print(f"run {run_id}: {run['state']}")
    return 0 if run["state"] == "success" else 1


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "-"
