"""Per-task durations of ``rebalance`` DAG runs under the real scheduler, from Airflow's REST API.

    make up                                                   # the service, on its defaults
    .venv/bin/python include/benchmarks/service_benchmark.py --runs 6

Triggers ``--runs`` runs one after another through the REST API (``force``, so every run
plans, and ``apply_mode=dry-run``, so no run changes the live assignment: each goes
``windows -> detect -> plan -> validate -> publish`` and stores a what-if plan), waits for
each, then reads every task instance's start and end and prints, per run, each task's
duration and the span from ``windows``' start to ``publish``'s end; then the median and
the worst of each. ``--existing`` only reads the runs already there (e.g. scheduled ones).

With ``--spark-ui URL`` (the Spark Connect server's UI, off by default: start the service
with ``REBALANCE_SPARK_CONF="spark.ui.enabled=true;spark.ui.port=4050" make up``) it also
counts the Spark jobs that server ran between each run's ``windows`` start and its
``publish`` end (its REST API, ``/api/v1/applications/<id>/jobs``).

Targets: windows -> publish <= 10 s end to end, no task above 5 s, at most 20
Spark jobs per run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import urllib.request

from rebalance.ops.airflow_client import AirflowClient

TASKS = ("windows", "detect", "plan", "validate", "publish")


def _t(text: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def durations(client: AirflowClient, dag_id: str, run_id: str) -> dict[str, float] | None:
    by_task = client.task_instances(dag_id, run_id)
    if any(by_task.get(name, {}).get("state") != "success" for name in TASKS):
        return None
    out = {name: (_t(by_task[name]["end_date"]) - _t(by_task[name]["start_date"])).total_seconds()
           for name in TASKS}
    out["windows->publish"] = (_t(by_task["publish"]["end_date"])
                               - _t(by_task["windows"]["start_date"])).total_seconds()
    return out


def spark_jobs(ui: str, start: dt.datetime, end: dt.datetime) -> int:
    """Jobs the Spark application behind ``ui`` submitted within [start, end]."""
    def get(path: str):
        with urllib.request.urlopen(ui.rstrip("/") + path, timeout=30) as r:
            return json.load(r)

    app = get("/api/v1/applications")[0]["id"]
    times = [_t(j["submissionTime"].replace("GMT", "+00:00"))
             for j in get(f"/api/v1/applications/{app}/jobs") if j.get("submissionTime")]
    return sum(1 for t in times if start <= t <= end)


def span(client: AirflowClient, dag_id: str, run_id: str) -> tuple[dt.datetime, dt.datetime]:
    by_task = client.task_instances(dag_id, run_id)
    return _t(by_task["windows"]["start_date"]), _t(by_task["publish"]["end_date"])


def trigger_and_wait(client: AirflowClient, dag_id: str, conf: dict, timeout: float) -> str:
    run_id = client.trigger(dag_id, conf)["dag_run_id"]
    try:
        client.wait(dag_id, run_id, timeout, every=2)
    except TimeoutError as exc:
        raise SystemExit(str(exc)) from None
    return run_id


def main(argv: list[str] | None = None) -> int:
    from rebalance.ops.service import Service

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--existing", action="store_true",
                   help="read the latest runs that reached publish instead of triggering")
    p.add_argument("--method", default="mixed")
    p.add_argument("--dag-id", default="rebalance")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--spark-ui", help="the Spark Connect server's UI, e.g. http://127.0.0.1:4050")
    args = p.parse_args(argv)

    service = Service()
    user, password = service.login()
    if password is None:
        print("error: no Airflow password found: is the service up (make up)?", file=sys.stderr)
        return 2
    client = AirflowClient(service.s.api_url, user, password)
    rows: list[tuple[str, dict[str, float]]] = []
    if args.existing:
        runs = client.get(f"/api/v2/dags/{args.dag_id}/dagRuns?order_by=-run_after&limit=100")
        for run in runs["dag_runs"]:
            d = durations(client, args.dag_id, run["dag_run_id"])
            if d is not None:
                rows.append((run["dag_run_id"], d))
            if len(rows) == args.runs:
                break
    else:
        conf = {"force": True, "apply_mode": "dry-run", "method": args.method}
        for i in range(args.runs):
            run_id = trigger_and_wait(client, args.dag_id, conf, args.timeout)
            d = durations(client, args.dag_id, run_id)
            if d is None:
                print(f"run {run_id} did not reach publish (skipped or failed)", file=sys.stderr)
                continue
            if args.spark_ui:
                d["spark jobs"] = spark_jobs(args.spark_ui, *span(client, args.dag_id, run_id))
            rows.append((run_id, d))
            print(f"run {i + 1}/{args.runs} {run_id}: " + ", ".join(
                f"{k} {v:g}" if k == "spark jobs" else f"{k} {v:.1f} s" for k, v in d.items()),
                flush=True)
    if not rows:
        print("error: no run reached publish", file=sys.stderr)
        return 1
    cols = [*TASKS, "windows->publish", *(["spark jobs"] if args.spark_ui else [])]
    print("\n| run | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for run_id, d in rows:
        print(f"| {run_id[:32]} | " + " | ".join(f"{d[c]:.1f}" for c in cols) + " |")
    tasks = [d[t] for _, d in rows for t in TASKS]
    spans = [d["windows->publish"] for _, d in rows]
    print(f"\n{len(rows)} runs. Per task: median {statistics.median(tasks):.1f} s, worst "
          f"{max(tasks):.1f} s (target: none above 5 s). windows -> publish: median "
          f"{statistics.median(spans):.1f} s, worst {max(spans):.1f} s (target <= 10 s).")
    if args.spark_ui:
        jobs = [d["spark jobs"] for _, d in rows]
        print(f"Spark jobs per run: median {statistics.median(jobs):g}, worst {max(jobs):g} "
              "(target <= 20)")
    for t in TASKS:
        values = [d[t] for _, d in rows]
        print(f"  {t:9s} median {statistics.median(values):5.1f} s  worst {max(values):5.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
