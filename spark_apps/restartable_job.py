"""Run the keyed job as restartable generations: controlled restarts with state migration.

    python spark_apps/restartable_job.py --instances 4 --trigger-seconds 5
    spark-submit spark_apps/restartable_job.py --instances 4 --trigger-seconds 5

Routes by one pinned assignment version per generation and polls the Delta table
``restarts`` for requests (the DAG's ``apply_mode=restart``, or
``rebalance.streaming.restart.request_restart``): each is executed as stop at a
micro-batch boundary, state migration, restart, acknowledgement. Started after a
crash, it first completes (or rolls back) the unfinished restart. The quarantine
query is not run here (``keyed_job.py`` runs it; it is stateless).
"""

from __future__ import annotations

import argparse
import sys

from rebalance.spark.tables import AssignmentError, TableError
from rebalance.streaming.apps import (
    add_job_options, add_spark_options, job_config_from_args, spark_from_args)
from rebalance.streaming.job import JobError
from rebalance.streaming.restart import RestartableJob, RestartError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_job_options(p, trigger_seconds=5.0,
                    instances_help="instances N of generation 0 (later generations take N "
                                   "from requests)")
    p.add_argument("--poll-seconds", type=float, default=5.0,
                   help="how often the restarts table is read for requests")
    add_spark_options(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = job_config_from_args(args)
        job = RestartableJob(spark_from_args(args, f"rebalance-{args.name}"), config)
        generation = job.start()
    except (JobError, TableError, AssignmentError, RestartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"generation {generation.number} running: assignment version "
          f"{generation.assignment_version}, {generation.n_instances} instances")
    try:
        job.run_forever(args.poll_seconds)
    except KeyboardInterrupt:
        job.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
