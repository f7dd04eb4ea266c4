"""``python -m rebalance.cli.class_data [--force | --describe | --java-options]`` (``make setup``).

The class-data archive itself is :mod:`rebalance.ops.class_data`'s; this is the command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rebalance.ops.class_data import build, describe, run_workload
from rebalance.spark.class_data import java_options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rebalance.cli.class_data",
        description="Build the class-data archive that makes the project's Spark JVMs "
                    "start faster (make setup runs this), or say what is in place.")
    parser.add_argument("--force", action="store_true", help="build it again")
    parser.add_argument("--describe", action="store_true", help="say what is in place")
    parser.add_argument("--java-options", action="store_true",
                        help="print the JVM options that map it (for spark-submit's "
                             "--driver-java-options; empty when there is no archive)")
    parser.add_argument("--workload", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workload:  # the run build() archives, in a fresh process
        run_workload(args.workload)
        return 0
    if args.java_options:
        print(java_options())
        return 0
    if args.describe:
        print(describe())
        return 0
    build(args.force)  # without one (a Java that cannot write it), JVMs start as before
    return 0


if __name__ == "__main__":
    sys.exit(main())
