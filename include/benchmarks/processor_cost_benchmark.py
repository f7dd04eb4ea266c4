"""Cost of rebalanced() against plain transformWithStateInPandas: same processor, same events.

    .venv/bin/python include/benchmarks/processor_cost_benchmark.py            # no skew
    .venv/bin/python include/benchmarks/processor_cost_benchmark.py --skew     # cluster
    .venv/bin/python include/benchmarks/processor_cost_benchmark.py --skew --split --hot-share 0.6

The sessionization example (examples/sessions.py) runs on the same clicks, one Delta
commit per micro-batch, under ``groupBy("user_id").transformWithStateInPandas`` and under
``rebalanced()``; each run is a fresh Python process with its own Spark driver, the sides
alternating (a different one first each run). Per side: the median micro-batch time
(``triggerExecution`` of the query progress, the first batch left out), events/s (events
over the summed durations of those batches) and the start-up (process start to the first
micro-batch done; the input table is written before the clock starts).

``--skew``: users are Zipf 1.0 and their names are chosen so that Spark's hash
partitioning (what plain ``groupBy`` uses: ``pmod(hash(user_id), N)``) puts the hottest
users on partition 0 until it holds ``--hot-share`` of the clicks, like tenants whose ids
collide. The processor burns ``--work-us`` of CPU per click before sessionizing, so an
instance's time follows its load. Both sides run on a standalone cluster of two one-core
workers (started here unless ``--master`` is given) at N = 2. The rebalanced side runs
with the assignment Mixed plans from the users' loads (what the DAG publishes
after a window of histograms). Beside events/s, the load's max/mean over the instances
(the critical path of the model) for each side.

``--split`` (with ``--skew``): one user holds ``--hot-share`` of the clicks, the others
share the rest evenly; the page-views example (examples/page_views.py) runs instead, and
the rebalanced side, with its ``Merge``, splits that user over the instances with shares
that even out the other users' loads.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _example(name: str = "sessions"):
    if f"{name}_example" not in sys.modules:
        spec = importlib.util.spec_from_file_location(f"{name}_example",
                                                      REPO / "examples" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"{name}_example"] = module
        spec.loader.exec_module(module)
    return sys.modules[f"{name}_example"]


def _sessions():
    return _example("sessions")


def zipf_weights(users: int, zipf: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, users + 1) ** zipf
    return weights / weights.sum()


def user_names(weights: np.ndarray, n: int, hot_share: float | None) -> np.ndarray:
    """``u<i>`` names; with ``hot_share``, names such that Spark's hash partitioning puts
    the heaviest users on partition 0 until it holds ``hot_share`` of the weight, the
    others round-robin on partitions 1..n-1 (each the first free ``tenant-<j>``)."""
    if hot_share is None:
        return np.array([f"u{i:05d}" for i in range(len(weights))], dtype=object)
    from rebalance.core.placement import spark_hash_strings

    want = np.zeros(len(weights), dtype=int)
    held, rest = 0.0, 0
    for i in np.argsort(-weights, kind="stable"):
        if n == 1 or held < hot_share:
            held += weights[i]
        else:
            want[i], rest = 1 + rest % (n - 1), rest + 1
    pool = np.array([f"tenant-{j:06d}" for j in range(4 * len(weights) * n)], dtype=object)
    part = np.mod(spark_hash_strings(pool).astype(np.int64), n)
    free = {i: list(pool[part == i]) for i in range(n)}
    return np.array([free[w].pop(0) for w in want], dtype=object)


def clicks(events: int, batches: int, names: np.ndarray, weights: np.ndarray,
           seed: int = 1) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    out, t = [], 1_704_067_200_000
    for _ in range(batches):
        times = t + np.sort(rng.integers(0, 10 * 60_000, events))
        out.append(pd.DataFrame({"user_id": names[rng.choice(len(names), size=events, p=weights)],
                                 "page": "p", "click_time": pd.to_datetime(times, unit="ms")}))
        t += 10 * 60_000
    return out


def busy_processor(work_us: float, split: bool = False):
    """The sessionization processor (``split``: the page-views one), burning ``work_us``
    of CPU per click first."""
    from pyspark import cloudpickle

    module = _example("page_views") if split else _sessions()
    cloudpickle.register_pickle_by_value(module)
    base = module.PageViews if split else module.Sessionize
    if work_us <= 0:
        return base()

    class BusySessionize(base):
        def handleInputRows(self, key, rows, timerValues):
            rows = list(rows)
            end = time.thread_time() + work_us * sum(len(r) for r in rows) / 1e6
            while time.thread_time() < end:
                pass
            yield from super().handleInputRows(key, iter(rows), timerValues)

    return BusySessionize()


def planned_routing(names, weights, n: int) -> dict[str, int]:
    """Mixed's plan on the users' loads (one window of their click counts)."""
    from rebalance.core.histograms import build_problem
    from rebalance.core.model import PlanParams
    from rebalance.core.planners import get_planner

    rows = pd.DataFrame({"window_start": pd.Timestamp("2024-01-01"), "key": names,
                         "count": (weights * 1e6).astype("int64"),
                         "cost": weights * 1e6, "state_bytes": 100})
    problem, _ = build_problem(rows, n, None, windows=1)
    assignment = get_planner("mixed").plan(problem, PlanParams(theta=0.05)).assignment
    return {str(k): int(a) for k, a, d in zip(problem.keys, assignment, problem.default)
            if a != d}


def load_ratio(instances: np.ndarray, weights: np.ndarray, n: int) -> float:
    from rebalance.core.model import imbalance

    return imbalance(np.bincount(instances, weights=weights, minlength=n))


def write_input(frames: list[pd.DataFrame], source: str) -> None:
    """The clicks as a Delta table, one commit per frame (one micro-batch each)."""
    from rebalance.spark.session import get_spark

    spark = get_spark("cost-input", master="local[2]")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    for frame in frames:
        (spark.createDataFrame(frame, _sessions().CLICKS_SCHEMA).coalesce(1).write
         .format("delta").mode("append").save(source))
    spark.stop()


#: The session conf on the two-worker cluster.
CLUSTER_CONF = {"spark.executor.memory": "1g", "spark.cores.max": "2"}


def run(side: str, a: argparse.Namespace) -> dict[str, float]:
    """One side in this process: start-up counted from ``a.launched`` (epoch seconds)."""
    from rebalance.spark import tables
    from rebalance.spark.session import get_spark
    from rebalance.streaming.rebalanced import rebalanced

    module = _example("page_views") if a.split else _sessions()
    schema = module.VIEWS_SCHEMA if a.split else module.SESSION_SCHEMA
    master = a.master or "local[2]"
    spark = get_spark(f"cost-{side}", master=master,
                      conf=CLUSTER_CONF if master.startswith("spark://") else None)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.shuffle.partitions", str(a.instances))
    root = Path(tempfile.mkdtemp(prefix=f"cost-{side}-"))
    atexit.register(shutil.rmtree, root, True)   # its tables and checkpoint, gone at exit
    stream = (spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(a.source)
              .withWatermark("click_time", "10 minutes"))
    processor = busy_processor(a.work_us, a.split)
    if side == "plain":
        query = (stream.groupBy("user_id")
                 .transformWithStateInPandas(processor, schema, "Append",
                                             "EventTime")
                 .writeStream.format("delta").option("checkpointLocation", str(root / "chk"))
                 .trigger(processingTime="1 second").start(str(root / "out")))
        handle = query
    else:
        tables_root = str(root / "tables")
        if a.routing:
            plan = json.loads(Path(a.routing).read_text())
            splits = {k: {int(i): s for i, s in parts.items()}
                      for k, parts in plan.get("splits", {}).items()}
            tables.publish_assignment(spark, plan["routing"], a.instances, root=tables_root,
                                      splits=splits)
        job = rebalanced(stream, key="user_id", processor=processor,
                         output_schema=schema, time_mode="EventTime",
                         event_time="click_time", job="cost", instances=a.instances,
                         tables_root=tables_root, merge=module.MERGE if a.split else None)
        handle = job.start(output=str(root / "out"), checkpoint=str(root / "chk"))
        query = handle.query
    figures = query_figures(query, handle, a.launched)
    spark.stop()
    return figures


def query_figures(query, handle, launched: float) -> dict[str, float]:
    """Start-up (``launched`` to the first progress), then, once ``handle`` (the query, or
    the RebalancedQuery running it) processed everything and stopped: the median
    micro-batch time and the events/s, the first batch left out."""
    while not query.lastProgress:
        time.sleep(0.05)
    first = time.time() - launched
    query.processAllAvailable() if handle is query else handle.process_all_available()
    done = [p for p in query.recentProgress if p.numInputRows > 0][1:]
    seconds = [p.durationMs["triggerExecution"] / 1000 for p in done]
    handle.stop()
    return {"batch_s": statistics.median(seconds), "startup_s": first,
            "events_per_s": sum(p.numInputRows for p in done) / sum(seconds)}


def run_child(side: str, a: argparse.Namespace, source: str, routing: str | None) -> dict:
    launched = time.time()
    argv = [sys.executable, __file__, "--one", side, "--source", source, "--instances",
            str(a.instances), "--launched", repr(launched), "--work-us", str(a.work_us)]
    argv += ["--master", a.master] if a.master else []
    argv += ["--routing", routing] if routing else []
    argv += ["--split"] if a.split else []
    return child_result(side, argv)


def child_result(side: str, argv: list[str]) -> dict:
    """Run one side's child process; the figures it printed on its ``RESULT`` line."""
    done = subprocess.run(argv, capture_output=True, text=True)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{side} run failed: {done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--skew", action="store_true",
                   help="hot users colliding under hash, CPU work per click, on the cluster")
    p.add_argument("--split", action="store_true",
                   help="with --skew: one user holds --hot-share of the clicks; the page-views "
                        "processor, its Merge, and that user split over the instances")
    p.add_argument("--events", type=int, help="clicks per micro-batch (default 20000; "
                                              "--skew 4000)")
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--users", type=int, help="default 2000 (--skew 200)")
    p.add_argument("--hot-share", type=float, default=0.9)
    p.add_argument("--work-us", type=float, help="CPU per click (default 0; --skew 250)")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--master", help="spark://HOST:PORT (--skew default: start a cluster)")
    p.add_argument("--one", choices=["plain", "rebalanced"], help=argparse.SUPPRESS)
    p.add_argument("--source", help=argparse.SUPPRESS)
    p.add_argument("--routing", help=argparse.SUPPRESS)
    p.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.events = a.events or (4_000 if a.skew else 20_000)
    a.users = a.users or (200 if a.skew else 2_000)
    a.work_us = a.work_us if a.work_us is not None else (250.0 if a.skew else 0.0)
    if min(a.events, a.batches, a.users, a.instances, a.runs) < 1 or a.work_us < 0:
        p.error("--events, --batches, --users, --instances, --runs must be >= 1 and "
                "--work-us >= 0")
    if not 0 < a.hot_share < 1:
        p.error(f"--hot-share must be in (0, 1), got {a.hot_share}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.one:
        print("RESULT " + json.dumps(run(a.one, a)))
        return 0
    from throughput_benchmark import cluster_master

    from rebalance.core.model import imbalance
    from rebalance.core.placement import default_instances, spark_hash_strings

    work = Path(tempfile.mkdtemp(prefix="cost-"))
    atexit.register(shutil.rmtree, work, True)   # the input, gone at exit
    weights = zipf_weights(a.users, 1.0 if a.skew else 0.0)
    names = user_names(weights, a.instances, a.hot_share if a.skew else None)
    if a.split:        # one user with hot_share of the clicks, the rest uniform
        weights = np.full(a.users, (1 - a.hot_share) / (a.users - 1))
        weights[0] = a.hot_share
        names = user_names(weights, a.instances, None)
    source, routing_file = str(work / "clicks"), None
    write_input(clicks(a.events, a.batches, names, weights), source)
    plain_load = load_ratio(np.mod(spark_hash_strings(names).astype(np.int64), a.instances),
                            weights, a.instances)
    placed = default_instances(names, a.instances)
    splits = {}
    if a.split:
        rest = np.bincount(placed[1:], weights=weights[1:], minlength=a.instances)
        room = np.maximum(1.0 / a.instances - rest, 0.0)
        splits = {str(names[0]): {i: float(r / room.sum()) for i, r in enumerate(room) if r > 0}}
        routing = {}
        split_load = rest + weights[0] * room / room.sum()
    else:
        routing = planned_routing(names, weights, a.instances) if a.skew else {}
    placed = np.array([routing.get(str(k), d) for k, d in zip(names, placed)])
    if routing or splits:
        routing_file = str(work / "routing.json")
        Path(routing_file).write_text(json.dumps({"routing": routing, "splits": splits}))
    figures: dict[str, list[dict]] = {"plain": [], "rebalanced": []}
    with cluster_master(work, a.master) if a.skew else nullcontext() as master:
        a.master = master
        for i in range(a.runs):
            for side in (list(figures) if i % 2 == 0 else list(figures)[::-1]):
                figures[side].append(run_child(side, a, source, routing_file))
                print(side, figures[side][-1], flush=True)
    where = f"standalone cluster {a.master} (2 one-core workers)" if a.skew else "local[2]"
    print(f"\n{a.events} clicks per micro-batch, {a.batches} micro-batches, {a.users} users "
          f"(Zipf {1.0 if a.skew else 0.0}), {a.work_us:g} us CPU per click, N = {a.instances}, "
          f"{where}, {a.runs} runs")
    balanced = (imbalance(split_load) if splits
                else load_ratio(placed, weights, a.instances))
    print(f"load max/mean: plain (Spark's hash) {plain_load:.2f}, rebalanced {balanced:.2f} "
          f"({len(routing)} users routed, {len(splits)} split: {splits})")
    for what in ("batch_s", "events_per_s", "startup_s"):
        plain = [f[what] for f in figures["plain"]]
        reb = [f[what] for f in figures["rebalanced"]]
        ratios = [r / q for r, q in zip(reb, plain)]
        worst = min if what == "events_per_s" else max
        print(f"{what:12s} plain median {statistics.median(plain):8.2f} worst "
              f"{worst(plain):8.2f} | rebalanced median {statistics.median(reb):8.2f} worst "
              f"{worst(reb):8.2f} | rebalanced/plain median {statistics.median(ratios):.2f} "
              f"worst {worst(ratios):.2f}")
    extra = [r["startup_s"] - q["startup_s"] for r, q in zip(figures["rebalanced"], figures["plain"])]
    print(f"start-up, rebalanced minus plain: median {statistics.median(extra):.1f} s, worst "
          f"{max(extra):.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
