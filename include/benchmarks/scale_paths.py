"""The other two ways histograms reach a planner, timed at 10^6 keys.

    python include/benchmarks/scale_paths.py [--keys K] [--runs R] [--skip-dag]
                                             [--workdir DIR]

* ``dag``: the DAG's plan path, :func:`rebalance.control.inputs.load_problem` on a
  ``key_histograms`` Delta table of K keys in one window with a routing table of 1 % of
  the keys (real local Spark and Delta, in a temporary data folder): Spark's group-by
  and ``toPandas``, then :func:`rebalance.core.histograms.build_problem` on that pandas
  frame. Both parts are timed; the Spark session is started (and the table written)
  before timing.
* ``replay``: ``rebalance bench --experiment replay``'s input, K keys in two windows of
  Parquet: :func:`rebalance.core.histogram_files.read_histogram_table` and
  :func:`~rebalance.evaluation.workloads.histogram_trace`.

Run it once with the code to measure on the Python path (e.g. a ``git archive`` of an
older commit via ``PYTHONPATH``) to compare versions; the inputs are those of
:mod:`rebalance.evaluation.scale` (Zipf 0.7, ``k0 .. k{K-1}``), cached in ``--workdir``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _inputs(workdir: Path, n_keys: int) -> tuple[Path, Path]:
    """The scale benchmark's input files (made by it if missing; an older version of the
    library without :mod:`rebalance.evaluation.scale` can still time cached ones)."""
    folder = Path(workdir) / f"K{n_keys}"
    if (folder / "histograms.parquet").exists() and (folder / "assignment.parquet").exists():
        return folder / "histograms.parquet", folder / "assignment.parquet"
    from rebalance.evaluation.scale import write_inputs

    return write_inputs(workdir, n_keys)


def replay_input(workdir: Path, n_keys: int) -> Path:
    """K keys in two windows (the second with the loads shuffled over the keys)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = Path(workdir) / f"replay-2w-K{n_keys}.parquet"
    if path.exists():
        return path
    hist, _ = _inputs(workdir, n_keys)
    t = pq.read_table(hist)
    later = t.set_column(0, "window_start",
                         pc.add(t.column("window_start"), pa.scalar(60_000_000, pa.duration("us"))))
    perm = np.random.default_rng(5).permutation(t.num_rows)
    later = later.set_column(3, "cost", t.column("cost").take(pa.array(perm)))
    pq.write_table(pa.concat_tables([t, later]), path)
    return path


def time_replay(path: Path, n_instances: int = 64) -> dict:
    from rebalance.core.histogram_files import read_histogram_table
    from rebalance.evaluation.workloads import histogram_trace

    t0 = time.perf_counter()
    frame = read_histogram_table(str(path))
    t1 = time.perf_counter()
    trace = histogram_trace(frame, n_instances)
    t2 = time.perf_counter()
    return {"read_s": t1 - t0, "aggregate_s": t2 - t1, "keys": trace.n_keys}


def time_dag(workdir: Path, n_keys: int, runs: int, n_instances: int = 64) -> list[dict]:
    """load_problem on a key_histograms Delta table; Spark started before timing."""
    import pyarrow.parquet as pq

    from rebalance.control import inputs as control_inputs
    from rebalance.core import histograms
    from rebalance.spark import tables
    from rebalance.spark.session import get_spark

    hist, assign = _inputs(workdir, n_keys)
    root = Path(tempfile.mkdtemp(prefix="scale-dag-", dir=workdir))
    os.environ["REBALANCE_DATA_DIR"] = str(root)
    spark = get_spark("scale-paths")
    spark.sparkContext.setLogLevel("ERROR")
    frame = pq.read_table(hist).to_pandas()
    for col, value in (("instance", 0), ("default_instance", 0), ("key_group", 0),
                       ("partition_id", 0), ("assignment_version", 0), ("batch_id", 0)):
        frame[col] = value
    df = tables.conform(spark.createDataFrame(frame), tables.KEY_HISTOGRAMS)
    tables.append(df, tables.KEY_HISTOGRAMS, root / "tables")
    tables.create_assignments(spark, n_instances, root / "tables")
    moved = pq.read_table(assign).to_pandas().sample(frac=0.01, random_state=1)
    version = tables.publish_assignment(spark, dict(zip(moved["key"], moved["instance"])),
                                        n_instances, {"reason": "scale benchmark"},
                                        root / "tables")
    window = frame["window_start"].iloc[0]
    inputs = {"windows": [window.isoformat()], "n_instances": n_instances,
              "key_histograms_version": 0, "base_assignment_version": version}
    spent = {}
    original = histograms.build_problem

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent["build_problem_s"] = time.perf_counter() - t

    histograms.build_problem = timed
    rows = []
    try:
        for i in range(runs):
            t0 = time.perf_counter()
            problem, _ = control_inputs.load_problem(spark, inputs)
            total = time.perf_counter() - t0
            rows.append({"run": i, "total_s": total, "build_problem_s": spent["build_problem_s"],
                         "spark_s": total - spent["build_problem_s"], "keys": problem.n_keys})
    finally:
        histograms.build_problem = original
        spark.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-dag", action="store_true", help="only the replay path (no Spark)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rebalance-scale")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    path = replay_input(args.workdir, args.keys)
    replay = [time_replay(path) for _ in range(args.runs)]
    for name in ("read_s", "aggregate_s"):
        vals = [r[name] for r in replay]
        print(f"replay {name}: median {statistics.median(vals):.2f} s, worst {max(vals):.2f} s "
              f"({args.runs} runs, K = {replay[0]['keys']}, 2 windows)")
    if not args.skip_dag:
        dag = time_dag(args.workdir, args.keys, args.runs)
        for name in ("total_s", "spark_s", "build_problem_s"):
            vals = [r[name] for r in dag]
            print(f"dag load_problem {name}: median {statistics.median(vals):.2f} s, worst "
                  f"{max(vals):.2f} s ({args.runs} runs, K = {dag[0]['keys']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
