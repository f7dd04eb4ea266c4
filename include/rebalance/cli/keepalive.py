"""``python -m rebalance.cli.keepalive --name NAME -- COMMAND...``: run a daemon and start it
again when it exits on its own (how the service runs Airflow's daemons).

The wrapper itself is :mod:`rebalance.ops.keepalive`'s; this is the command line.
"""

from __future__ import annotations

import argparse
import sys

from rebalance.ops.keepalive import Keepalive


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rebalance.cli.keepalive",
                                description="Run a daemon; start it again when it exits on "
                                            "its own (not on SIGTERM/SIGINT).")
    p.add_argument("--name", required=True, help="the daemon's name in the log lines")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the daemon's command")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given (after --)")
    return Keepalive(args.name, command).run()


if __name__ == "__main__":
    sys.exit(main())
