"""Command-line plumbing shared by the ``spark_apps/`` entry points (argparse -> library)."""

from __future__ import annotations

import argparse

from ..spark.session import parse_conf


def add_spark_options(parser: argparse.ArgumentParser) -> None:
    """``--master``, ``--conf key=value`` (repeatable) and ``--tables-root``."""
    group = parser.add_argument_group("Spark and storage")
    group.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    group.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                       help="extra Spark configuration (repeatable)")
    group.add_argument("--tables-root",
                       help="folder of the Delta tables (default: $REBALANCE_DATA_DIR/tables)")


def spark_from_args(args: argparse.Namespace, app_name: str):
    """The project session (:func:`rebalance.spark.session.get_spark`) for the parsed options."""
    from ..spark.session import get_spark

    return get_spark(app_name, master=args.master, conf=parse_conf(";".join(args.conf)))
