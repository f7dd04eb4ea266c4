"""Run the keyed stateful streaming job over the Delta table ``events``.

    python spark_apps/keyed_job.py --instances 4                      # process what is there, stop
    python spark_apps/keyed_job.py --instances 4 --trigger-seconds 5  # run until stopped
    spark-submit spark_apps/keyed_job.py --instances 4

Writes ``results``, ``key_histograms``, ``instance_histograms`` and
``quarantine`` exactly once, routing keys by the latest published assignment.
"""

from __future__ import annotations

import argparse
import sys

from rebalance.spark.tables import AssignmentError, TableError
from rebalance.streaming.apps import add_spark_options, spark_from_args
from rebalance.streaming.job import JobConfig, JobError, start_job


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = JobConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=int, default=d.n_instances,
                   help="instances N (= shuffle partitions of the stateful operator)")
    p.add_argument("--window-seconds", type=float, default=d.window_seconds,
                   help="histogram and aggregation window length")
    p.add_argument("--windows", type=int, default=d.n_windows,
                   help="w: the sliding aggregate covers the last w windows")
    p.add_argument("--watermark-seconds", type=float, default=d.watermark_seconds,
                   help="allowed event-time lateness")
    p.add_argument("--no-histograms", action="store_true", help="do not emit histograms")
    p.add_argument("--work-us-per-cost", type=float, default=d.work_us_per_cost,
                   help="simulated CPU work per unit of event cost (benchmarks)")
    p.add_argument("--max-files-per-trigger", type=int, help="limit a micro-batch's input files")
    p.add_argument("--trigger-seconds", type=float,
                   help="micro-batch interval; without it, process what is available and stop")
    p.add_argument("--name", default=d.name, help="job name (checkpoint folder, query names)")
    p.add_argument("--checkpoint-root",
                   help="folder of the checkpoints (default: $REBALANCE_DATA_DIR/checkpoints)")
    add_spark_options(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = JobConfig(
            n_instances=args.instances, window_seconds=args.window_seconds,
            n_windows=args.windows, watermark_seconds=args.watermark_seconds,
            emit_histograms=not args.no_histograms, work_us_per_cost=args.work_us_per_cost,
            max_files_per_trigger=args.max_files_per_trigger,
            trigger_seconds=args.trigger_seconds, name=args.name,
            tables_root=args.tables_root, checkpoint_root=args.checkpoint_root)
        job = start_job(spark_from_args(args, f"rebalance-{args.name}"), config)
    except (JobError, TableError, AssignmentError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        job.await_termination()
    except KeyboardInterrupt:
        job.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
