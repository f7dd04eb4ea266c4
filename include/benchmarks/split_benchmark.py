"""A key heavier than the bound: whole-key placement against split placement, on the cluster.

    python include/benchmarks/split_benchmark.py                  # starts its own cluster
    python include/benchmarks/split_benchmark.py --instances 4 8 --hot-share 0.3
    python include/benchmarks/split_benchmark.py --master spark://127.0.0.1:7077

The workload: one key carries ``--hot-share`` of the events (default 30 %), the other
``--keys`` - 1 keys share the rest by Zipf 1.0; events carry simulated per-event work
(``--work-us-per-cost``), so an instance's operator time follows its load. For each N in
``--instances`` the keyed job runs over the same events (one generator batch per
micro-batch) three times, on fresh copies of the tables:

1. ``hash``: no routing table; its key histograms are the input of both plans;
2. ``whole``: the plan of ``auto`` (every key placed whole): the hot key alone is the
   floor of its imbalance, ``hot share x N``;
3. ``split``: ``auto`` with the keys too hot for one instance split
   (:func:`rebalance.core.planners.split.plan_split`), published with their shares
   (:func:`rebalance.spark.tables.publish_assignment` ``splits=``);
4. ``split-nomerge``: the same without ``window_results`` (``JobConfig.window_results``
   off): the merge's cost is the difference in events/s.

Per run: sustained events/s (valid events / summed micro-batch durations, the first
batch excluded); the critical path, per window the largest instance's operator CPU time
over the mean (median over windows), which is what throughput is inversely proportional
to when every instance has a core of its own (``modeled speedup`` = whole's critical path
/ split's); load max/mean; and whether ``window_results`` (one merged row per closed
window and key) equals a pandas recomputation of the input exactly. The merge's cost:
the partial rows merged per window (key-histogram rows minus ``window_results`` rows) and
the state bytes the split key's partials hold beyond one whole state.

On a machine with fewer cores than N the instances share the cores, and events/s
follows the total work, not the largest instance: the modeled speedup is the figure that
carries to a cluster with a core per instance. Writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulated_work import cpu_work  # noqa: E402
from stream_benchmark import copy_events, max_over_mean_by_window, run_job  # noqa: E402
from throughput_benchmark import CLUSTER_CONF, cluster_master, write_report  # noqa: E402

T0 = pd.Timestamp("2024-01-01T00:00:00Z")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--master", help="spark://HOST:PORT of a running cluster (default: start one)")
    p.add_argument("--local", action="store_true", help="run in a local[2] session instead")
    p.add_argument("--instances", type=int, nargs="+", default=[4, 8])
    p.add_argument("--hot-share", type=float, default=0.3)
    p.add_argument("--keys", type=int, default=200)
    p.add_argument("--events", type=int, default=3000, help="events per generator batch")
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--work-us-per-cost", type=float, default=300.0)
    p.add_argument("--theta", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path(".data/benchmarks/split"))
    args = p.parse_args(argv)
    if min(args.instances) < 2 or args.batches < 3 or args.events < 1 or args.keys < 2:
        p.error("--instances >= 2, --batches >= 3, --events >= 1, --keys >= 2")
    if not 0 < args.hot_share < 1:
        p.error("--hot-share must be in (0, 1)")
    if args.work_us_per_cost < 0 or args.theta < 0:
        p.error("--work-us-per-cost and --theta must be >= 0")
    return args


def hot_key_generator(args, n: int):
    """The project's generator with fixed frequencies: key ``k0`` carries ``hot_share``,
    the others Zipf 1.0 over the rest (no fluctuation)."""
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, zipf_weights

    gen = EventGenerator(GeneratorConfig(n_keys=args.keys, zipf=1.0, events_per_batch=args.events,
                                         batch_seconds=10.0, n_instances=n, seed=args.seed))
    freq = np.concatenate([[args.hot_share],
                           (1 - args.hot_share) * zipf_weights(args.keys - 1, 1.0)])
    gen.frequencies = lambda interval: freq          # the same in every batch
    gen.fluctuation_change = lambda interval: 0.0
    return gen


def expected_windows(gen, batches: int) -> pd.DataFrame:
    """count and sum of value per (key, window), from the generator (the oracle)."""
    frames = []
    for b in range(batches):
        ev = gen.batch(b).events
        ms = (pd.to_datetime(ev["event_time"], utc=True) - T0) // pd.Timedelta(milliseconds=1)
        frames.append(pd.DataFrame({"key": ev["key"], "value": ev["value"].astype(float),
                                    "window": ms - ms % 10_000}))
    return (pd.concat(frames).groupby(["key", "window"])
            .agg(count=("value", "size"), sum=("value", "sum")))


def plans(spark, hash_root: str, n: int, theta: float) -> dict:
    """Whole-key and split plans from the hash run's key histograms."""

    from rebalance.core.histograms import build_problem
    from rebalance.core.model import PlanParams
    from rebalance.core.planners import get_planner
    from rebalance.core.planners.split import plan_split
    from rebalance.spark.loads import histogram_rows

    rows = histogram_rows(spark, root=hash_root)
    problem, _ = build_problem(rows, n, None, windows=max(1, rows["window_start"].nunique()))
    params = PlanParams(theta=theta)
    out = {}
    for name, plan in (("whole", get_planner("auto").plan(problem, params)),
                       ("split", plan_split(problem, params))):
        split = plan.split if plan.split is not None else None
        split_keys = set() if split is None else {int(i) for i in split.index}
        routing = {str(k): int(a) for i, (k, a, d) in enumerate(
            zip(problem.keys, plan.assignment, problem.default)) if a != d and i not in split_keys}
        splits = {} if split is None else {
            str(problem.keys[i]): {int(j): float(s) for j, s in zip(inst, share)}
            for i, inst, share in zip(split.index, split.instances, split.shares)}
        out[name] = {"routing": routing, "splits": splits, "method": plan.method,
                     "planned_imbalance": float(plan.metrics.imbalance_after)}
    return out


def run(spark, config, root: Path, expected: pd.DataFrame) -> dict:
    from pyspark.sql import functions as F

    from rebalance.spark import tables

    stats = run_job(spark, replace(config, tables_root=str(root),
                                   checkpoint_root=str(root / "checkpoints")))
    imbalance = max_over_mean_by_window(spark, str(root), skip_first=0)
    figures = {"events_per_second": stats.events_per_second, "events": stats.events,
               "critical_path": imbalance["cpu_ms_max_over_mean_median"],
               "load_max_over_mean": imbalance["load_max_over_mean_median"]}
    if not config.window_results:
        return {**figures, "window_results_exact": None, "merged_partials_per_window": 0.0,
                "hot_key_extra_state_bytes": 0.0}
    final = (tables.read(spark, tables.WINDOW_RESULTS, str(root))
             .select("key", (F.unix_millis("window_start") - int(T0.value // 10**6))
                     .alias("window"), "count", "sum").toPandas().set_index(["key", "window"])
             .sort_index())
    want = expected.loc[final.index] if len(final) else expected.iloc[:0]
    closed = expected.index.get_level_values("window") <= final.index.get_level_values(
        "window").max()
    exact = bool(final.index.equals(expected[closed].sort_index().index)
                 and (final["count"] == want["count"]).all()
                 and np.allclose(final["sum"], want["sum"]))
    kh = tables.read(spark, tables.KEY_HISTOGRAMS, str(root)).toPandas()
    per_window = kh.groupby("window_start").size() - final.groupby(level="window").size().values
    hot = kh[kh.key == "k0"].groupby("window_start")["state_bytes"]
    return {**figures, "window_results_exact": exact, "closed_windows": int(final.index.get_level_values(
                "window").nunique()),
            "merged_partials_per_window": float(per_window.median()),
            "hot_key_extra_state_bytes": float((hot.sum() - hot.max()).median()),
            "hot_key_state_bytes": float(hot.max().median())}


def measure(spark, work: Path, n: int, args) -> dict:
    from rebalance.spark import tables
    from rebalance.streaming.generator import append_batches
    from rebalance.streaming.job import JobConfig

    gen = hot_key_generator(args, n)
    source = work / f"events-n{n}"
    append_batches(spark, gen, range(args.batches), str(source))
    expected = expected_windows(gen, args.batches)
    config = JobConfig(n_instances=n, window_seconds=10.0, n_windows=2, watermark_seconds=5.0,
                       work=cpu_work(args.work_us_per_cost), max_files_per_trigger=1)
    out: dict = {"instances": n, "hot_share": args.hot_share}
    for name in ("hash", "whole", "split", "split-nomerge"):
        root = work / f"n{n}-{name}"
        copy_events(source, root)
        if name == "whole":
            out["plans"] = plans(spark, str(work / f"n{n}-hash"), n, args.theta)
        if name != "hash":
            plan = out["plans"][name.split("-")[0]]
            tables.publish_assignment(spark, plan["routing"], n, {"method": plan["method"]},
                                      str(root), splits=plan["splits"])
        out[name] = run(spark, replace(config, name=f"n{n}{name.replace('-', '')}",
                                       window_results=name != "split-nomerge"), root, expected)
        r = out[name]
        print(f"  N={n} {name:5}: {r['events_per_second']:7.0f} events/s, critical path "
              f"{r['critical_path']:.2f}, load max/mean {r['load_max_over_mean']:.2f}, "
              f"window_results exact: {r['window_results_exact']} (load average "
              f"{os.getloadavg()[0]:.1f})", flush=True)
    out["modeled_speedup"] = out["whole"]["critical_path"] / out["split"]["critical_path"]
    out["measured_speedup"] = (out["split"]["events_per_second"]
                               / out["whole"]["events_per_second"])
    out["merge_cost"] = 1 - (out["split"]["events_per_second"]
                             / out["split-nomerge"]["events_per_second"])
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rebalance.spark.session import get_spark

    results: list = []
    with tempfile.TemporaryDirectory(prefix="split-") as tmp, \
            cluster_master(Path(tmp), "local[2]" if args.local else args.master) as master:
        spark = get_spark("rebalance-split", master=master,
                          conf={} if args.local else CLUSTER_CONF)
        for n in args.instances:
            results.append(measure(spark, Path(tmp), n, args))
        spark.stop()
    write_report(args.out / "split.json", master, args, results)
    print(f"\nOne key carries {args.hot_share:.0%} of the events; {os.cpu_count()} cores.")
    print("\n| N | placement | planned imbalance | load max/mean | critical path | events/s "
          "| window_results exact | partials merged / window | hot key's extra state |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for name in ("hash", "whole", "split", "split-nomerge"):
            x = r[name]
            planned = (f"{r['plans'][name.split('-')[0]]['planned_imbalance']:.3f}"
                       if name != "hash" else "-")
            exact = {True: "yes", False: "NO", None: "(not written)"}[x["window_results_exact"]]
            print(f"| {r['instances']} | {name} | {planned} | {x['load_max_over_mean']:.2f} | "
                  f"{x['critical_path']:.2f} | {x['events_per_second']:.0f} | "
                  f"{exact} | "
                  f"{x['merged_partials_per_window']:.0f} | "
                  f"{x['hot_key_extra_state_bytes']:.0f} B |")
        print(f"| {r['instances']} | split / whole | | | **{r['modeled_speedup']:.2f}x** "
              f"(modeled) | {r['measured_speedup']:.2f}x (measured) | | | |")
        print(f"| {r['instances']} | merge cost | | | | {r['merge_cost']:.1%} fewer events/s "
              "than split without window_results | | | |")
    print(f"\nwritten {args.out / 'split.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
