"""``rebalance kafka up|down|status|run`` (``make kafka-up`` / ``make kafka-down``).

The broker itself is :mod:`rebalance.ops.kafka`'s; this is the command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rebalance.ops import kafka as kafka_module
from rebalance.ops.kafka import DEFAULT_PORT, Broker, BrokerSettings, KafkaError


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser(
        "kafka", help="start, stop or inspect a local single-node Kafka broker (KRaft)",
        description=kafka_module.__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("up", "down", "status", "run"),
                   help="run: the broker in the foreground (what `make up SOURCE=kafka` starts)")
    p.add_argument("--dir", type=Path, help="the broker's folder (default: $REBALANCE_DATA_DIR/kafka)")
    p.add_argument("--port", type=int, help=f"client port (default {DEFAULT_PORT}, "
                   "$REBALANCE_KAFKA_PORT); the controller listens on port + 1")
    p.add_argument("--partitions", type=int, default=2, help="partitions of auto-created topics")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    kw = {k: v for k, v in (("dir", args.dir), ("port", args.port)) if v is not None}
    broker = Broker(BrokerSettings(partitions=args.partitions, **kw))
    if args.action == "down":
        if not broker.down():  # (a stop is reported by the service's records)
            print("kafka was not running")
        return 0
    if args.action == "status":
        print(f"kafka {broker.status()}; bootstrap servers {broker.bootstrap}")
        return 0 if broker.running() else 1
    if args.action == "run":
        try:
            broker.run()
        except KafkaError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    started = broker.up()
    print(f"kafka {'started' if started else 'already running'}: bootstrap servers "
          f"{broker.bootstrap}, data in {broker.s.dir}; stop with `make kafka-down`")
    return 0
