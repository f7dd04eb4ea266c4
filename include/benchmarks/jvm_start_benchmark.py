"""How long a fresh Spark driver takes to start and write Delta, with and without the
class-data archive of ``make setup`` (rebalance.spark.class_data).

    .venv/bin/python include/benchmarks/jvm_start_benchmark.py --runs 5

Each run is a new Python process (as a job restarted after a crash, a CLI command or an
Airflow task's local session): it starts the project's session (``get_spark``, local[2],
Delta), appends 10 rows to a new Delta table (the first write loads Delta's and Spark
SQL's classes), appends again, and stops. The two variants alternate (archive, none,
archive, ...) so a drift of the machine's speed touches both alike. Printed per variant:
the median and the slowest run of each step (seconds, wall clock, measured inside the
process; the process's own start and import are not included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

STEPS = ("session", "first_write", "second_write", "total")


def _one(folder: str) -> dict[str, float]:
    from rebalance.spark.session import get_spark

    table = tempfile.mkdtemp(prefix="t-", dir=folder)  # a new table each run
    t0 = time.perf_counter()
    spark = get_spark("jvm-start-benchmark", master="local[2]")
    t1 = time.perf_counter()
    spark.range(10).write.format("delta").mode("append").save(table)
    t2 = time.perf_counter()
    spark.range(10).write.format("delta").mode("append").save(table)
    t3 = time.perf_counter()
    spark.stop()
    return {"session": t1 - t0, "first_write": t2 - t1, "second_write": t3 - t2,
            "total": t3 - t0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs per variant (>= 1)")
    p.add_argument("--one", metavar="FOLDER", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one)))
        return 0
    if args.runs < 1:
        p.error(f"--runs must be at least 1, got {args.runs}")
    from rebalance.spark.class_data import archive_path

    if not archive_path().is_file():
        print(f"no class-data archive at {archive_path()}: run make setup", file=sys.stderr)
        return 2
    variants = {"archive": "1", "none": "0"}
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for i in range(args.runs):
        for name, switch in variants.items():
            with tempfile.TemporaryDirectory(prefix="jvm-start-") as folder:
                env = {**os.environ, "REBALANCE_CDS": switch, "REBALANCE_DATA_DIR": folder,
                       "REBALANCE_SPARK_CONF": "spark.ui.enabled=false"}
                env.pop("REBALANCE_SPARK_REMOTE", None)
                done = subprocess.run([sys.executable, __file__, "--one", folder], env=env,
                                      capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            run = json.loads(done.stdout.strip().splitlines()[-1])
            figures[name].append(run)
            print(f"run {i + 1} {name:8s} " + "  ".join(f"{k} {run[k]:5.2f}" for k in STEPS),
                  flush=True)
    print(f"\n{'variant':8s} " + "  ".join(f"{k:>22s}" for k in STEPS))
    for name, runs in figures.items():
        cells = [f"{statistics.median(r[k] for r in runs):6.2f} (worst {max(r[k] for r in runs):5.2f})"
                 for k in STEPS]
        print(f"{name:8s} " + "  ".join(f"{c:>22s}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
