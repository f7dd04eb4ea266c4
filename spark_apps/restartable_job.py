"""Run the keyed job as restartable generations: controlled restarts with state migration.

    python spark_apps/restartable_job.py --instances 4 --trigger-seconds 5
    python spark_apps/restartable_job.py --source kafka --bootstrap-servers 127.0.0.1:9092 \
        --topic events --instances 4
    spark-submit spark_apps/restartable_job.py --instances 4 --trigger-seconds 5

Each generation follows the latest assignment version at every micro-batch (a live
switch is used from the next micro-batch; ``--pin-assignment`` keeps each
generation's own version instead) and the job polls the Delta table
``restarts`` for requests (the DAG's ``apply_mode=restart``, or
``rebalance.streaming.restart.request_restart``): each is executed as stop at a
micro-batch boundary, state migration (same N: only the moved keys' state, handed over
inside the stream of the same checkpoint; another N: a new checkpoint seeded with the
re-keyed state, its source starting exactly after the old checkpoint's last committed
Delta file or Kafka offsets), restart, acknowledgement. Started after a
crash, it first completes (or rolls back) the unfinished restart. The quarantine
query is not run here (``keyed_job.py`` runs it; it is stateless).
"""

from __future__ import annotations

import argparse
import re
import sys

from pyspark.errors import StreamingQueryException

from rebalance.cli.job_options import (
    add_job_options,
    add_spark_options,
    job_config_from_args,
    spark_from_args,
)
from rebalance.spark.tables import AssignmentError, TableError
from rebalance.streaming.job import JobError
from rebalance.streaming.restart import RestartableJob, RestartError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_job_options(p, trigger_seconds=5.0,
                    instances_help="instances N of generation 0 (later generations take N "
                                   "from requests)")
    p.add_argument("--poll-seconds", type=float, default=5.0,
                   help="how often the restarts table is read for requests")
    p.add_argument("--pin-assignment", action="store_true",
                   help="route each generation by the version it started with (ignore live "
                        "switches) instead of following the latest version")
    p.add_argument("--full-restart", action="store_true",
                   help="restart on a new checkpoint seeded with the whole re-keyed state "
                        "even when N stays (default: keep the checkpoint and hand the moved "
                        "keys' state over inside the stream)")
    p.add_argument("--hold-seconds", type=float, default=60.0,
                   help="after refusing a batch routed by a version published for a restart "
                        "(or another N), wait this long for its request before resuming with "
                        "the version in force")
    add_spark_options(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = job_config_from_args(args)
        job = RestartableJob(spark_from_args(args, f"rebalance-{args.name}"), config,
                             pin_assignment=args.pin_assignment,
                             hold_seconds=args.hold_seconds, full_restart=args.full_restart)
        generation = job.start()
    except (JobError, TableError, AssignmentError, RestartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"generation {generation.number} running: assignment version "
          f"{generation.assignment_version}"
          f"{' (pinned)' if args.pin_assignment else ' (following the latest)'}, "
          f"{generation.n_instances} instances")
    try:
        job.run_forever(args.poll_seconds)
    except KeyboardInterrupt:
        job.stop()
    except StreamingQueryException as exc:  # e.g. a full disk: one line, the root cause
        print(f"error: the keyed query stopped: {root_cause(exc)}", file=sys.stderr)
        return 1
    return 0


def root_cause(exc: BaseException) -> str:
    """The deepest ``...Exception: message`` line of a query's failure (its first line if none)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line.removeprefix("Caused by: ") for line in lines
              if re.search(r"\w(Exception|Error)(\b|:)", line) and not line.startswith("at ")]
    return (causes[-1] if causes else lines[0] if lines else type(exc).__name__)[:500]


if __name__ == "__main__":
    sys.exit(main())
