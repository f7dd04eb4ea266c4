"""The sessionization example (``examples/sessions.py``) over the service's events.

    python spark_apps/sessions_job.py --instances 4 --trigger-seconds 10

What ``make up JOB=sessions`` runs as its job: the events table the generator writes is
read as clicks (``key`` as the user, ``event_time`` as the click time), the example's
``Sessionize`` processor runs unchanged under ``rebalanced()``, sessions go to the Delta
table ``<data>/output/sessions``, and the query takes every assignment the DAG publishes,
moving each moved user's open session and timer with it.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from rebalance.streaming.apps import add_spark_options, spark_from_args

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sessions.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=int, default=4, help="instances N")
    p.add_argument("--window-seconds", type=float, default=20.0, help="histogram window")
    p.add_argument("--watermark-seconds", type=float, default=10.0,
                   help="allowed lateness of a click")
    p.add_argument("--trigger-seconds", type=float, default=10.0, help="micro-batch interval")
    p.add_argument("--name", default="sessions", help="job name (checkpoint, jobs table)")
    p.add_argument("--checkpoint-root",
                   help="folder of the checkpoints (default: $REBALANCE_DATA_DIR/checkpoints)")
    add_spark_options(p)
    args = p.parse_args(argv)
    if args.instances < 1 or min(args.window_seconds, args.trigger_seconds) <= 0 \
            or args.watermark_seconds < 0:
        p.error("--instances must be >= 1, --window-seconds and --trigger-seconds > 0, "
                "--watermark-seconds >= 0")
    return args


def _example():
    """examples/sessions.py as a module (not importable by name: pickled by value)."""
    spec = importlib.util.spec_from_file_location("example_sessions", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pyspark.sql import functions as F

    from rebalance.spark import tables
    from rebalance.spark.paths import data_dir
    from rebalance.streaming.keyed_state import ContractError
    from rebalance.streaming.rebalanced import rebalanced

    sessions = _example()
    spark = spark_from_args(args, f"rebalance-{args.name}")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    events = tables.EVENTS.path(args.tables_root)
    clicks = (spark.readStream.format("delta").load(events)
              .select(F.col("key").alias("user_id"), F.lit("event").alias("page"),
                      F.to_timestamp("event_time").alias("click_time"))
              .where(F.col("user_id").isNotNull() & F.col("click_time").isNotNull())
              .withWatermark("click_time", f"{args.watermark_seconds:g} seconds"))
    checkpoints = Path(args.checkpoint_root or data_dir() / "checkpoints")
    try:
        job = rebalanced(clicks, key="user_id", processor=sessions.Sessionize(),
                         output_schema=sessions.SESSION_SCHEMA, time_mode="EventTime",
                         event_time="click_time", job=args.name, instances=args.instances,
                         tables_root=args.tables_root, window_seconds=args.window_seconds)
        query = job.start(output=str(data_dir() / "output" / args.name),
                          checkpoint=str(checkpoints / args.name),
                          trigger_seconds=args.trigger_seconds)
    except ContractError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.name} running: assignment version {query.version}, {args.instances} "
          "instances (following the latest)", flush=True)
    try:
        query.follow()
    except KeyboardInterrupt:
        query.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
