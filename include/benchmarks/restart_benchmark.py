"""Restart benchmark: the pause of a controlled restart against the keys with state.

    python include/benchmarks/restart_benchmark.py                  # K = 10^3, 10^4, 10^5
    python include/benchmarks/restart_benchmark.py --keys 1000 10000

For each K: a fresh events table whose first batch holds every key (so K keys
have state), the keyed job as generation 0 (N = 4) processes it; a plan moving
10 % of the keys is published and a restart requested while a new batch is
waiting; the restart runs (stop at a batch boundary, state read back, re-keyed,
written, new generation started with it as initial state) and is acknowledged.

The pause is the time without progress: from the moment the old generation's sink
gate closes (no batch after that one commits) to the new generation's first
committed batch. It is printed with its parts (seconds since the request at each
step) and the number of keys read back from the state store. Target: <= 15 s at
10^5 keys. Figures are wall-clock on whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path


def one_restart(spark, work: Path, n_keys: int, n_instances: int, seed: int) -> dict:
    from rebalance.placement import default_instances
    from rebalance.spark import tables
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches
    from rebalance.streaming.job import JobConfig
    from rebalance.streaming.restart import RestartableJob, request_restart

    root = str(work / f"k{n_keys}" / "tables")
    config = JobConfig(n_instances=n_instances, window_seconds=60, n_windows=2,
                       watermark_seconds=5, max_files_per_trigger=1, trigger_seconds=1,
                       emit_histograms=False, name="bench", tables_root=root,
                       checkpoint_root=str(work / f"k{n_keys}" / "checkpoints"))
    # Batch 0: every key once; batch 1: a small batch that waits for the new generation.
    everyone = EventGenerator(GeneratorConfig(n_keys=n_keys, zipf=0.0,
                                              events_per_batch=4 * n_keys,
                                              n_instances=n_instances, seed=seed))
    append_batches(spark, everyone, [0], root)
    job = RestartableJob(spark, config)
    job.start()
    job.process_all_available()
    keys = list(everyone.keys)
    default = default_instances(keys, n_instances)
    moved = {k: int((d + 1) % n_instances) for k, d in
             zip(keys[: max(1, n_keys // 10)], default[: max(1, n_keys // 10)])}
    version = tables.publish_assignment(spark, moved, n_instances, {"benchmark": True}, root)
    append_batches(spark, everyone, [1], root)
    request = request_restart(spark, version, n_instances, job=config.name, root=root)
    started = time.perf_counter()
    job.poll()
    total = time.perf_counter() - started
    status = job.control.status(request)
    keys_with_state = (spark.read.parquet(job.generation.state_path)
                       .where("kind = 'perkey'").count())
    job.stop()
    return {"keys": n_keys, "keys_with_state": keys_with_state, "moved_keys": len(moved),
            "pause_seconds": status["pause_seconds"],
            "seconds_since_request": status["seconds_since_request"],
            "restart_call_seconds": round(total, 3), "ok": status["ok"]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--json", help="also write the figures to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rebalance.spark.session import get_spark

    spark = get_spark("rebalance-restart-benchmark", master=args.master, conf={
        "spark.ui.enabled": "false", "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.shuffle.partitions": str(args.instances)})
    work = Path(tempfile.mkdtemp(prefix="restart-benchmark-"))
    figures = []
    try:
        for n_keys in args.keys:
            print(f"K = {n_keys}: generation 0 with N = {args.instances}, then a restart "
                  "moving 10 % of the keys", flush=True)
            r = one_restart(spark, work, n_keys, args.instances, args.seed)
            figures.append(r)
            print(f"  keys with state {r['keys_with_state']}, pause {r['pause_seconds']} s "
                  f"(target <= 15 s at 10^5), steps since request "
                  f"{r['seconds_since_request']}, ok={r['ok']}", flush=True)
        print(f"machine load average at the end: {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores")
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
