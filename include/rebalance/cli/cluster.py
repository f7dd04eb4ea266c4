"""``rebalance cluster up|down|status`` (also ``python -m rebalance.cli.cluster up|down|status``).

The cluster itself is :mod:`rebalance.ops.cluster`'s; this is the command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rebalance.ops import cluster as cluster_module
from rebalance.ops.cluster import DEFAULT_PORT, Cluster, ClusterSettings


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser(
        "cluster", help="start, stop or inspect a local Spark standalone cluster",
        description=cluster_module.__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--dir", type=Path, help="the cluster's folder (default: $REBALANCE_DATA_DIR/cluster)")
    p.add_argument("--port", type=int, help=f"master port (default {DEFAULT_PORT})")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cores", type=int, default=1, help="cores per worker")
    p.add_argument("--memory", default="2g", help="memory per worker")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    kw = {k: v for k, v in (("dir", args.dir), ("port", args.port)) if v is not None}
    cluster = Cluster(ClusterSettings(workers=args.workers, cores=args.cores,
                                      memory=args.memory, **kw))
    if args.action == "down":
        if not cluster.down():
            print("the cluster was not running")
        return 0
    if args.action == "status":
        for name, state in cluster.status().items():
            print(f"{name:16s} {state}")
        return 0 if cluster.running() else 1
    cluster.up()
    print(f"cluster running: master {cluster.master_url}, {args.workers} worker(s) of "
          f"{args.cores} core(s); stop with `rebalance cluster down`")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m rebalance.cli.cluster up|down|status [options]``."""
    parser = argparse.ArgumentParser(prog="rebalance")
    add_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["cluster", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except ValueError as exc:  # ClusterError: one line
        print(f"rebalance cluster: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
