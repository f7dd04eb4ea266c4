"""``rebalance advise`` on a real trace: how long it takes, and whether its theta holds.

    make traces && .venv/bin/python include/benchmarks/advise_benchmark.py [--runs 3] [--days 31]

Writes the first ``--days`` daily windows of ``nyc-tailnum`` (NYC 2013 flights per aircraft
per day, N = 32, theta = 0.05) to a CSV, runs ``rebalance advise`` on it ``--runs`` times,
each a process of its own (the first one cold), and prints each run's wall time, the
median and the worst, and the advice. Then it backtests the default policy at the theta
the advice says holds and prints the share of days it keeps (the advice's claim, checked
by the backtest alone).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRACE, N, THETA = "nyc-tailnum", 32, 0.05


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--days", type=int, default=31, help="daily windows replayed (<= 365)")
    args = p.parse_args(argv)
    if args.runs < 1 or not 2 <= args.days <= 365:
        p.error("--runs must be >= 1 and --days in [2, 365]")

    from benchmarks import traces

    counts = traces.load(TRACE, windows=args.days).rename(columns={"window": "window_start"})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{TRACE}.csv"
        counts.to_csv(path, index=False)
        command = [str(Path(sys.executable).with_name("rebalance")), "advise", str(path),
                   "--instances", str(N), "--theta", str(THETA)]
        print("command: rebalance advise <trace csv>", " ".join(command[3:]))
        walls, output = [], ""
        for run in range(args.runs):
            t0 = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            walls.append(time.perf_counter() - t0)
            output = done.stdout
            print(f"run {run + 1}{' (cold)' if run == 0 else ''}: {walls[-1]:.1f} s")
        print(f"{args.days} windows: median {statistics.median(walls):.1f} s, worst "
              f"{max(walls):.1f} s over {args.runs} run(s)")
        print(output.rstrip())
        found = re.search(r"the smallest theta that holds: ([0-9.]+)", output)
        if found:
            check = subprocess.run(
                [command[0], "backtest", str(path), "--instances", str(N), "--theta",
                 found.group(1), "--history", "6", "--policies", "auto"],
                capture_output=True, text=True, check=True).stdout
            row = next(line for line in check.splitlines() if line.split()[:1] == ["auto"])
            print(f"backtest at theta {found.group(1)}: auto keeps "
                  f"{float(row.split()[2]):.1%} of the judged days")
    return 0


if __name__ == "__main__":
    sys.exit(main())
