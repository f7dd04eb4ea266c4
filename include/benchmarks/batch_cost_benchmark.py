"""Micro-batch cost of the keyed job: the project's Spark settings against Spark's and Delta's.

    python include/benchmarks/batch_cost_benchmark.py                  # 2 repeats, about 20 min
    python include/benchmarks/batch_cost_benchmark.py --repeats 3 --batches 30
    python include/benchmarks/batch_cost_benchmark.py --variants ours --repeats 3

Each run is a fresh process (a fresh JVM: the cache is per JVM). It writes the same
generator batches to a fresh ``events`` table (1 000 keys, Zipf 1.0, 4 000 events per
batch, the service test stack's rate), then runs the restartable job as ``make up`` does
(N = 4, 5-s windows, following the latest assignment version every micro-batch) over
them, one generator batch per micro-batch, and reads the query's progress: the median
``triggerExecution`` (the whole micro-batch), ``queryPlanning`` and ``addBatch`` (the
sink: the stateful step and the Delta appends) over the batches after the first
``--skip`` (warm-up). The variants rotate, a different one first each repeat:

* ``ours``: what every local session of the project sets: Spark keeps
  :data:`~rebalance.spark.session.CODEGEN_CACHE_ENTRIES` generated classes, Delta rebuilds
  a table's state in :data:`~rebalance.spark.session.SNAPSHOT_PARTITIONS` partitions;
* ``codegen-100``: the same with Spark's default code-generation cache (100 classes);
* ``defaults``: Spark's and Delta's defaults for both (100 classes, 50 partitions).

Every idempotent Delta append first rebuilds the table's state (Spark jobs of
``snapshotPartitions`` tasks each; docs/benchmarks.md, "One small Delta append"), and
every micro-batch compiles more projections than 100 (the stateful step's encoders,
Delta's commit and table-state queries, the sink's projections): with Spark's default
they evict each other and are compiled again every batch. Figures are wall-clock on
whatever else the machine runs (the load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: variant -> the Spark conf it sets over the project's session (``ours`` sets nothing)
VARIANTS = {
    "ours": {},
    "codegen-100": {"spark.sql.codegen.cache.maxEntries": "100"},
    "defaults": {"spark.sql.codegen.cache.maxEntries": "100",
                 "spark.databricks.delta.snapshotPartitions": "50"},
}
PARTS = ("triggerExecution", "queryPlanning", "addBatch")


def run_one(variant: str, batches: int, skip: int, work: Path) -> dict:
    """One fresh process: write the events, run the job over them, return the medians."""
    os.environ["REBALANCE_DATA_DIR"] = str(work)
    os.environ["REBALANCE_SPARK_CONF"] = "spark.ui.enabled=false"
    from rebalance.spark.session import get_spark
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches
    from rebalance.streaming.job import JobConfig
    from rebalance.streaming.restart import RestartableJob

    spark = get_spark(f"batch-cost-{variant}", master="local[2]", conf=VARIANTS[variant])
    settings = {k: spark.conf.get(k) for k in ("spark.sql.codegen.cache.maxEntries",
                                                "spark.databricks.delta.snapshotPartitions")}
    root = work / "tables"
    gen = GeneratorConfig(n_keys=1000, zipf=1.0, events_per_batch=4000, batch_seconds=5.0,
                          n_instances=4, seed=10)
    append_batches(spark, EventGenerator(gen), range(batches), str(root))
    config = JobConfig(n_instances=4, window_seconds=5.0, watermark_seconds=2.0, n_windows=3,
                       trigger_seconds=None, max_files_per_trigger=1, name="keyed",
                       tables_root=str(root), checkpoint_root=str(work / "checkpoints"))
    job = RestartableJob(spark, config)
    job.start()
    job.query.awaitTermination()
    progress = [p for p in job.query.recentProgress if p["numInputRows"] > 0]
    spark.stop()
    steady = progress[skip:]
    return {"variant": variant, "cache_entries": int(settings[
                "spark.sql.codegen.cache.maxEntries"]),
            "snapshot_partitions": int(settings["spark.databricks.delta.snapshotPartitions"]),
            "batches": len(steady),
            **{part: statistics.median(p["durationMs"].get(part, 0) for p in steady) / 1000
               for part in PARTS}}


def print_table(rows: list[dict]) -> None:
    print("| variant | generated classes cached | Delta snapshot partitions | runs "
          "| micro-batch s | query planning s | sink (addBatch) s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        if not mine:
            continue
        cells = []
        for part in PARTS:
            values = [r[part] for r in mine]
            cells.append(f"{statistics.median(values):.2f} ({max(values):.2f})")
        print(f"| {variant} | {mine[0]['cache_entries']} | {mine[0]['snapshot_partitions']} "
              f"| {len(mine)} | " + " | ".join(cells) + " |")
    print("(median over the runs of each run's median micro-batch; in brackets the worst run)")
    ours = [r["triggerExecution"] for r in rows if r["variant"] == "ours"]
    for other in list(VARIANTS)[1:]:
        theirs = [r["triggerExecution"] for r in rows if r["variant"] == other]
        if ours and theirs:
            print(f"micro-batch, ours / {other}: "
                  f"{statistics.median(ours) / statistics.median(theirs):.2f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2, help="runs of each variant (fresh processes)")
    p.add_argument("--batches", type=int, default=20, help="generator batches = micro-batches")
    p.add_argument("--skip", type=int, default=4, help="first micro-batches not counted")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                   help="the variants to run (default: all)")
    p.add_argument("--json", help="also write every run's figures to this file")
    p.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)    # child: one run
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.batches <= args.skip or args.skip < 0:
        p.error("need --repeats >= 1 and 0 <= --skip < --batches")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one is not None:
        work = Path(tempfile.mkdtemp(prefix=f"batch-cost-{args.one}-"))
        try:
            row = run_one(args.one, args.batches, args.skip, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        Path(args.out).write_text(json.dumps(row))
        return 0
    rows = []
    for repeat in range(args.repeats):
        names = list(args.variants)
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        for variant in order:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                done = subprocess.run([sys.executable, __file__, "--one", variant,
                                       "--batches", str(args.batches), "--skip", str(args.skip),
                                       "--out", out.name])
                if done.returncode != 0:
                    print(f"{variant}: failed (exit {done.returncode})", flush=True)
                    continue
                row = json.loads(Path(out.name).read_text())
            rows.append(row)
            print(f"repeat {repeat} {variant}: micro-batch {row['triggerExecution']:.2f} s, "
                  f"planning {row['queryPlanning']:.2f} s, sink {row['addBatch']:.2f} s "
                  f"({row['batches']} batches)", flush=True)
    print_table(rows)
    print(f"machine load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
