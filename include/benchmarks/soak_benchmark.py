"""Soak: the service on its defaults, unattended, then a crash of every process and a restart.

    .venv/bin/python include/benchmarks/soak_benchmark.py --minutes 60

Starts the whole service (``rebalance service up``: Spark Connect, Airflow's api-server,
scheduler, DAG processor and triggerer, the generator and the keyed job) on its default
settings (20-s windows, a run every two minutes, the generator re-skewing its hot keys
every ten minutes), in a data directory and an Airflow home of its own (a new temporary
folder unless ``--data`` / ``--airflow-home`` are given), so it neither reads nor changes
``make up``'s. Then, every ``--sample-seconds``:

* the memory of each component: the proportional set size (PSS, resident memory with
  each shared page split among its sharers) of its whole process tree, summed (the job's
  driver with its JVM and Python workers, the scheduler with its forked workers, ...);
* the DAG runs by state and the plans by status (Airflow's REST API and the Rebalance
  view's JSON), and the age of the job's newest window.

After ``--minutes``: every process of the service is killed with SIGKILL (a crashed
machine: the pid records stay behind, stale), the service is started again, and the
benchmark waits for the job to write a window newer than before the crash and for a
scheduled run to end successfully, then stops it all (``down``) and checks nothing is
left running.

Printed at the end, per component: PSS at the first sample after ``--warm-up-minutes``,
its minimum, maximum and last, the growth from the mean of the first five samples after
the warm-up to the mean of the last five, and the noise (the standard deviation of the
samples after the warm-up, around their least-squares line); the growth is "flat" when
it is at most three times that noise or 5 % of the first figure. Then the runs and plans,
and the restart's figures. Exit status 1 when a component grew, no plan was verified, a
run failed other than by a diverged plan (whose ``verify`` fails on purpose), or the
service did not resume.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

from rebalance.ops import health, processes
from rebalance.ops.airflow_client import AirflowClient, AirflowError
from rebalance.ops.service import Service, Settings, alive

DAG = "rebalance"


def tree_pss(pid: int) -> int:
    """Proportional resident bytes (PSS: each shared page split among the processes that
    share it) of a process and all its descendants, 0 once it is gone. RSS would count
    the pages the scheduler's forked workers share with it once per worker: about 9.6 GiB
    for a scheduler whose PSS is a tenth of that."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            pass
    return total


def dag_runs(client: AirflowClient) -> list[dict]:
    return client.get(f"/api/v2/dags/{DAG}/dagRuns?limit=1000")["dag_runs"]


def run_states(client: AirflowClient) -> dict[str, int]:
    return dict(Counter(run["state"] for run in dag_runs(client)))


def plan_statuses(client: AirflowClient) -> dict[str, int]:
    return dict(Counter(plan["status"] for plan in client.plans(limit=1000)))


def newest_window(service: Service) -> dt.datetime | None:
    """The start of the newest window the job wrote (from the Delta log's statistics)."""
    return health.newest_window(service.s.data / "tables" / "key_histograms")[0]


def newest_window_age(service: Service) -> float | None:
    newest = newest_window(service)
    return None if newest is None else round(time.time() - newest.timestamp(), 1)


def growth(samples: list[float]) -> tuple[float, float]:
    """(mean of the last five - mean of the first five, noise): the noise is the standard
    deviation of the samples around their least-squares line."""
    n = len(samples)
    head, tail = samples[:5], samples[-5:]
    xs = list(range(n))
    if n < 3:
        return tail[-1] - head[0], 0.0
    slope, intercept = statistics.linear_regression(xs, samples)
    residuals = [y - (slope * x + intercept) for x, y in zip(xs, samples)]
    return statistics.fmean(tail) - statistics.fmean(head), statistics.pstdev(residuals)


def crash(service: Service) -> list[str]:
    """SIGKILL every recorded process tree and group, as a power cut would; the records
    stay behind."""
    killed = []
    for name, rec in service.records().items():
        if not alive(rec):
            continue
        tree = [rec.pid, *processes.descendants(rec.pid), *processes.group_members(rec.pid)]
        processes.send(tree, signal.SIGKILL)
        processes.wait_gone(tree, 10.0)
        killed.append(name)
    return killed


def wait_for(what: str, check, timeout: float, every: float = 5.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


def _stop_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--sample-seconds", type=float, default=60.0)
    p.add_argument("--warm-up-minutes", type=float, default=5.0,
                   help="samples before this are printed but not judged")
    p.add_argument("--data", type=Path, help="the service's data directory (default: new)")
    p.add_argument("--airflow-home", type=Path, help="its Airflow home (default: new)")
    p.add_argument("--api-port", type=int, default=Settings.api_port)
    p.add_argument("--connect-port", type=int, default=Settings.connect_port)
    p.add_argument("--keep", action="store_true", help="keep a new temporary folder")
    args = p.parse_args(argv)
    for name in ("minutes", "sample_seconds"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.warm_up_minutes < 0 or args.warm_up_minutes >= args.minutes:
        p.error("--warm-up-minutes must be >= 0 and below --minutes")

    # SIGTERM, and SIGINT even when started in the background (where a shell ignores it),
    # end the soak through ``finally``: the service is stopped, not left running.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop_on_signal)
    scratch = None if args.data and args.airflow_home else Path(tempfile.mkdtemp(prefix="soak-"))
    settings = Settings(data=(args.data or scratch / "data").resolve(),
                        airflow_home=(args.airflow_home or scratch / "airflow").resolve(),
                        api_port=args.api_port, connect_port=args.connect_port)
    service = Service(settings)
    print(f"soak: {args.minutes:g} min, data {settings.data}, Airflow home "
          f"{settings.airflow_home}, UI {settings.api_url}", flush=True)
    t0 = time.monotonic()
    failures: list[str] = []
    try:
        service.up()
        up_seconds = time.monotonic() - t0
        client = AirflowClient(settings.api_url, *service.login())
        names = list(service.records())
        pss: dict[str, list[float]] = {n: [] for n in names}
        minutes: list[float] = []
        start = time.monotonic()
        while True:
            elapsed = (time.monotonic() - start) / 60
            records = service.records()
            dead = [n for n in names if n not in records or not alive(records[n])]
            if dead:
                failures.append(f"died during the soak: {', '.join(dead)}")
                print(f"{elapsed:6.1f} min  DEAD: {dead}", flush=True)
                break
            minutes.append(elapsed)
            for n in names:
                pss[n].append(tree_pss(records[n].pid) / 2**20)
            try:
                runs, plans = run_states(client), plan_statuses(client)
            except AirflowError as exc:
                runs, plans = {"unanswered": str(exc)[:60]}, {}
            print(f"{elapsed:6.1f} min  PSS MiB " + " ".join(
                f"{n}={pss[n][-1]:.0f}" for n in names)
                + f"  runs {runs}  plans {plans}  newest window "
                f"{newest_window_age(service)} s old", flush=True)
            if elapsed >= args.minutes:
                break
            time.sleep(max(0.0, start + len(minutes) * args.sample_seconds - time.monotonic()))
        runs, plans = run_states(client), plan_statuses(client)

        # ------------------------------------------------------------ the crash
        before = newest_window(service)
        killed = crash(service)
        stale = sorted(service.records())
        t1 = time.monotonic()
        started = service.up()
        restart_seconds = time.monotonic() - t1
        if sorted(started) != sorted(names):
            failures.append(f"after the crash, up started {started}, not every component")
        t2 = time.monotonic()
        resumed = None
        try:
            wait_for("a window newer than before the crash", lambda: (
                (w := newest_window(service)) is not None and (before is None or w > before)),
                600)
            resumed = time.monotonic() - t2
            after = dt.datetime.now(dt.timezone.utc)

            def scheduled_success():
                return any(r["run_type"] == "scheduled" and r["state"] == "success"
                           and r.get("start_date") and dt.datetime.fromisoformat(
                               r["start_date"].replace("Z", "+00:00")) > after
                           for r in dag_runs(client))
            wait_for("a scheduled run that succeeds after the restart", scheduled_success, 600)
            run_after = time.monotonic() - t2
            print(f"after the restart: runs {run_states(client)}, plans {plan_statuses(client)}",
                  flush=True)
        except TimeoutError as exc:
            failures.append(str(exc))
            run_after = None
    finally:
        recorded = {n: r.pid for n, r in service.records().items()}
        service.down()
        left = [n for n, pid in recorded.items() if processes.running(pid)]
        if scratch is not None and not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)

    # ---------------------------------------------------------------- the report
    judged = [i for i, m in enumerate(minutes) if m >= args.warm_up_minutes]
    print(f"\nservice up in {up_seconds:.0f} s; {len(minutes)} samples over "
          f"{minutes[-1]:.1f} min; judged from minute {args.warm_up_minutes:g} "
          f"({len(judged)} samples)")
    print("\n| component | PSS MiB at warm-up end | min | max | last | growth | noise | verdict |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for n in names:
        values = [pss[n][i] for i in judged]
        if not values:
            continue
        grown, noise = growth(values)
        flat = grown <= max(3 * noise, 0.05 * values[0])
        if not flat:
            failures.append(f"{n} grew by {grown:.0f} MiB (noise {noise:.0f} MiB)")
        print(f"| {n} | {values[0]:.0f} | {min(values):.0f} | {max(values):.0f} | "
              f"{values[-1]:.0f} | {grown:+.0f} | {noise:.0f} | {'flat' if flat else 'GREW'} |")
    total = [sum(pss[n][i] for n in names) for i in judged]
    if total:
        grown, noise = growth(total)
        print(f"| all | {total[0]:.0f} | {min(total):.0f} | {max(total):.0f} | {total[-1]:.0f} "
              f"| {grown:+.0f} | {noise:.0f} | |")
    print(f"\nDAG runs: {runs}; plans: {plans}")
    if not plans.get("verified"):
        failures.append("no plan was verified")
    # a plan that does not hold fails its run's verify task on purpose (diverged): that is
    # the service reporting a plan, not the service failing
    if runs.get("failed", 0) > plans.get("diverged", 0):
        failures.append(f"{runs['failed']} run(s) failed, {plans.get('diverged', 0)} of them "
                        "at most by a diverged plan")
    print(f"crash: SIGKILL to {len(killed)} components ({', '.join(killed)}), pid records "
          f"left: {len(stale)}; up again in {restart_seconds:.0f} s (started {len(started)}); "
          f"a new window after {resumed if resumed is None else round(resumed)} s, a "
          f"successful scheduled run after {run_after if run_after is None else round(run_after)} s")
    print(f"down: {'nothing left running' if not left else f'STILL RUNNING: {left}'}")
    if left:
        failures.append(f"still running after down: {left}")
    print(f"machine load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
