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

``--first-plan N`` measures something else, the start-up goal (a verified plan within
3 minutes of ``make up``): N times, from a stopped service, ``make up`` on a fresh data
folder and Airflow home of its own (``--fresh-root``, default ``.data/first-plan``:
``run-<i>/data`` and ``run-<i>/airflow``, removed first; the service's own ``.data`` and
``.airflow`` are not touched), timed from the moment ``make up`` starts to each job's
first plan whose status is ``verified`` (every job of the registry: its ``plans`` table,
read through delta-rs every second), with the moments between (``make up`` returned, the
job's first window stored) and every DAG run until then; then ``make down`` and a check
that nothing of it is left.

    make down
    .venv/bin/python include/benchmarks/service_benchmark.py --first-plan 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

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


# ------------------------------------------------------------- --first-plan
def _stored() -> tuple[int, list[dict]]:
    """Windows in ``key_histograms`` and the plans (status, run) stored so far, through
    delta-rs in this process (``REBALANCE_DATA_DIR`` says where)."""
    from rebalance.spark import tables
    from rebalance.spark.plan_store import PlanStore

    windows = 0
    if tables.exists(None, tables.KEY_HISTOGRAMS):
        pdf = tables.read_pandas(None, tables.KEY_HISTOGRAMS, columns=["window_start"])
        windows = 0 if pdf is None else int(pdf["window_start"].nunique())
    try:
        plans = [{"plan_id": r.plan_id, "status": r.status, "run_id": r.run_id}
                 for r in PlanStore(None).plans()]
    except Exception:  # noqa: BLE001 - the table is not created yet
        plans = []
    return windows, plans


def _run_timeline(client: AirflowClient, dag_id: str, t0: float) -> list[str]:
    """Every run of ``dag_id`` so far, oldest first, its moments in seconds after ``t0``."""
    def at(text: str | None) -> str:
        return "-" if not text else f"{_t(text).timestamp() - t0:.0f}"

    got = client.get(f"/api/v2/dags/{dag_id}/dagRuns?order_by=run_after&limit=50")
    lines = []
    for run in got["dag_runs"]:
        tis = client.task_instances(dag_id, run["dag_run_id"])
        ends = ", ".join(f"{t} {tis[t]['state']} at {at(tis[t].get('end_date'))}"
                         for t in ("windows", "detect", "plan", "apply", "verify")
                         if t in tis and tis[t].get("state"))
        reasons = client.skip_reasons(dag_id, run["dag_run_id"], tis)
        lines.append(f"{run['run_type']} run [{run.get('data_interval_start')}, "
                     f"{run.get('data_interval_end')}) created {at(run.get('queued_at'))}, "
                     f"started {at(run.get('start_date'))}: {ends}"
                     + "".join(f"; {t} skipped: {r[:160]}" for t, r in reasons.items()))
    return lines


def _leftovers(root: Path) -> list[str]:
    """Processes whose command line names ``root`` (what ``make down`` must have stopped)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(root) in line and "ps -eo" not in line]


def first_plan(i: int, root: Path, timeout: float) -> dict[str, float | None]:
    """One ``make up`` from a stopped service on a fresh folder: seconds from its start to
    ``make up`` returning, and for each job of the registry to its first window stored and
    its first verified plan."""
    from rebalance.core import registry
    from rebalance.ops.service import Service, Settings

    if root.exists():
        shutil.rmtree(root)
    (root / "data").mkdir(parents=True)
    env = {**os.environ, "REBALANCE_DATA_DIR": str(root / "data"),
           "AIRFLOW_HOME": str(root / "airflow")}
    os.environ.update({k: env[k] for k in ("REBALANCE_DATA_DIR", "AIRFLOW_HOME")})
    log = (root / "make-up.log").open("w")
    jobs = registry.load().jobs
    moments: dict[str, float | None] = {"make up returned": None}
    for job in jobs:
        moments[f"{job.name}: first window"] = moments[f"{job.name}: verified"] = None
    verified: dict[str, dict] = {}
    t0 = time.time()
    proc = subprocess.Popen(["make", "up"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=Path(__file__).resolve().parents[2])

    def follow() -> None:
        for line in proc.stdout:
            log.write(f"{time.time() - t0:7.1f} {line}")
            log.flush()
    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        while time.time() - t0 < timeout and len(verified) < len(jobs):
            if moments["make up returned"] is None and proc.poll() is not None:
                moments["make up returned"] = time.time() - t0
                if proc.returncode != 0:
                    raise SystemExit(f"run {i}: make up failed (exit {proc.returncode}); "
                                     f"see {root / 'make-up.log'}")
            for job in jobs:
                if job.name in verified:
                    continue
                try:
                    with registry.job_scope(job):
                        windows, plans = _stored()
                except Exception:  # noqa: BLE001 - a table being created
                    windows, plans = 0, []
                if windows and moments[f"{job.name}: first window"] is None:
                    moments[f"{job.name}: first window"] = time.time() - t0
                plan = next((p for p in plans if p["status"] == "verified"), None)
                if plan:
                    moments[f"{job.name}: verified"] = time.time() - t0
                    verified[job.name] = plan
            time.sleep(1.0)
        service = Service(Settings())
        client = AirflowClient(service.s.api_url, *service.login())
        print(f"run {i}: " + ", ".join(
            f"{k} {'-' if v is None else f'{v:.0f} s'}" for k, v in moments.items())
            + "".join(f" ({name}: plan {p['plan_id']}, {p['run_id']})"
                      for name, p in verified.items()), flush=True)
        for job in jobs:
            for line in _run_timeline(client, job.dag_id, t0):
                print(f"    {job.dag_id}: {line}", flush=True)
    finally:
        proc.wait()
        reader.join(5)
        subprocess.run(["make", "down"], env=env, stdout=log, stderr=subprocess.STDOUT,
                       cwd=Path(__file__).resolve().parents[2])
        log.close()
        left = _leftovers(root)
        if left:
            print(f"run {i}: still running after make down:\n" + "\n".join(left),
                  file=sys.stderr)
    return moments


def first_plans(runs: int, fresh_root: Path, timeout: float) -> int:
    rows = [first_plan(i + 1, fresh_root / f"run-{i + 1}", timeout) for i in range(runs)]
    print("\n| run | " + " | ".join(f"{k} (s)" for k in rows[0]) + " |")
    print("|---|" + "---|" * len(rows[0]))
    for i, m in enumerate(rows):
        print(f"| {i + 1} | " + " | ".join("-" if v is None else f"{v:.0f}"
                                          for v in m.values()) + " |")
    ok = True
    for key in [k for k in rows[0] if k.endswith(": verified")]:
        done = [m[key] for m in rows if m[key] is not None]
        ok = ok and len(done) == runs
        if not done:
            print(f"{key[:-10]}: no run verified a plan within {timeout:.0f} s", file=sys.stderr)
            continue
        print(f"{key[:-10]}: make up -> first verified plan: median "
              f"{statistics.median(done):.0f} s, worst {max(done):.0f} s ({len(done)} of "
              f"{runs} runs verified one within {timeout:.0f} s)")
    return 0 if ok else 1


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
    p.add_argument("--first-plan", type=int, metavar="N",
                   help="N times: make up from a stopped service on a fresh folder, timed to "
                        "the first verified plan, then make down")
    p.add_argument("--fresh-root", type=Path, default=Path(".data/first-plan"),
                   help="--first-plan: the folder of each run's data and Airflow home")
    args = p.parse_args(argv)
    if args.first_plan:
        return first_plans(args.first_plan, args.fresh_root.resolve(),
                           args.timeout if args.timeout != 600 else 900)

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
