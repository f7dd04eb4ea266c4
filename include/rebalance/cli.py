"""The ``rebalance`` command.

Each capability contributes its subcommands from its own module: a module listed in
``COMMAND_MODULES`` defines ``add_subcommands(subparsers)``, which adds parsers whose
defaults carry ``func(args) -> int`` (the exit code). Modules are imported when the parser
is built; heavy imports (Spark, PuLP) stay inside the ``func`` bodies so that
``rebalance --help`` is quick.

Errors the user can fix (bad input, bad parameters) are raised as ``UserError`` (or
``ValueError`` subclasses such as :class:`~rebalance.model.PlanningError`) and printed as one
line ``rebalance <command>: error: <message>`` with exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import import_module

from . import __version__

# module (relative to this package) -> defines add_subcommands(subparsers)
COMMAND_MODULES: tuple[str, ...] = (
    "plan_cli",
    "audit",
    "apply_cli",
    "evaluation.cli",
    "service",
    "kafka",
    "cluster",
    "airflow_client",
)


class UserError(ValueError):
    """An error in the user's input or parameters: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rebalance",
        description="Plan, validate, publish and apply key-to-instance assignments that keep "
                    "keyed stateful stream jobs balanced.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        import_module(f"{__package__}.{name}").add_subcommands(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # UserError, PlanningError, ... : one clear line
        print(f"rebalance {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
