"""Run the keyed stateful streaming job over the Delta table ``events``.

    python spark_apps/keyed_job.py --instances 4                      # process what is there, stop
    python spark_apps/keyed_job.py --instances 4 --trigger-seconds 5  # run until stopped
    spark-submit spark_apps/keyed_job.py --instances 4

Writes ``results``, ``key_histograms``, ``instance_histograms`` and
``quarantine`` exactly once, routing keys by the latest published assignment. An event
whose ``event_id`` its key saw within the watermark is dropped and counted in
``instance_histograms.duplicates`` (``--no-dedup``: counted as a new event).
"""

from __future__ import annotations

import argparse
import sys

from rebalance.cli.job_options import (
    add_job_options,
    add_spark_options,
    job_config_from_args,
    spark_from_args,
)
from rebalance.spark.tables import AssignmentError, TableError
from rebalance.streaming.builtin import start_job
from rebalance.streaming.job import JobError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_job_options(p)
    add_spark_options(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = job_config_from_args(args)
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
