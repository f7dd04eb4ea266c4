"""Append batches of a skewed, fluctuating keyed event stream to the Delta table ``events``
(or produce them to a Kafka topic).

    python spark_apps/generate_events.py --batches 10 --keys 1000 --zipf 1.0 --fluctuation 1.0
    python spark_apps/generate_events.py --batches 10 --sink kafka \
        --bootstrap-servers 127.0.0.1:9092 --topic events
    spark-submit spark_apps/generate_events.py --batches 10

Each batch is one Delta commit; a new run continues after the last batch in the
table (same options required), so the stream stays a pure function of them; a batch
already in the table is not appended again. To Kafka, batches start at --start-batch
(default 0) and are sent at least once (a re-run sends them again). --follow runs forever
to either sink (to Kafka it records its stream in <tables root>/_kafka_follow/<topic>.json
and a restart continues after the last batch produced).
"""

from __future__ import annotations

import argparse
import sys

from rebalance.cli.job_options import add_spark_options, spark_from_args
from rebalance.spark.tables import EVENTS, TableError, ensure_table
from rebalance.streaming.generator import (
    EventGenerator,
    GeneratorConfig,
    GeneratorError,
    append_batches,
    follow,
    follow_start,
    kafka_follow_record,
    kafka_follow_start,
    kafka_follower,
    next_batch,
    produce_batches,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = GeneratorConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=10, help="batches to append (default 10)")
    p.add_argument("--start-batch", type=int,
                   help="first batch number (default: after the last one in the table)")
    p.add_argument("--keys", type=int, default=d.n_keys, help="key count K")
    p.add_argument("--zipf", type=float, default=d.zipf, help="Zipf exponent z")
    p.add_argument("--events-per-batch", type=int, default=d.events_per_batch)
    p.add_argument("--batch-seconds", type=float, default=d.batch_seconds,
                   help="event-time span of one batch")
    p.add_argument("--fluctuation", type=float, default=d.fluctuation,
                   help="the fluctuation f (Fang et al.): load change per interval, in mean loads (0: none)")
    p.add_argument("--interval-batches", type=int, default=d.interval_batches,
                   help="batches per fluctuation interval")
    p.add_argument("--instances", type=int, default=d.n_instances,
                   help="instances whose loads the fluctuation model changes")
    p.add_argument("--cost-sigma", type=float, default=d.cost_sigma,
                   help="log-normal shape of per-event cost, mean 1 (0: every cost is 1)")
    p.add_argument("--malformed-fraction", type=float, default=d.malformed_fraction)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--start-time", help="event time of batch 0 (ISO-8601; default "
                   f"{d.start}, with --follow: the recorded one, else now)")
    p.add_argument("--sink", choices=("delta", "kafka"), default="delta",
                   help="append to the Delta table events (default) or produce to Kafka")
    p.add_argument("--bootstrap-servers", metavar="HOST:PORT", help="Kafka (--sink kafka)")
    p.add_argument("--topic", help="Kafka topic (--sink kafka)")
    p.add_argument("--duplicate-fraction", type=float, default=0.0,
                   help="--sink kafka: send this fraction of each batch's events twice "
                        "(a producer's retries)")
    p.add_argument("--follow", action="store_true",
                   help="run forever, appending each batch in real time once its events are "
                        "due (the service's live source); --batches is then ignored")
    add_spark_options(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.batches < 1 and not args.follow:
        print("error: --batches must be >= 1", file=sys.stderr)
        return 2
    problem = _sink_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        config = GeneratorConfig(
            n_keys=args.keys, zipf=args.zipf, events_per_batch=args.events_per_batch,
            batch_seconds=args.batch_seconds, fluctuation=args.fluctuation,
            interval_batches=args.interval_batches, n_instances=args.instances,
            cost_sigma=args.cost_sigma, malformed_fraction=args.malformed_fraction,
            seed=args.seed, start=args.start_time or GeneratorConfig().start)
        spark = spark_from_args(args, "rebalance-generate-events")
        if args.follow:
            return _follow(spark, config, args)
        if args.sink == "kafka":
            first = args.start_batch or 0
            produced = produce_batches(spark, EventGenerator(config),
                                       range(first, first + args.batches),
                                       args.bootstrap_servers, args.topic,
                                       args.duplicate_fraction)
            print(f"produced batches {produced[0]}..{produced[-1]} "
                  f"({config.events_per_batch} events each) to topic {args.topic} at "
                  f"{args.bootstrap_servers}")
            return 0
        first = (args.start_batch if args.start_batch is not None
                 else next_batch(spark, config, args.tables_root))
        asked = range(first, first + args.batches)
        written = append_batches(spark, EventGenerator(config), asked, args.tables_root)
    except (GeneratorError, TableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{_summary(written, asked)} ({config.events_per_batch} events each) to "
          f"{EVENTS.path(args.tables_root)}")
    return 0


def _sink_problem(args: argparse.Namespace) -> str | None:
    if args.sink == "kafka":
        if not (args.bootstrap_servers and args.topic):
            return "--sink kafka needs --bootstrap-servers HOST:PORT and --topic"
        if not 0 <= args.duplicate_fraction <= 1:
            return "--duplicate-fraction must be in [0, 1]"
    elif args.bootstrap_servers or args.topic or args.duplicate_fraction:
        return "--bootstrap-servers, --topic and --duplicate-fraction are for --sink kafka"
    return None


def _summary(written: list[int], asked: range) -> str:
    """What was appended, truthfully: batches already in the table are not appended again."""
    if not written:
        return f"appended nothing: batches {asked[0]}..{asked[-1]} are already in the table"
    spans, start = [], written[0]
    for prev, cur in zip(written, [*written[1:], None]):
        if cur != prev + 1:
            spans.append(f"{start}..{prev}" if prev != start else f"{prev}")
            start = cur
    skipped = len(asked) - len(written)
    return (f"appended batches {', '.join(spans)}"
            + (f" ({skipped} already in the table, skipped)" if skipped else ""))


def _follow(spark, config: GeneratorConfig, args: argparse.Namespace) -> int:
    import dataclasses

    write, first, verb = None, 0, "appended"
    if args.sink == "kafka":
        # The stream's start and last batch are recorded next to the tables, so that a
        # restarted generator continues the same stream (same event ids and times).
        record = kafka_follow_record(args.tables_root, args.topic)
        start, first = kafka_follow_start(config, record)
        if not args.start_time:
            config = dataclasses.replace(config, start=start)
        write = kafka_follower(spark, args.bootstrap_servers, args.topic, record)
        where, verb = f"topic {args.topic} at {args.bootstrap_servers}", "produced"
    else:
        if not args.start_time:
            config = dataclasses.replace(config, start=follow_start(spark, config,
                                                                    args.tables_root))
        ensure_table(spark, EVENTS, args.tables_root)  # the job may start before a batch
        where = EVENTS.path(args.tables_root)
    print(f"following: {config.events_per_batch} events every {config.batch_seconds:g} s from "
          f"{config.start} into {where}", flush=True)
    try:
        follow(spark, config, args.tables_root, write=write, first=first,
               on_batch=lambda b: print(f"batch {b} {verb}", flush=True) if b % 12 == 0 else None)
    except KeyboardInterrupt:
        print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
