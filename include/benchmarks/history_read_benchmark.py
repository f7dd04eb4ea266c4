"""What reading a Delta table's history costs as the table ages: whole against paged.

    .venv/bin/python include/benchmarks/history_read_benchmark.py --commits 250 1000 2000

The service commits to ``events`` every generator batch (8 640 a day at the default
10 s) and to ``assignments`` every apply. Code that looks for a recent commit (the
generator's newest batch, a plan's publish, the newest assignment versions) pages newest
first (:func:`rebalance.spark.tables.commits`) instead of reading the whole history
(``DESCRIBE HISTORY`` without a limit); this compares the two. It grows one table to
each ``--commits`` count with real appends (each a Delta commit of one small file, as the
generator's) and prints, at each count, the median, fastest and slowest of ``--repeats``
reads of:

* ``whole``: ``tables.history`` without a limit, every commit;
* ``newest``: the newest commit through ``tables.commits`` (one page);
* ``10 back``: the commit 10 versions back through ``tables.commits`` (one page of 16).

Delta's log retention (30 days by default) bounds what ``whole`` reads; at the default
cadence that is about 260 000 commits of ``events``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--commits", type=int, nargs="+", default=[250, 1000, 2000],
                   help="commit counts to measure at, increasing (each >= 20)")
    p.add_argument("--repeats", type=int, default=5, help="reads per variant and count (>= 3)")
    args = p.parse_args(argv)
    if args.repeats < 3:
        p.error(f"--repeats must be at least 3, got {args.repeats}")
    if any(c < 20 for c in args.commits) or args.commits != sorted(set(args.commits)):
        p.error(f"--commits must be increasing counts of at least 20, got {args.commits}")
    os.environ.setdefault("REBALANCE_SPARK_CONF", "spark.ui.enabled=false;"
                          "spark.sql.shuffle.partitions=4;spark.databricks.delta.snapshotPartitions=2")
    from rebalance.spark import tables
    from rebalance.spark.session import get_spark

    spark = get_spark("history-read-benchmark")
    root = tempfile.mkdtemp(prefix="history-read-")
    frame = spark.range(20).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS DOUBLE) AS value")
    table = tables.Table("history_bench", "key STRING, value DOUBLE", "benchmark table")
    path = table.path(root)

    def timed(read) -> list[float]:
        seconds = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            read()
            seconds.append(time.perf_counter() - started)
        return seconds

    print(f"{'commits':>8} {'read':<8} {'median s':>9} {'fastest':>8} {'slowest':>8}"
          f"   ({args.repeats} reads each)")
    made = 0
    for count in args.commits:
        started = time.perf_counter()
        while made < count:
            frame.coalesce(1).write.format("delta").mode("append").option(
                "userMetadata", f'{{"kind": "bench", "n": {made}}}').save(path)
            made += 1
        grown = time.perf_counter() - started
        newest = tables.history(spark, table, root, limit=1)[0].version
        variants = {
            "whole": lambda: tables.history(spark, table, root),
            "newest": lambda: next(iter(tables.commits(spark, table, root))),
            "10 back": lambda: next(c for c in tables.commits(spark, table, root)
                                    if c.version == newest - 10),
        }
        for name, read in variants.items():
            s = timed(read)
            print(f"{count:>8} {name:<8} {statistics.median(s):>9.3f} {min(s):>8.3f} "
                  f"{max(s):>8.3f}", flush=True)
        print(f"{'':>8} (grown to {count} commits in {grown:.0f} s)", flush=True)
    print(f"machine load average at the end: {os.getloadavg()[0]:.1f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
