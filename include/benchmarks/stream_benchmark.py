"""Streaming benchmark: the keyed job's per-instance balance.

    python include/benchmarks/stream_benchmark.py            # about 4 minutes on 2 cores
    python include/benchmarks/stream_benchmark.py --quick    # smaller, about 2 minutes

On Zipf 1.0 with simulated per-event work (task time follows load), the job runs once
under hash routing, a routing table is planned from that run's key histograms
(``rebalance.core.planners`` "mixed"), published, and the job runs again on the same
events. Per window (= micro-batch) it reports max/mean of the operator's task time
across instances. Targets: <= 1.15 balanced, >= 2 under hash.

(Its former first part, the job with and without histograms, ended when the keyed job
moved onto ``rebalanced()``, which measures every key: what the rebalancer costs against
plain Spark is ``processor_cost_benchmark.py``'s figure.)

Figures are wall-clock on whatever else the machine runs; the output says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulated_work import cpu_work  # noqa: E402


@dataclass(frozen=True)
class RunStats:
    """One job run: valid events, processing seconds (batches after the first), wall seconds."""

    events: int
    seconds: float
    wall: float

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else float("nan")


def run_job(spark, config) -> RunStats:
    """Run the job to completion (availableNow); time the keyed query's batches."""
    from rebalance.streaming.builtin import start_job

    started = time.perf_counter()
    job = start_job(spark, config)
    job.await_termination()
    wall = time.perf_counter() - started
    progress = list(job.keyed.recentProgress)
    steady = [p for p in progress if p["batchId"] > progress[0]["batchId"]]
    return RunStats(events=sum(p["numInputRows"] for p in steady),
                    seconds=sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000,
                    wall=wall)


def copy_events(source_root: Path, target_root: Path) -> None:
    """A fresh tables root holding the same ``events`` table (same input for every run)."""
    shutil.copytree(source_root / "events", target_root / "events")


def plan_routing(spark, root: str, n_instances: int, theta: float) -> tuple[dict[str, int], str]:
    """Routing table from the hash run's key histograms: Mixed on the problem every
    plan uses (:func:`rebalance.core.histograms.build_problem`: load = cost per window, the mean
    over the run's windows; state = bytes at the close of the key's latest window). The
    benchmark once summed the windows' costs: a constant factor on every key (absent =
    0 in both), so the plan under a relative bound theta is the same."""

    from rebalance.core.histograms import build_problem
    from rebalance.core.model import PlanParams
    from rebalance.core.planners import get_planner
    from rebalance.spark.loads import histogram_rows

    rows = histogram_rows(spark, root=root)
    problem, _ = build_problem(rows, n_instances, None, windows=max(1, rows["window_start"].nunique()))
    assignment = get_planner("mixed").plan(problem, PlanParams(theta=theta)).assignment
    routing = {str(k): int(a) for k, a, d in zip(problem.keys, assignment, problem.default)
               if a != d}
    return routing, "mixed (rebalance.core.planners)"


def max_over_mean_by_window(spark, root: str, skip_first: int = 1) -> dict:
    """Per window, max/mean across instances (:func:`rebalance.core.model.imbalance`) of task
    time, of operator CPU time and of load (the first ``skip_first`` windows skipped)."""
    from rebalance.core.model import imbalance
    from rebalance.spark import tables

    hist = tables.read(spark, tables.INSTANCE_HISTOGRAMS, root).toPandas()
    windows = sorted(hist["window_start"].unique())[skip_first:]
    ratios: dict[str, list[float]] = {"task_ms": [], "cpu_ms": [], "load": []}
    for window in windows:
        rows = hist[hist["window_start"] == window]
        for column, values in ratios.items():   # one row per instance and window
            values.append(imbalance(rows[column].to_numpy()))
    out: dict = {"windows": len(windows)}
    for column, values in ratios.items():
        out[f"{column}_max_over_mean_median"] = float(np.median(values))
        out[f"{column}_max_over_mean_per_window"] = [round(x, 3) for x in values]
    return out


def balance(spark, work: Path, args) -> dict:
    from rebalance.core.model import imbalance
    from rebalance.core.placement import default_instances
    from rebalance.spark import tables
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches
    from rebalance.streaming.job import JobConfig

    gen = EventGenerator(GeneratorConfig(
        n_keys=args.balance_keys, zipf=1.0, events_per_batch=args.balance_events,
        batch_seconds=10.0, n_instances=args.balance_instances, seed=args.seed))
    freq = gen.frequencies(0)
    model = np.bincount(default_instances(gen.keys, args.balance_instances), weights=freq,
                        minlength=args.balance_instances)
    source = work / "balance-events"
    append_batches(spark, gen, range(args.balance_batches), str(source))
    config = JobConfig(n_instances=args.balance_instances, window_seconds=10.0, n_windows=2,
                       watermark_seconds=5.0, work=cpu_work(args.work_us_per_cost),
                       max_files_per_trigger=1)
    out = {"expected_hash_load_max_over_mean": imbalance(model)}
    roots = {name: work / f"balance-{name}" for name in ("hash", "balanced")}
    for name, root in roots.items():
        copy_events(source, root)
        run_config = replace(config, name=name, tables_root=str(root),
                             checkpoint_root=str(root / "checkpoints"))
        if name == "balanced":
            routing, method = plan_routing(spark, str(roots["hash"]), args.balance_instances,
                                           args.theta)
            tables.publish_assignment(spark, routing, args.balance_instances,
                                      {"method": method}, str(root))
            out["planner"] = method
            out["routing_table_size"] = len(routing)
        run_job(spark, run_config)
        out[name] = max_over_mean_by_window(spark, str(root))
        print(f"  {name:8}: max/mean across instances, median over windows: task time "
              f"{out[name]['task_ms_max_over_mean_median']:.2f}, operator CPU time "
              f"{out[name]['cpu_ms_max_over_mean_median']:.2f}, load "
              f"{out[name]['load_max_over_mean_median']:.2f}", flush=True)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer and smaller batches")
    p.add_argument("--balance-instances", type=int, default=8)
    p.add_argument("--balance-keys", type=int, default=1000)
    p.add_argument("--balance-events", type=int, default=20_000)
    p.add_argument("--balance-batches", type=int, default=7)
    p.add_argument("--work-us-per-cost", type=float, default=200.0,
                   help="simulated CPU work per event (balance)")
    p.add_argument("--theta", type=float, default=0.05, help="planner imbalance bound")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.balance_events, args.balance_batches = 10_000, 5
    return args


def report_balance(spark, work: Path, args) -> dict:
    print(f"balance: {args.balance_batches} batches x {args.balance_events} events, "
          f"K={args.balance_keys}, z=1.0, N={args.balance_instances}, "
          f"{args.work_us_per_cost} us of work per event", flush=True)
    b = balance(spark, work, args)
    print(f"  expected hash load max/mean from the model: "
          f"{b['expected_hash_load_max_over_mean']:.2f}; planner: {b['planner']}, "
          f"routing table {b['routing_table_size']} keys")
    for column, label in (("task_ms", "task time"), ("cpu_ms", "operator CPU time")):
        print(f"  {label} max/mean (median over windows): hash "
              f"{b['hash'][f'{column}_max_over_mean_median']:.2f} (target >= 2), balanced "
              f"{b['balanced'][f'{column}_max_over_mean_median']:.2f} (target <= 1.15)")
    return b


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rebalance.spark.session import get_spark

    spark = get_spark("rebalance-stream-benchmark", master=args.master, conf={
        "spark.ui.enabled": "false", "spark.databricks.delta.snapshotPartitions": "2"})
    work = Path(tempfile.mkdtemp(prefix="stream-benchmark-"))
    figures: dict = {}
    try:
        figures["balance"] = report_balance(spark, work, args)
        print(f"machine load average at the end: {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores")
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
