"""The ``rebalance`` command.

Each capability contributes its subcommands from its own module: a module listed in
``COMMAND_MODULES`` defines ``add_subcommands(subparsers)``, which adds parsers whose
defaults carry ``func(args) -> int`` (the exit code). Modules are imported when the parser
is built; heavy imports (Spark, PuLP) stay inside the ``func`` bodies so that
``rebalance --help`` is quick.

``rebalance --job NAME <command>`` runs the command as the registry's job ``NAME`` (its
tables, its DAG: :func:`rebalance.core.registry.job_scope`).

Errors the user can fix (bad input, bad parameters) are raised as ``UserError`` (or
``ValueError`` subclasses such as :class:`~rebalance.core.model.PlanningError`) and printed as one
line ``rebalance <command>: error: <message>`` with exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import signal
import sys
from importlib import import_module

from rebalance import __version__

# module (under ``rebalance``) -> defines add_subcommands(subparsers)
COMMAND_MODULES: tuple[str, ...] = (
    "cli.plan",
    "cli.backtest",
    "cli.advise",
    "cli.audit",
    "cli.apply",
    "cli.evaluate",
    "cli.service",
    "cli.kafka",
    "cli.cluster",
    "cli.trigger",
)


class UserError(ValueError):
    """An error in the user's input or parameters: printed as one line, exit code 2."""


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so that every ``finally`` (temporary
    folders, staged plan files) runs as it does for Ctrl-C."""


class _ArgumentError(Exception):
    """argparse refused the command line (already printed as one line)."""


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one stderr line (no usage block), exit code 2.

    Subparsers inherit the class (``add_subparsers`` uses the parent's type)."""

    def error(self, message: str):  # type: ignore[override]
        text = " ".join(str(message).split())
        if text.startswith("unrecognized arguments") and "--job" in text.split():
            text += " (--job NAME goes before the command: rebalance --job NAME <command>)"
        print(f"{self.prog}: error: {text}", file=sys.stderr)
        raise _ArgumentError(text)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="rebalance",
        description="Plan, validate, publish and apply key-to-instance assignments that keep "
                    "keyed stateful stream jobs balanced.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.add_argument("--job", dest="registry_job", metavar="NAME",
                        help="the registry's job whose tables and DAG the command reads and "
                             "writes (rebalance.toml, REBALANCE_REGISTRY; default: the "
                             "tables under REBALANCE_DATA_DIR, the first job's)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        import_module(f"rebalance.{name}").add_subcommands(subparsers)
    for sub in subparsers.choices.values():
        sub.description = for_users(sub.description)
    return parser


def for_users(text: str | None) -> str | None:
    """A docstring as ``--help`` shows it: Sphinx roles and reST literals become plain
    text (``:mod:`rebalance.x``` -> rebalance.x, double backquotes -> single)."""
    if not text:
        return text
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text).replace("``", "`")


@contextlib.contextmanager
def job_scope(name: str):
    """``rebalance --job NAME``: the registry's job ``NAME`` as the current one for the
    command (:func:`rebalance.core.registry.job_scope`); an unknown job or a bad registry
    are refused before the command runs."""
    from rebalance.core import registry

    job = registry.load().job(name)
    with registry.job_scope(job):
        yield job


def _on_sigterm(signum, frame):  # pragma: no cover - exercised in a subprocess
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _ArgumentError:
        return 2
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    if not getattr(args, "func", None):
        print("rebalance: error: a command is required (`rebalance --help` lists them)",
              file=sys.stderr)
        return 2
    try:  # SIGTERM cleans up like SIGINT (only the main thread may set a handler)
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:
        return _run(args)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if getattr(args, "registry_job", None) is None:
            return int(args.func(args) or 0)
        with job_scope(args.registry_job):
            return int(args.func(args) or 0)
    except ValueError as exc:  # UserError, PlanningError, RegistryError ... : one clear line
        print(f"rebalance {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RecursionError:  # input nested too deeply for a check that recursed
        print(f"rebalance {args.command}: error: input nested too deeply to read",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Terminated:
        return 143
