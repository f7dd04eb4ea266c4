"""What one small Delta append costs, with and without the idempotent transaction id.

    .venv/bin/python include/benchmarks/delta_append_benchmark.py --appends 15

Every micro-batch of the keyed job appends to ``results`` and the histogram tables as
the Delta transaction ``(txnAppId, txnVersion)`` (exactly once). Delta 4.4 answers
"was this version written?" from the snapshot's computed state, not from the ``.crc``
file that also lists the transactions: after each commit, the next idempotent append
rebuilds the table's state with Spark jobs. This prints, per variant, the median, the
fastest and the slowest of ``--appends`` appends of a 50-row frame to a fresh table in
one local session (the first three are left out of the median: the JVM warms up):

* ``plain``: no transaction id;
* ``txn``: with the transaction id, the session's ``snapshotPartitions`` (the project's
  setting: ``REBALANCE_SPARK_CONF``, 2 in the tests);
* ``txn, 1 snapshot partition``: the same with ``snapshotPartitions`` 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--appends", type=int, default=15, help="appends per variant (>= 5)")
    args = p.parse_args(argv)
    if args.appends < 5:
        p.error(f"--appends must be at least 5, got {args.appends}")
    os.environ.setdefault("REBALANCE_SPARK_CONF", "spark.ui.enabled=false;"
                          "spark.sql.shuffle.partitions=4;spark.databricks.delta.snapshotPartitions=2")
    from rebalance.spark.session import get_spark, session_confs

    spark = get_spark("delta-append-benchmark")
    frame = spark.range(50).selectExpr("id", "CAST(id AS DOUBLE) AS value", "'k' AS key")
    folder = tempfile.mkdtemp(prefix="delta-append-")

    def run(name: str, txn: bool, conf: dict[str, str]) -> list[float]:
        seconds = []
        with session_confs(spark, conf):
            for i in range(args.appends):
                writer = frame.coalesce(1).write.format("delta").mode("append")
                if txn:
                    writer = writer.option("txnAppId", "query:table").option("txnVersion", i)
                started = time.perf_counter()
                writer.save(os.path.join(folder, name.replace(" ", "-").replace(",", "")))
                seconds.append(time.perf_counter() - started)
        return seconds

    run("warm-up", True, {})
    print(f"{'variant':<28} {'median s':>9} {'fastest':>8} {'slowest':>8}   ({args.appends} appends,"
          " median without the first 3)")
    for name, txn, conf in (("plain", False, {}), ("txn", True, {}),
                            ("txn, 1 snapshot partition", True,
                             {"spark.databricks.delta.snapshotPartitions": "1"})):
        s = run(name, txn, conf)
        print(f"{name:<28} {statistics.median(s[3:]):>9.3f} {min(s):>8.3f} {max(s):>8.3f}")
    print(f"machine load average at the end: {os.getloadavg()[0]:.1f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
