"""``auto`` on mid-size problems: plan time and migration, side by side with a stored run.

    python include/benchmarks/auto_benchmark.py [--workloads a,b] [--intervals I]
                                                [--time-limit S] [--json OUT]
                                                [--compare BEFORE.json]

The target: auto stops as soon as more search cannot pay, with a median plan time <= 2 s
on problems of hundreds to thousands of keys (N = 16 .. 64) and a migration within 2 % of
what a full 10 s search reaches. This script plans the same problems
with ``auto`` (default time limit 10 s, the ``rebalance plan`` default) and stores every
plan's figures; ``--compare`` prints them next to a stored run (e.g. the code before the
change) with the verdicts.

Workloads (all deterministic). Interval i is planned from the assignment that **Mixed**
planned at interval i - 1 (Mixed is deterministic and not what is measured), so two
versions of auto see exactly the same problems whatever they plan:

* ``zipf085-k10000-n15``: the synthetic workload's defaults as in ``plan_benchmark.py``
  (a) (:mod:`rebalance.core.synthetic`): Zipf 0.85, K = 10^4, N = 15, f = 1,
  theta = 0.08, A_max = 3000, state S(k, 10).
* ``zipf085-k10000-n15-unbounded``: the same without A_max.
* ``zipf05-k5000-n64``: the same generator with K = 5000, N = 64, Zipf 0.5 (at 0.85 the
  top key alone is several mean loads at N = 64), theta = 0.08, no A_max.
* ``job-n32``: histograms as the streaming job writes them, built through
  :func:`rebalance.core.histograms.build_problem`: the event generator's frequencies
  (1000 keys, Zipf 1.0, fluctuation 1 per window), 6000 events per window sampled
  (about 700 keys appear per window), state = the job's estimate for a key holding its
  last 3 windows (:func:`rebalance.streaming.processor.state_bytes`), N = 32,
  theta = 0.05 (shaped like the job's real traces: the top key alone is about 4 mean
  loads, so no plan meets theta).
* ``job-n16``: the same with 3000 keys, Zipf 0.7, 20 000 events per window, N = 16,
  theta = 0.05 (reachable).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

WORKLOADS = ("zipf085-k10000-n15", "zipf085-k10000-n15-unbounded", "zipf05-k5000-n64",
             "job-n32", "job-n16")
JOB_WINDOWS_HELD = 3


def _synthetic(n_keys, n_instances, zipf, theta, max_table):
    from rebalance.core.model import PlanParams
    from rebalance.core.synthetic import SLIDING_STATE_WINDOW, SyntheticConfig, SyntheticWorkload

    w = SyntheticWorkload(SyntheticConfig(n_keys=n_keys, n_instances=n_instances, zipf=zipf,
                                          fluctuation=1.0, state_window=SLIDING_STATE_WINDOW,
                                          seed=0))
    params = PlanParams(theta=theta, max_table=max_table)
    return (lambda i, current: w.problem(i, current)), w.default, params


def _job(n_keys, zipf, events, n_instances, theta):
    import numpy as np
    import pandas as pd

    from rebalance.core.histograms import build_problem
    from rebalance.core.model import PlanParams
    from rebalance.core.placement import default_instances
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig
    from rebalance.streaming.processor import state_bytes

    gen = EventGenerator(GeneratorConfig(n_keys=n_keys, zipf=zipf, fluctuation=1.0,
                                         n_instances=n_instances, seed=3))
    keys = gen.keys
    per_key = np.array([state_bytes(k, JOB_WINDOWS_HELD) for k in keys], dtype=np.int64)
    t0 = pd.Timestamp("2026-01-01T00:00:00Z")

    def frame(i):
        rng = np.random.default_rng([3, 7, i])
        counts = rng.multinomial(events, gen.frequencies(i))
        seen = np.flatnonzero(counts)
        return pd.DataFrame({"window_start": t0 + pd.Timedelta(minutes=i),
                             "key": keys[seen], "count": counts[seen],
                             "cost": counts[seen].astype(float),
                             "state_bytes": per_key[seen]})

    index = {k: j for j, k in enumerate(keys)}

    def problem(i, current):
        routing = {k: int(c) for k, c, d in zip(keys, current, default) if c != d}
        assign = pd.DataFrame({"key": list(routing), "instance": list(routing.values())})
        p, _ = build_problem(frame(i), n_instances, assign if len(assign) else None)
        return p

    default = default_instances(keys, n_instances)
    problem.index = index
    return problem, default, PlanParams(theta=theta)


def workload(name):
    """(problem of interval i from the current instance of every key, default, params)."""
    if name == "zipf085-k10000-n15":
        return _synthetic(10_000, 15, 0.85, 0.08, 3000)
    if name == "zipf085-k10000-n15-unbounded":
        return _synthetic(10_000, 15, 0.85, 0.08, None)
    if name == "zipf05-k5000-n64":
        return _synthetic(5_000, 64, 0.5, 0.08, None)
    if name == "job-n32":
        return _job(1000, 1.0, 6000, 32, 0.05)
    if name == "job-n16":
        return _job(3000, 0.7, 20_000, 16, 0.05)
    raise SystemExit(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")


def run(name: str, intervals: int, time_limit: float) -> list[dict]:
    """Plan intervals 1..I with auto (and Mixed, which carries the assignment on)."""
    from dataclasses import replace

    import numpy as np

    from rebalance.core.planners import get_planner

    make, default, params = workload(name)
    params = replace(params, time_limit=time_limit)
    rows = []
    current = default  # every key's instance, carried from Mixed's plan of the interval before
    for i in range(intervals + 1):
        problem = make(i, current)
        mixed = get_planner("mixed").plan(problem, params)
        if i > 0:  # interval 0 is the warm-up from the default placement
            t0 = time.perf_counter()
            plan = get_planner("auto").plan(problem, params)
            wall = time.perf_counter() - t0
            m = plan.metrics
            rows.append({"workload": name, "interval": i, "keys": problem.n_keys,
                         "instances": problem.n_instances, "seconds": wall,
                         "plan_seconds": plan.plan_seconds, "feasible": plan.feasible,
                         "imbalance": m.imbalance_after, "migration_bytes": m.migration_bytes,
                         "migration": m.migration_fraction, "table": m.table_size,
                         "lower_bound": plan.lower_bound_fraction,
                         "mixed_migration": mixed.metrics.migration_fraction,
                         "notes": [n for n in plan.notes if n.startswith(("kept", "chose",
                                                                          "stopped"))]})
            print(f"{name} interval {i}: {wall:.2f} s, migration {m.migration_fraction:.4%} "
                  f"(mixed {mixed.metrics.migration_fraction:.4%}), feasible {plan.feasible}",
                  file=sys.stderr, flush=True)
        # carry Mixed's plan to the next interval, by key (the job workloads' key sets vary)
        current = np.asarray(default).copy()
        current[_positions(make, problem, default)] = mixed.assignment
    return rows


def _positions(make, problem, default):
    import numpy as np

    index = getattr(make, "index", None)
    if index is None:  # synthetic: the problem covers every key in order
        return np.arange(len(default))
    return np.fromiter((index[k] for k in problem.keys), dtype=np.int64, count=problem.n_keys)


def summary(rows: list[dict]) -> dict[str, dict]:
    out = {}
    for name in dict.fromkeys(r["workload"] for r in rows):
        rs = [r for r in rows if r["workload"] == name]
        out[name] = {
            "plans": len(rs), "keys": statistics.median(r["keys"] for r in rs),
            "instances": rs[0]["instances"],
            "median_s": statistics.median(r["seconds"] for r in rs),
            "max_s": max(r["seconds"] for r in rs),
            "migration": statistics.fmean(r["migration"] for r in rs),
            "mixed_migration": statistics.fmean(r["mixed_migration"] for r in rs),
            "feasible": sum(r["feasible"] for r in rs),
        }
    return out


def compare(before: list[dict], after: list[dict]) -> list[str]:
    sb, sa = summary(before), summary(after)
    lines = ["| workload | K (median) | N | plans | median s before | median s after | "
             "max s before | max s after | migration before | migration after | "
             "after/before | Mixed | feasible before/after | verdict |",
             "|" + "---|" * 14]
    for name, a in sa.items():
        b = sb.get(name)
        if not b:
            continue
        ratio = a["migration"] / b["migration"] if b["migration"] > 0 else float("nan")
        ok = a["median_s"] <= 2.0 and (ratio <= 1.02 or a["migration"] <= b["migration"]) \
            and a["feasible"] >= b["feasible"]
        lines.append(
            f"| {name} | {a['keys']:.0f} | {a['instances']} | {a['plans']} | "
            f"{b['median_s']:.2f} | {a['median_s']:.2f} | {b['max_s']:.2f} | {a['max_s']:.2f} | "
            f"{b['migration']:.4%} | {a['migration']:.4%} | {ratio:.4f} | "
            f"{a['mixed_migration']:.4%} | {b['feasible']}/{a['feasible']} | "
            f"{'PASS' if ok else 'FAIL'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--intervals", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--json", type=Path, help="write every plan's figures here")
    ap.add_argument("--compare", type=Path, help="a stored --json run to compare with")
    args = ap.parse_args(argv)
    rows = []
    for name in args.workloads.split(","):
        rows.extend(run(name, args.intervals, args.time_limit))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    for name, s in summary(rows).items():
        print(f"{name}: K {s['keys']:.0f}, N {s['instances']}, {s['plans']} plans, median "
              f"{s['median_s']:.2f} s, max {s['max_s']:.2f} s, migration {s['migration']:.4%} "
              f"(Mixed {s['mixed_migration']:.4%}), feasible {s['feasible']}/{s['plans']}")
    if args.compare:
        print("\n".join(compare(json.loads(args.compare.read_text()), rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
