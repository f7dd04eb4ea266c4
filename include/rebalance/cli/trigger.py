"""``rebalance trigger``: trigger and follow rebalance runs on the running service through
Airflow's REST API.

The command-line twin of the UI's "Trigger DAG" form: it checks the run params locally
(the same :class:`~rebalance.control.params.RunParams` the DAG uses), posts
``/api/v2/dags/{dag}/dagRuns`` with them as the run's ``conf``, and with ``--wait``
follows the run to its end and prints its tasks and the plan it stored::

    .venv/bin/rebalance trigger --set force=true --set method=greedy --wait

Credentials: ``--user`` / ``--password``, else ``REBALANCE_AIRFLOW_USER`` /
``REBALANCE_AIRFLOW_PASSWORD``, else the ``admin`` password Airflow generated into the
service's ``AIRFLOW_HOME`` (what ``make up`` prints).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any
from urllib.parse import quote

from rebalance.ops.airflow_client import AirflowClient, AirflowError


# ----------------------------------------------------------------------- params
def parse_settings(pairs: list[str], conf_json: str | None) -> dict[str, Any]:
    """The run's conf from ``--conf JSON`` and ``--set name=value`` (values are JSON when
    they parse as JSON, else text: ``force=true``, ``theta=0.2``, ``method=greedy``,
    ``max_table=null``), checked as the DAG checks them. Raises ``ValueError``."""
    from rebalance.control.params import PARAMS_SCHEMA, RunParams

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
    from rebalance.control.params import PARAMS_SCHEMA

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
    from rebalance.ops.service import Service, Settings

    service = Service(Settings())
    user = args.user or os.environ.get("REBALANCE_AIRFLOW_USER")
    password = args.password or os.environ.get("REBALANCE_AIRFLOW_PASSWORD")
    if not user or not password:
        default_user, generated = service.login()
        user = user or default_user
        password = password or (generated if user == default_user else None)
    return AirflowClient(args.url or service.s.api_url, user, password)


def _run(args: argparse.Namespace) -> int:
    from rebalance.cli import UserError
    from rebalance.control.params import DAG_ID
    from rebalance.core import registry

    job = registry.current_job()        # rebalance --job NAME trigger: that job's DAG
    own_dag = job.dag_id if job is not None else DAG_ID
    args.dag = args.dag or own_dag
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
        plans = [p for p in (client.plans(job=job and job.name) if args.dag == own_dag
                             else [])
                 if p.get("run_id") == run_id]
    except (TimeoutError, AirflowError) as exc:  # the run goes on: only following it stopped
        print(f"rebalance trigger: {exc}", file=sys.stderr)
        return 1
    for ti in sorted(tis.values(),  # in the order they ran
                     key=lambda ti: (ti.get("start_date") or "~", ti["task_id"])):
        why = skipped.get(ti["task_id"])
        print(f"  {ti['task_id']:20s} {ti['state']}" + (f": {why}" if why else ""))
    if args.dag == own_dag and not plans:
        print("no plan stored by this run" + ("" if skipped else
                                               " (the skipped task's log says why)"))
    for plan in plans:
        print(plan_line(plan))
    print(f"run {run_id}: {run['state']}")
    return 0 if run["state"] == "success" else 1


def plan_line(plan: dict[str, Any]) -> str:
    """The plan a run stored, in one line (a row of ``/rebalance/api/plans``); a value the
    plan does not have (not realised yet, not published) is said in words."""
    moved, version = plan.get("moved_keys"), plan.get("assignment_version")
    where = (f"assignment version {version}" if version is not None
             else "no assignment version (not applied)")
    return (f"plan {plan['plan_id']}: {plan['status']}, imbalance "
            f"{_fmt(plan.get('imbalance_before'))} -> {_fmt(plan.get('predicted_imbalance'))}"
            f" predicted, {_fmt(plan.get('realised_imbalance'))} realised; moves "
            f"{'-' if moved is None else moved} keys; {where}")


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "-"
