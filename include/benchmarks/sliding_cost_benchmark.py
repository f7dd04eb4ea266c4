"""The built-in computation as a processor (SlidingWindows) against Spark's own aggregation.

    .venv/bin/python include/benchmarks/sliding_cost_benchmark.py --runs 3

The same events (``--events`` per micro-batch, one Delta commit each, ``--keys`` keys
Zipf 1.0, about one in ten a retry of an earlier event) go through three queries, each in
a fresh Python process with its own driver on local[2], N = ``--instances`` partitions:

* ``agg``: Spark's own ``dropDuplicatesWithinWatermark("event_id")`` then
  ``groupBy(window(event_time, 1 minute), key).agg(count, sum)``, append mode into Delta
  (Spark's built-in aggregation pre-aggregates before the shuffle);
* ``plain``: :class:`~rebalance.streaming.sliding.SlidingWindows` under
  ``groupBy("key").transformWithStateInPandas``;
* ``rebalanced``: the same processor under ``rebalanced()``;
* ``builtin``: the built-in job (``spark_apps/keyed_job.py``: the same processor under
  ``rebalanced()`` with its ``Merge``, the events parsed and quarantined first, its rows
  written to results and window_results) on the same events as raw strings, 1-minute
  windows, 3 of them sliding, the same watermark.

Per side: the median micro-batch time (``triggerExecution``, the first batch left out),
events/s over those batches, and the start-up (process start to the first micro-batch
done); the ratios of ``rebalanced`` to ``agg``, ``plain`` and ``builtin``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

SIDES = ("agg", "plain", "rebalanced", "builtin")
WINDOW_MS, N_WINDOWS, DELAY = 60_000, 3, "2 minutes"


def events(per_batch: int, batches: int, keys: int, seed: int = 1) -> list[pd.DataFrame]:
    """Frames of events in increasing time, a minute apart per batch, Zipf 1.0 keys;
    about one in ten a retry of an event of the same or the previous batch."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, keys + 1)
    weights /= weights.sum()
    names = np.array([f"k{i:05d}" for i in range(keys)], dtype=object)
    out, t, serial, previous = [], 1_704_067_200_000, 0, None
    for _ in range(batches):
        n = per_batch - per_batch // 10
        frame = pd.DataFrame({
            "event_id": [f"e{i:08d}" for i in range(serial, serial + n)],
            "key": names[rng.choice(keys, size=n, p=weights)],
            "value": rng.integers(0, 100, n).astype(float), "cost": 1.0,
            "event_time": pd.to_datetime(t + np.sort(rng.integers(0, 60_000, n)), unit="ms")})
        serial += n
        pool = frame if previous is None else pd.concat([previous, frame])
        retries = pool.sample(per_batch - n, random_state=int(rng.integers(1 << 30)))
        out.append(pd.concat([frame, retries], ignore_index=True))
        previous, t = frame, t + 60_000
    return out


def write_input(frames: list[pd.DataFrame], source: str) -> None:
    from rebalance.spark.session import get_spark
    from rebalance.spark.tables import RAW_EVENT_DDL
    from rebalance.streaming.generator import event_time_text
    from rebalance.streaming.sliding import SLIDING_INPUT

    spark = get_spark("sliding-input", master="local[2]")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    for frame in frames:
        (spark.createDataFrame(frame, SLIDING_INPUT).coalesce(1).write.format("delta")
         .mode("append").save(source))
        raw = frame.assign(value=frame["value"].map(repr), cost=frame["cost"].map(repr),
                           event_time=event_time_text(pd.DatetimeIndex(frame["event_time"])))
        (spark.createDataFrame(raw[["event_id", "key", "value", "cost", "event_time"]],
                               RAW_EVENT_DDL)
         .coalesce(1).write.format("delta").mode("append").save(raw_source(source)))
    spark.stop()


def raw_source(source: str) -> str:
    """The built-in job's events: the same events, every field a string."""
    return str(Path(source).parent / "raw_events")


def run(side: str, source: str, instances: int, launched: float) -> dict[str, float]:
    from pyspark.sql import functions as F

    from rebalance.spark.session import get_spark
    from rebalance.streaming.rebalanced import rebalanced
    from rebalance.streaming.sliding import SLIDING_SCHEMA, SlidingWindows

    spark = get_spark(f"sliding-{side}", master="local[2]")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.shuffle.partitions", str(instances))
    root = Path(tempfile.mkdtemp(prefix=f"sliding-{side}-"))
    atexit.register(shutil.rmtree, root, True)   # its tables and checkpoint, gone at exit
    stream = (spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(source)
              .withWatermark("event_time", DELAY))
    processor = SlidingWindows(WINDOW_MS, N_WINDOWS, 120_000)
    if side == "builtin":
        from rebalance.streaming.builtin import start_job
        from rebalance.streaming.job import JobConfig

        # its own tables each run, its events table a copy of the raw events
        shutil.copytree(raw_source(source), root / "tables" / "events")
        handle = start_job(spark, JobConfig(
            n_instances=instances, window_seconds=WINDOW_MS / 1000, n_windows=N_WINDOWS,
            watermark_seconds=120, max_files_per_trigger=1, trigger_seconds=1.0,
            name="sliding-builtin", tables_root=str(root / "tables"),
            checkpoint_root=str(root / "chk")))
        query = handle.keyed
    elif side == "rebalanced":
        job = rebalanced(stream, key="key", processor=processor, output_schema=SLIDING_SCHEMA,
                         time_mode="EventTime", event_time="event_time", cost="cost",
                         job="sliding", instances=instances, tables_root=str(root / "tables"))
        handle = job.start(output=str(root / "out"), checkpoint=str(root / "chk"))
        query = handle.query
    else:
        if side == "agg":
            out = (stream.dropDuplicatesWithinWatermark(["event_id"])
                   .groupBy(F.window("event_time", "1 minute"), "key")
                   .agg(F.count("*").alias("count"), F.sum("value").alias("sum")))
        else:
            out = stream.groupBy("key").transformWithStateInPandas(
                processor, SLIDING_SCHEMA, "Append", "EventTime")
        query = (out.writeStream.format("delta").outputMode("append")
                 .option("checkpointLocation", str(root / "chk"))
                 .trigger(processingTime="1 second").start(str(root / "out")))
        handle = query
    from processor_cost_benchmark import query_figures

    figures = query_figures(query, handle, launched)
    spark.stop()
    return figures


def run_child(side: str, source: str, instances: int) -> dict[str, float]:
    from processor_cost_benchmark import child_result

    return child_result(side, [sys.executable, __file__, "--one", side, "--source", source,
                               "--instances", str(instances), "--launched", repr(time.time())])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=50_000, help="events per micro-batch")
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--one", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--source", help=argparse.SUPPRESS)
    p.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if min(a.events, a.batches, a.keys, a.instances, a.runs) < 1 or a.batches < 3:
        p.error("--events, --keys, --instances, --runs must be >= 1 and --batches >= 3")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.one:
        print("RESULT " + json.dumps(run(a.one, a.source, a.instances, a.launched)))
        return 0
    work = tempfile.mkdtemp(prefix="sliding-")
    atexit.register(shutil.rmtree, work, True)   # the input, gone at exit
    source = str(Path(work) / "events")
    write_input(events(a.events, a.batches, a.keys), source)
    figures: dict[str, list[dict]] = {side: [] for side in SIDES}
    for i in range(a.runs):
        first = i % len(SIDES)
        for side in SIDES[first:] + SIDES[:first]:       # a different side first each run
            figures[side].append(run_child(side, source, a.instances))
            print(side, figures[side][-1], flush=True)
    print(f"\n{a.events} events per micro-batch (1 in 10 a retry), {a.batches} micro-batches, "
          f"{a.keys} keys (Zipf 1.0), N = {a.instances}, local[2], {a.runs} runs")
    for what in ("batch_s", "events_per_s", "startup_s"):
        worst = min if what == "events_per_s" else max
        line = [f"{what:12s}"]
        for side in SIDES:
            values = [f[what] for f in figures[side]]
            line.append(f"{side} median {statistics.median(values):8.2f} worst "
                        f"{worst(values):8.2f}")
        print(" | ".join(line))
    for base in ("agg", "plain", "builtin"):
        ratios = [r["events_per_s"] / q["events_per_s"]
                  for r, q in zip(figures["rebalanced"], figures[base])]
        print(f"events/s rebalanced / {base}: median {statistics.median(ratios):.2f} worst "
              f"{min(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
