"""An example processor of ``examples/`` over the service's events, under ``rebalanced()``.

    python spark_apps/example_job.py --example sessions --instances 4 --trigger-seconds 10

What ``make up JOB=<example>`` runs as its job. The events table the generator writes is
read as the example's input, the example's processor runs unchanged under
``rebalanced()``, its rows go to the Delta table ``<data>/output/<name>``, and the query
takes every assignment the DAG publishes (moving each moved key's state with it):

* ``sessions`` (examples/sessions.py): ``key`` as the user, ``event_time`` as the click;
* ``views`` (examples/page_views.py): the same clicks; its ``Merge`` lets plans split
  hot users (the DAG's ``split_keys``);
* ``devices`` (examples/device_readings.py): ``key`` as the device, ``event_id`` as the
  reading id, ``value`` as the reading (ProcessingTime, TTL).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from rebalance.cli.job_options import add_spark_options, spark_from_args

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"


@dataclass(frozen=True)
class Example:
    """How an example reads the service's events and runs."""

    file: str
    processor: str
    output_schema: str
    key: str
    time_mode: str
    event_time: str
    merge: str | None = None


EXAMPLES = {
    "sessions": Example("sessions.py", "Sessionize", "SESSION_SCHEMA", "user_id", "EventTime",
                        "click_time"),
    "views": Example("page_views.py", "PageViews", "VIEWS_SCHEMA", "user_id", "EventTime",
                     "click_time", merge="MERGE"),
    "devices": Example("device_readings.py", "DedupAverage", "AVERAGE_SCHEMA", "device_id",
                       "ProcessingTime", "reading_time"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--example", choices=sorted(EXAMPLES), required=True)
    p.add_argument("--instances", type=int, default=4, help="instances N")
    p.add_argument("--window-seconds", type=float, default=20.0, help="histogram window")
    p.add_argument("--watermark-seconds", type=float, default=10.0,
                   help="allowed lateness of an event (EventTime examples)")
    p.add_argument("--trigger-seconds", type=float, default=10.0, help="micro-batch interval")
    p.add_argument("--name", help="job name (checkpoint, jobs table); default: the example's")
    p.add_argument("--events-root",
                   help="folder of the tables holding the events table (default: "
                        "--tables-root): a second job over the first job's events")
    p.add_argument("--checkpoint-root",
                   help="folder of the checkpoints (default: $REBALANCE_DATA_DIR/checkpoints)")
    add_spark_options(p)
    args = p.parse_args(argv)
    if args.instances < 1 or min(args.window_seconds, args.trigger_seconds) <= 0 \
            or args.watermark_seconds < 0:
        p.error("--instances must be >= 1, --window-seconds and --trigger-seconds > 0, "
                "--watermark-seconds >= 0")
    args.name = args.name or args.example
    return args


def _module(example: Example):
    """The example's file as a module (not importable by name: pickled by value)."""
    spec = importlib.util.spec_from_file_location(f"example_{Path(example.file).stem}",
                                                  EXAMPLES_DIR / example.file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _input(spark, name: str, events_path: str, watermark_seconds: float):
    """The service's events as the example's input."""
    from pyspark.sql import functions as F

    events = spark.readStream.format("delta").load(events_path)
    when = F.to_timestamp("event_time")
    if name == "devices":
        return (events.select(F.col("key").alias("device_id"),
                              F.col("event_id").alias("reading_id"),
                              F.col("value").cast("double").alias("value"),
                              when.alias("reading_time"))
                .where(F.col("device_id").isNotNull() & F.col("reading_id").isNotNull()
                       & F.col("reading_time").isNotNull()))
    return (events.select(F.col("key").alias("user_id"), F.lit("event").alias("page"),
                          when.alias("click_time"))
            .where(F.col("user_id").isNotNull() & F.col("click_time").isNotNull())
            .withWatermark("click_time", f"{watermark_seconds:g} seconds"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rebalance.spark import tables
    from rebalance.spark.paths import data_dir
    from rebalance.streaming.keyed_state import ContractError
    from rebalance.streaming.rebalanced import rebalanced

    example = EXAMPLES[args.example]
    module = _module(example)
    spark = spark_from_args(args, f"rebalance-{args.name}")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    source = _input(spark, args.example, tables.EVENTS.path(args.events_root or args.tables_root),
                    args.watermark_seconds)
    checkpoints = Path(args.checkpoint_root or data_dir() / "checkpoints")
    try:
        job = rebalanced(source, key=example.key, processor=getattr(module, example.processor)(),
                         output_schema=getattr(module, example.output_schema),
                         time_mode=example.time_mode, event_time=example.event_time,
                         job=args.name, instances=args.instances, tables_root=args.tables_root,
                         window_seconds=args.window_seconds,
                         merge=getattr(module, example.merge) if example.merge else None)
        query = job.start(output=str(data_dir() / "output" / args.name),
                          checkpoint=str(checkpoints / args.name),
                          trigger_seconds=args.trigger_seconds)
    except ContractError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.name} running: assignment version {query.version}, {query.instances} "
          "instances (following the latest)", flush=True)
    try:
        query.follow()
    except KeyboardInterrupt:
        query.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
