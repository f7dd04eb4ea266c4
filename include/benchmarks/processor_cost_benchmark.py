"""Cost of rebalanced() against plain transformWithStateInPandas: same processor, same events.

    .venv/bin/python include/benchmarks/processor_cost_benchmark.py [--events 20000]
        [--batches 6] [--users 2000] [--zipf 0] [--instances 2] [--runs 3]

The sessionization example (examples/sessions.py) runs on the same clicks, one Delta
commit per micro-batch, under ``groupBy("user_id").transformWithStateInPandas`` and under
``rebalanced()``, each run in a fresh local[2] Spark session. The script prints each
side's median micro-batch time (``triggerExecution`` of the query progress, the first
batch left out), its start-up (``start()`` to the first batch committed), and the ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]


def _sessions():
    spec = importlib.util.spec_from_file_location("sessions", REPO / "examples" / "sessions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clicks(events: int, batches: int, users: int, zipf: float, seed: int = 1) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, users + 1) ** zipf
    weights /= weights.sum()
    names = np.array([f"u{i:05d}" for i in range(users)])
    out, t = [], 1_704_067_200_000
    for _ in range(batches):
        times = t + np.sort(rng.integers(0, 10 * 60_000, events))
        out.append(pd.DataFrame({"user_id": names[rng.choice(users, size=events, p=weights)],
                                 "page": "p", "click_time": pd.to_datetime(times, unit="ms")}))
        t += 10 * 60_000
    return out


def run(side: str, frames: list[pd.DataFrame], instances: int) -> dict[str, float]:
    from rebalance.spark.session import get_spark
    from rebalance.streaming.rebalanced import rebalanced

    sessions = _sessions()
    spark = get_spark(f"cost-{side}", master="local[2]")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.shuffle.partitions", str(instances))
    root = Path(tempfile.mkdtemp(prefix=f"cost-{side}-"))
    source = str(root / "clicks")
    for frame in frames:
        (spark.createDataFrame(frame, sessions.CLICKS_SCHEMA).coalesce(1).write.format("delta")
         .mode("append").save(source))
    stream = (spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(source)
              .withWatermark("click_time", "10 minutes"))
    started = time.perf_counter()
    if side == "plain":
        query = (stream.groupBy("user_id")
                 .transformWithStateInPandas(sessions.Sessionize(), sessions.SESSION_SCHEMA,
                                             "Append", "EventTime")
                 .writeStream.format("delta").option("checkpointLocation", str(root / "chk"))
                 .trigger(processingTime="1 second").start(str(root / "out")))
        handle = query
    else:
        job = rebalanced(stream, key="user_id", processor=sessions.Sessionize(),
                         output_schema=sessions.SESSION_SCHEMA, time_mode="EventTime",
                         event_time="click_time", job="cost", instances=instances,
                         tables_root=str(root / "tables"))
        handle = job.start(output=str(root / "out"), checkpoint=str(root / "chk"))
        query = handle.query
    while not query.lastProgress:
        time.sleep(0.05)
    first = time.perf_counter() - started
    handle.process_all_available() if side != "plain" else query.processAllAvailable()
    batches = [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress
               if p["numInputRows"] > 0][1:]
    handle.stop()
    spark.stop()
    return {"batch_s": statistics.median(batches), "startup_s": first}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--users", type=int, default=2_000)
    p.add_argument("--zipf", type=float, default=0.0)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    frames = clicks(args.events, args.batches, args.users, args.zipf)
    figures: dict[str, list[dict[str, float]]] = {"plain": [], "rebalanced": []}
    for _ in range(args.runs):
        for side in figures:
            figures[side].append(run(side, frames, args.instances))
    print(f"{args.events} events per batch, {args.users} users, zipf {args.zipf}, "
          f"N = {args.instances}, local[2], {args.runs} runs")
    for what in ("batch_s", "startup_s"):
        plain = [f[what] for f in figures["plain"]]
        reb = [f[what] for f in figures["rebalanced"]]
        ratios = [r / q for r, q in zip(reb, plain)]
        print(f"{what:10s} plain median {statistics.median(plain):6.2f} worst {max(plain):6.2f} | "
              f"rebalanced median {statistics.median(reb):6.2f} worst {max(reb):6.2f} | "
              f"ratio median {statistics.median(ratios):.2f} worst {max(ratios):.2f}")


if __name__ == "__main__":
    main()
