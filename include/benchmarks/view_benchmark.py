"""How long the Rebalance view takes to answer with a month of plans stored.

    .venv/bin/python include/benchmarks/view_benchmark.py --days 30 --runs 3

Builds a tables root in a temporary folder (``--root`` to keep it): the control tables
created by Spark, as the service creates them, then ``--days`` of the service's plans at
its default schedule (a run every 30 minutes: 48 plans a day, each with its assignment
frame over ``--keys`` keys and the record a verified plan has: params, metrics, inputs,
validation, verification), appended a day per commit through delta-rs; an assignment
version per ``--applied-per-day``; and a day of histogram windows (20 s, N = 4). Then each
run starts a fresh Python process (nothing cached, as after an api-server restart; Airflow
imported first, as the api-server has it) that times the view's reads: the index page
(loads, realised imbalance, plan history, assignment versions: what ``/rebalance/``
renders) and the newest plan's page. Prints
each figure per run, then the median and the worst.

Target: a page in <= 1 s with a month of plans.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N_INSTANCES = 4
WINDOW_SECONDS = 20

#: What one run measures, in a process of its own (the root comes in REBALANCE_DATA_DIR).
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import airflow.sdk  # the api-server that serves the view has Airflow loaded
from rebalance.ui import pages, views
imported = time.perf_counter() - t0
out = {"import": imported}
t = time.perf_counter()
html = pages.render_index(views.instance_loads(None, windows=30),
                          views.realised_ratios(None, windows=60),
                          views.plans(None, limit=100), views.assignments(None), {})
out["index page"] = time.perf_counter() - t
newest = views.plans(None, limit=1)[0]["plan_id"]
t = time.perf_counter()
page = pages.render_plan(views.plan(None, newest))
out["plan page"] = time.perf_counter() - t
out["bytes"] = len(html) + len(page)
print(json.dumps(out))
"""


def build(root: Path, days: int, keys: int, applied_per_day: int) -> dict:
    """The tables of a service that ran ``days`` days (see the module docstring)."""
    import numpy as np
    import pyarrow as pa

    from rebalance.core.records import PlanRecord
    from rebalance.spark import delta_rs, tables
    from rebalance.spark.plan_store import PLAN_ASSIGNMENTS, PLANS, PlanStore
    from rebalance.spark.session import get_spark

    spark = get_spark("rebalance-view-benchmark", master="local[1]")
    store = PlanStore(spark, root=root / "tables")
    for table in (PLANS, PLAN_ASSIGNMENTS):
        store.ensure(table)
    tables.create_assignments(spark, N_INSTANCES, root / "tables")
    for table in (tables.INSTANCE_HISTOGRAMS, tables.KEY_HISTOGRAMS):
        tables.ensure_table(spark, table, root / "tables")
    rng = np.random.default_rng(1)
    start = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    key_names = [f"k{i}" for i in range(keys)]
    validation, metrics = _validation(key_names, rng)
    plan_ids: list[str] = []
    for day in range(days):
        rows, frames = [], []
        for slot in range(48):
            end = start + dt.timedelta(days=day, minutes=30 * (slot + 1))
            pid = f"p{day:03d}{slot:02d}" + "0" * 14
            plan_ids.append(pid)
            record = PlanRecord(
                pid, "verified", "mixed", "rebalance", f"scheduled__{end.isoformat()}",
                "scheduled", data_interval_start=end - dt.timedelta(minutes=30),
                data_interval_end=end, params={"theta": 0.1, "method": "mixed"},
                metrics=metrics,
                inputs={"windows": [(end - dt.timedelta(seconds=WINDOW_SECONDS * i)).isoformat()
                                    for i in range(6)], "n_instances": N_INSTANCES,
                        "events": 40_000, "key_histograms_version": day * 48 + slot,
                        "base_assignment_version": 0},
                validation=validation,
                verification={"applied_at": end.isoformat(), "realised": 1.06,
                              "windows": [end.isoformat()]},
                base_assignment_version=0, assignment_version=None, predicted_imbalance=1.05,
                realised_imbalance=1.06, created_at=end, updated_at=end)
            rows.append(record.to_row())
            instance = rng.integers(0, N_INSTANCES, keys)
            frames.append({"plan_id": [pid] * keys, "key": key_names,
                           "instance": instance, "current": instance,
                           "default": instance, "load": rng.random(keys),
                           "state": rng.random(keys) * 1e4, "moved": np.zeros(keys, bool),
                           "split": [None] * keys})
        delta_rs.append(store.path(PLANS), _arrow(rows, PLANS), {"action": "benchmark", "day": day})
        frame = {c: np.concatenate([f[c] for f in frames]) for c in frames[0]}
        delta_rs.append(store.path(PLAN_ASSIGNMENTS), pa.table(frame).cast(
            pa.schema(delta_rs.table(store.path(PLAN_ASSIGNMENTS)).schema().to_arrow())),
            {"action": "benchmark", "day": day})
        for i in range(applied_per_day):
            pid = plan_ids[-1 - i]
            tables.publish_assignment(spark, {key_names[j]: j % N_INSTANCES for j in range(40)},
                                      N_INSTANCES, {"action": "apply", "plan_id": pid},
                                      root / "tables")
    # the newest day of windows, N rows each, one commit per hour
    last = start + dt.timedelta(days=days)
    per_hour = 3600 // WINDOW_SECONDS
    version = tables.latest_assignment_version(spark, root / "tables")
    for hour in range(24):
        windows = [last - dt.timedelta(hours=24 - hour, seconds=-WINDOW_SECONDS * w)
                   for w in range(per_hour)]
        n = len(windows) * N_INSTANCES
        delta_rs.append(tables.INSTANCE_HISTOGRAMS.path(root / "tables"), pa.table({
            "window_start": pa.array([w for w in windows for _ in range(N_INSTANCES)],
                                     pa.timestamp("us", tz="UTC")),
            "instance": pa.array(list(range(N_INSTANCES)) * len(windows), pa.int32()),
            "load": rng.random(n) * 1000, "events": rng.integers(900, 1100, n),
            "keys": rng.integers(200, 300, n), "task_ms": rng.random(n) * 50,
            "cpu_ms": rng.random(n) * 40, "partition_id": pa.array(
                list(range(N_INSTANCES)) * len(windows), pa.int32()),
            "assignment_version": pa.array([version] * n, pa.int64()),
            "batch_id": pa.array([hour] * n, pa.int64()),
            "duplicates": pa.array([0] * n, pa.int64())}), {"action": "benchmark"})
    spark.stop()
    return {"plans": len(plan_ids), "frame_rows": len(plan_ids) * keys,
            "assignment_versions": days * applied_per_day, "windows": 24 * per_hour}


def _validation(key_names: list[str], rng) -> tuple[dict, dict]:
    """A real validation result and metrics (Great Expectations on one plan's frame), the
    record every stored plan carries."""
    import pandas as pd

    from rebalance.control.validation import (
        PlanLimits,
        recompute_metrics_independently,
        validate_plan,
    )

    keys = len(key_names)
    current = rng.integers(0, N_INSTANCES, keys)
    instance = current.copy()
    instance[:12] = (instance[:12] + 1) % N_INSTANCES
    frame = pd.DataFrame({"key": key_names, "instance": instance, "current": current,
                          "default": current, "load": rng.random(keys),
                          "state": rng.random(keys) * 1e4, "moved": instance != current})
    metrics = recompute_metrics_independently(frame, N_INSTANCES)
    result = validate_plan(frame, metrics, PlanLimits(N_INSTANCES, 10.0, keys))
    assert result.success, result.failures
    return result.statistics, dict(metrics)


def _arrow(rows: list[dict], table):
    import pyarrow as pa

    from rebalance.spark import delta_rs

    schema = pa.schema(delta_rs.table(table.path(
        Path(os.environ["REBALANCE_DATA_DIR"]) / "tables")).schema().to_arrow())
    return pa.Table.from_pylist(rows, schema=schema)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--keys", type=int, default=1000, help="keys in each plan's frame")
    p.add_argument("--applied-per-day", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--root", type=Path, help="data folder to build in (default: a temporary one)")
    args = p.parse_args(argv)
    for name in ("days", "keys", "runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    root = args.root or Path(tempfile.mkdtemp(prefix="rebalance-view-benchmark-"))
    os.environ["REBALANCE_DATA_DIR"] = str(root)
    t = time.perf_counter()
    built = build(root, args.days, args.keys, args.applied_per_day)
    print(f"built in {time.perf_counter() - t:.0f} s at {root}: " + json.dumps(built), flush=True)
    results = []
    for run in range(args.runs):
        done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                              env={**os.environ, "REBALANCE_DATA_DIR": str(root)})
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(figures)
        print(f"run {run + 1}/{args.runs}: import {figures['import']:.2f} s, index page "
              f"{figures['index page']:.2f} s, plan page {figures['plan page']:.2f} s", flush=True)
    for name in ("import", "index page", "plan page"):
        values = [r[name] for r in results]
        print(f"{name:10s} median {statistics.median(values):.2f} s  worst {max(values):.2f} s"
              + ("" if name == "import" else "  (target <= 1 s)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
