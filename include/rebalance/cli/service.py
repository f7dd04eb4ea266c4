"""``rebalance service up|down|status`` (``make up`` / ``make down`` / ``make status``).

The processes themselves are :mod:`rebalance.ops.service`'s; this is the command line.
"""

from __future__ import annotations

import argparse
import sys

from rebalance.ops import service as service_module
from rebalance.ops.service import JOBS, SOURCES, Service, ServiceError, Settings


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser(
        "service", help="start, stop or inspect the whole service (make up / down / status)",
        description=service_module.__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--source", choices=SOURCES,
                   help="up: read events from the Delta table (default) or from a Kafka "
                        "broker the service runs; down / status: the one up recorded")
    p.add_argument("--job", choices=JOBS,
                   help="up: the built-in keyed job (default) or an example of examples/ "
                        "under rebalanced() (sessions, views: page views whose hot users can "
                        "be split, devices); down / status: the one up recorded")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    service = Service(Settings(source=args.source, job=args.job))
    if args.action == "down":
        stopped = service.down()
        print(f"stopped {len(stopped)} process(es); nothing of the service runs"
              if stopped else "nothing of the service was running")
        return 0
    if args.action == "status":
        states = service.status()
        for name, state in states.items():
            print(f"{name:14s} {state}")
        running = sum(s.startswith("running") for s in states.values())
        from rebalance.control.params import DAG_ID
        from rebalance.ops.health import service_lines

        for name, state in service_lines(service, states, DAG_ID):
            print(f"{name:14s} {state}")
        if running:
            user, password = service.login()
            print(f"UI: {service.s.api_url}  (login {user} / {password or '?'}); "
                  f"Rebalance view: {service.s.api_url}/rebalance/")
        return 0 if running in (0, len(states)) else 1
    from rebalance.spark.session import SparkSetupError  # e.g. a bad REBALANCE_SPARK_CONF

    try:
        service.up()
    except (ServiceError, SparkSetupError) as exc:
        print(f"rebalance service: error: {exc}", file=sys.stderr)
        return 2
    user, password = service.login()
    print(f"\nAirflow UI: {service.s.api_url}  login: {user} / {password}")
    print(f"Rebalance view: {service.s.api_url}/rebalance/   "
          f"(and the Rebalance tab of the `rebalance` DAG)")
    if service.s.events_source == "kafka":
        print(f"Events: Kafka topic {service.s.topic!r} at {service.s.bootstrap} "
              f"(broker data in {service.s.data / 'kafka'})")
    print(f"The `rebalance` DAG runs on schedule {service.s.schedule!r}; logs in {service.s.logs}")
    print("Stop everything with `make down`.")
    return 0
