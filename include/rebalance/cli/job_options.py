"""The options shared by the ``spark_apps/`` entry points (argparse -> library): Spark and
storage, the keyed job's, its source's."""

from __future__ import annotations

import argparse
import signal
import threading

from rebalance.spark.session import parse_conf


def add_spark_options(parser: argparse.ArgumentParser) -> None:
    """``--master``, ``--conf key=value`` (repeatable) and ``--tables-root``."""
    group = parser.add_argument_group("Spark and storage")
    group.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    group.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                       help="extra Spark configuration (repeatable)")
    group.add_argument("--tables-root",
                       help="folder of the Delta tables (default: $REBALANCE_DATA_DIR/tables)")


def spark_from_args(args: argparse.Namespace, app_name: str):
    """The project session (:func:`rebalance.spark.session.get_spark`) for the parsed options.

    Ctrl-C (SIGINT, also what ``make down`` sends) then raises KeyboardInterrupt and nothing
    else: PySpark's own handler first cancels every running Spark job, so a streaming
    query's batch failed inside its ``foreachBatch`` before the app could stop the query
    between batches (and Spark's check of that failure overflowed the stream thread's
    stack: docs/streaming.md)."""
    from rebalance.spark.session import get_spark

    spark = get_spark(app_name, master=args.master, conf=parse_conf(";".join(args.conf)))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return spark


def add_job_options(parser: argparse.ArgumentParser, *, trigger_seconds: float | None = None,
                    instances_help: str = "instances N (= shuffle partitions of the stateful "
                                          "operator)") -> None:
    """The keyed job's options (:class:`~rebalance.streaming.job.JobConfig`), shared by the
    entry points in ``spark_apps/``; ``trigger_seconds`` is the default micro-batch interval
    (None: process what is available and stop)."""
    from rebalance.streaming.job import JobConfig

    d = JobConfig()
    group = parser.add_argument_group("keyed job")
    group.add_argument("--instances", type=int, default=d.n_instances, help=instances_help)
    group.add_argument("--window-seconds", type=float, default=d.window_seconds,
                       help="histogram and aggregation window length")
    group.add_argument("--windows", type=int, default=d.n_windows,
                       help="w: the sliding aggregate covers the last w windows")
    group.add_argument("--watermark-seconds", type=float, default=d.watermark_seconds,
                       help="allowed event-time lateness")
    group.add_argument("--no-histograms", action="store_true",
                       help="do not emit histograms (restartable_job.py only)")
    group.add_argument("--no-window-results", action="store_true",
                       help="do not merge closed windows into window_results")
    group.add_argument("--max-files-per-trigger", type=int,
                       help="limit a micro-batch's input files")
    group.add_argument("--trigger-seconds", type=float, default=trigger_seconds,
                       help="micro-batch interval"
                            + ("" if trigger_seconds else
                               "; without it, process what is available and stop"))
    group.add_argument("--name", default=d.name,
                       help="job name (checkpoint folder, query names, restart requests)")
    group.add_argument("--checkpoint-root",
                       help="folder of the checkpoints (default: $REBALANCE_DATA_DIR/checkpoints)")
    group.add_argument("--dedup", action=argparse.BooleanOptionalAction, default=d.dedup,
                       help="drop events whose event_id their key saw within the watermark "
                            "(producer retries), counted in instance_histograms.duplicates "
                            "(default: on; can be switched for an existing checkpoint)")
    src = parser.add_argument_group("source")
    src.add_argument("--source", choices=("delta", "kafka"), default=d.source,
                     help="read the Delta table events (default) or a Kafka topic")
    src.add_argument("--bootstrap-servers", metavar="HOST:PORT",
                     help="Kafka bootstrap servers (--source kafka)")
    src.add_argument("--topic", help="Kafka topic of the events (--source kafka)")
    src.add_argument("--max-offsets-per-trigger", type=int,
                     help="limit a micro-batch's Kafka messages")


def job_config_from_args(args: argparse.Namespace):
    """The :class:`~rebalance.streaming.job.JobConfig` of options added by
    :func:`add_job_options` (validated by JobConfig itself)."""
    from rebalance.streaming.job import JobConfig

    return JobConfig(
        n_instances=args.instances, window_seconds=args.window_seconds,
        n_windows=args.windows, watermark_seconds=args.watermark_seconds,
        emit_histograms=not args.no_histograms,
        max_files_per_trigger=args.max_files_per_trigger,
        trigger_seconds=args.trigger_seconds, name=args.name,
        tables_root=args.tables_root, checkpoint_root=args.checkpoint_root,
        source=args.source, bootstrap_servers=args.bootstrap_servers, topic=args.topic,
        max_offsets_per_trigger=args.max_offsets_per_trigger, dedup=args.dedup,
        window_results=not args.no_window_results)
