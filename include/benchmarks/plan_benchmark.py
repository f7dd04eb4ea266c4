"""Planner benchmark on the synthetic workload (a script, not a test; ``make bench``).

    python include/benchmarks/plan_benchmark.py [--quick] [--only a|b] [--planners mixed,auto]
                                                [--time-limit S] [--intervals N]

Scenarios (workload: :mod:`rebalance.core.synthetic`, Fang et al.'s generator, seed 0):

* (a) the generator's defaults: Zipf 0.85, K = 10^4 keys, N = 15 instances, fluctuation f = 1,
  theta = 0.08, A_max = 3000, 50 intervals, and the paper's state model S(k, w) with
  w = 10 (``SyntheticConfig.state_window = SLIDING_STATE_WINDOW``: a key's state is its
  events over its last 10 intervals, see :mod:`rebalance.core.synthetic`). A warm-up plan on
  interval 0 starts from the default placement (not counted: it is a one-off move away
  from plain hashing); then each interval i = 1..50 is planned from the assignment the
  previous plan left, on interval i's loads and state, and applied.
* (a-unbounded): (a) without A_max, to show what the routing-table bound costs the
  MILP polish.
* (a-amax300): (a) with A_max = 300 (MinTable, Mixed, auto only), a binding table bound
  (Mixed's table under A_max = 3000 stays far below it).
* (a-current): (a) with the current-interval state model (``state_window = 1``: a key's
  state is that of the interval just planned), a secondary scenario beside (a)'s
  W-window state. (a-current-amax300): the same with A_max = 300 (MinTable,
  Mixed, auto).
* (b) K = 10^6 keys, N = 64, theta = 0.02, a few intervals (current-interval state, as
  before: the targets of (b) are time and memory), in two variants: ``b-z0.85``
  (the default Zipf 0.85: its top key alone is 1.37 mean loads, so 1 + theta = 1.02 is
  unreachable for every planner; the best possible imbalance is printed) and ``b-z0.7``
  (reachable: top key 0.31 mean loads; fluctuation f = 0.5, because with these flat
  weights random swaps almost never move a whole mean load onto one instance, so f = 1
  would spend its 10 K draws on every interval).

* ``scale``: the whole ``rebalance plan`` command (process start to files written) at
  K = 10^4, 10^5, 10^6, 10^7 keys, N = 64, theta = 0.02, Zipf 0.7, one window of Parquet,
  with the default placement and with an assignment file listing every key, for mixed
  and auto (:mod:`rebalance.evaluation.scale`, also ``rebalance bench --experiment
  scale``): median and worst of ``--scale-runs`` runs (the first cold) of wall time,
  input seconds, plan_seconds, peak RSS, imbalance and migration, the scale targets,
  and a log-log plot of time against K (``--scale-plot``, default
  ``docs/img/plan_scale.png``).

Per planner: the largest imbalance over the counted intervals, the mean migration (as a
fraction of the total state), the mean and largest table size, the median wall time of
``planner.plan()`` (search + evaluation + lower bound; building the problem is not
counted), the mean migration lower bound, the number of feasible intervals, the
imbalance each plan has in the interval after the one it was made on (mean / max), and the
peak memory: each planner runs in its own subprocess, which reports its ``ru_maxrss``
(peak resident set of the whole process: Python, numpy, the workload and the planner;
the RSS before the first plan is printed as ``base``). Targets are printed as PASS/FAIL.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rebalance.core.planner_names import METHODS

ALL_PLANNERS = METHODS  # every planner of the registry (rebalance.core.planner_names: numpy-free)
W003 = 10  # rebalance.core.synthetic.SLIDING_STATE_WINDOW (not imported: the parent stays numpy-free)
_A = dict(n_keys=10_000, n_instances=15, zipf=0.85, fluctuation=1.0, theta=0.08, max_table=3000,
          intervals=50, quick_intervals=10, state_window=W003)
SCENARIOS = {
    "a": dict(_A),
    "a-unbounded": dict(_A, max_table=None),
    "a-amax300": dict(_A, max_table=300),
    # the current-interval state model: a key's state is that of the interval just planned
    "a-current": dict(_A, state_window=1),
    "a-current-amax300": dict(_A, state_window=1, max_table=300),
    "b-z0.85": dict(n_keys=1_000_000, n_instances=64, zipf=0.85, fluctuation=1.0, theta=0.02,
                    max_table=None, intervals=3, quick_intervals=2, state_window=1),
    "b-z0.7": dict(n_keys=1_000_000, n_instances=64, zipf=0.7, fluctuation=0.5, theta=0.02,
                   max_table=None, intervals=3, quick_intervals=2, state_window=1),
}
DIAGNOSTIC_PLANNERS = ("mintable", "mixed", "auto")
B_PLANNERS = ("hash", "greedy", "mintable", "minmig", "mixed", "auto", "auto+split")
#: Not in the registry: auto with the keys above the bound split (rebalance.core.planners.split).
SPLIT = "auto+split"
UNBOUNDED_PLANNERS = ("mixed", "milp", "auto")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux


def run_worker(scenario: str, planner: str, intervals: int, time_limit: float) -> dict:
    """One planner on one scenario, in this process; returns the per-interval figures."""
    import numpy as np

    from rebalance.core.bounds import migration_lower_bound
    from rebalance.core.model import PlanParams, imbalance
    from rebalance.core.planners import get_planner
    from rebalance.core.synthetic import SyntheticConfig, SyntheticWorkload

    s = SCENARIOS[scenario]
    w = SyntheticWorkload(SyntheticConfig(n_keys=s["n_keys"], n_instances=s["n_instances"],
                                          zipf=s["zipf"], fluctuation=s["fluctuation"],
                                          state_window=s["state_window"], seed=0))
    params = PlanParams(theta=s["theta"], max_table=s["max_table"], time_limit=time_limit)
    series = 4 if planner == "clb" else 0
    current = w.default
    w.problem(0)  # build keys, placement and the first loads before measuring "base"
    base = _rss_mb()
    rows = []
    for i in range(intervals + (1 if scenario.startswith("a") else 0)):
        problem = w.problem(i, current)
        if series:
            from dataclasses import replace

            ls = np.stack([w.load(j) for j in range(max(0, i - series + 1), i + 1)])
            problem = replace(problem, load_series=ls)
        t0 = time.perf_counter()
        if planner == SPLIT:
            from rebalance.core.planners.split import plan_split

            plan = plan_split(problem, params, base="auto")
        else:
            plan = get_planner(planner).plan(problem, params)
        wall = time.perf_counter() - t0
        m = plan.metrics
        # The plan reports its bound (finish_plan: A_max-aware when A_max is set, and for
        # auto/milp at least the integer knapsack cover); the plain fractional bound
        # (ignoring A_max) for the same load, for comparison, is recomputed here.
        lb_table = plan.lower_bound_fraction
        lb_plain = plan.lower_bound_fraction
        if float(problem.state.sum()) > 0 and planner != SPLIT:  # (whole-key bound)
            lb_plain = migration_lower_bound(
                problem, max(problem.max_load(params.theta), m.max_load_after)
            ) / float(problem.state.sum())
        # The plan judged on the interval after the one it was made on (planned on i, the
        # job runs under it in i + 1): the imbalance it would have there.
        following = w.load(i + 1)
        loads = (plan.split.loads(problem, plan.assignment, following) if plan.split is not None
                 else np.bincount(plan.assignment, weights=following,
                                  minlength=problem.n_instances))
        rows.append({"lb_table": lb_table, "interval": i, "imbalance_before": m.imbalance_before,
                     "imbalance": m.imbalance_after, "migration": m.migration_fraction,
                     "table": m.table_size, "seconds": wall, "lb": lb_plain,
                     "feasible": plan.feasible, "moved": m.moved_keys,
                     "next_imbalance": float(imbalance(loads, problem.active)),
                     "best_possible": max(1.0, float(problem.load.max() / problem.mean_load()))})
        current = plan.assignment
    if scenario.startswith("a"):
        rows = rows[1:]  # interval 0 is the warm-up from the default placement
    return {"scenario": scenario, "planner": planner, "rows": rows, "base_mb": base,
            "peak_mb": _rss_mb()}


def run_in_subprocess(scenario: str, planner: str, intervals: int, time_limit: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", scenario, planner, str(intervals),
           str(time_limit)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"scenario": scenario, "planner": planner, "error": out.stderr.strip()[-500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(result: dict) -> dict:
    rows = result["rows"]
    return {
        "planner": result["planner"],
        "max_imbalance": max(r["imbalance"] for r in rows),
        "mean_migration": statistics.fmean(r["migration"] for r in rows),
        "mean_lb": statistics.fmean(r["lb"] for r in rows),
        "mean_lb_table": statistics.fmean(r.get("lb_table", r["lb"]) for r in rows),
        "mean_table": statistics.fmean(r["table"] for r in rows),
        "max_table": max(r["table"] for r in rows),
        "median_seconds": statistics.median(r["seconds"] for r in rows),
        "max_seconds": max(r["seconds"] for r in rows),
        "feasible": sum(r["feasible"] for r in rows),
        "intervals": len(rows),
        "base_mb": result["base_mb"],
        "peak_mb": result["peak_mb"],
        "best_possible": max(r["best_possible"] for r in rows),
        "mean_next": statistics.fmean(r["next_imbalance"] for r in rows),
        "max_next": max(r["next_imbalance"] for r in rows),
    }


def print_table(scenario: str, summaries: list[dict]) -> None:
    s = SCENARIOS[scenario]
    print(f"\n### scenario {scenario}: K={s['n_keys']}, N={s['n_instances']}, zipf={s['zipf']}, "
          f"f={s['fluctuation']}, theta={s['theta']}, A_max={s['max_table']}, "
          f"state window w={s['state_window']}, intervals={summaries[0]['intervals']}"
          f" (best reachable imbalance max(1, top key / mean), worst interval: "
          f"{summaries[0]['best_possible']:.4f})")
    print("| planner | max imbalance | mean migration | mean fractional LB | migration/fractional LB | "
          "mean reported LB | migration/reported LB | mean table | "
          "max table | median plan s | max plan s | feasible | base MB | peak MB | "
          "next interval: mean / max imbalance |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in summaries:
        ratio = r["mean_migration"] / r["mean_lb"] if r["mean_lb"] > 0 else float("nan")
        lbt = r["mean_lb_table"]
        ratio_t = r["mean_migration"] / lbt if lbt > 0 else float("nan")
        print(f"| {r['planner']} | {r['max_imbalance']:.4f} | {r['mean_migration']:.4%} | "
              f"{r['mean_lb']:.4%} | {ratio:.3f} | {lbt:.4%} | {ratio_t:.3f} | "
              f"{r['mean_table']:.0f} | {r['max_table']} | "
              f"{r['median_seconds']:.4f} | {r['max_seconds']:.4f} | "
              f"{r['feasible']}/{r['intervals']} | {r['base_mb']:.0f} | {r['peak_mb']:.0f} | "
              f"{r['mean_next']:.4f} / {r['max_next']:.4f} |")


def check_targets(results: dict[str, dict[str, dict]]) -> list[tuple[str, bool, str]]:
    checks = []
    a = results.get("a", {})
    for name in ("mixed", "auto"):
        if name in a:
            r = a[name]
            checks.append((f"(a) {name}: imbalance <= 1.08 in every interval",
                           r["max_imbalance"] <= 1.08 + 1e-9, f"max {r['max_imbalance']:.4f}"))
    if "mintable" in a:
        for name in ("mixed", "auto"):
            if name in a:
                ratio = a[name]["mean_migration"] / a["mintable"]["mean_migration"]
                checks.append((f"(a) {name} migrates <= 1/3 of MinTable", ratio <= 1 / 3,
                               f"{name}/mintable = {ratio:.3f}"))
    if "auto" in a:
        r = a["auto"]
        lbt = r["mean_lb_table"]
        ratio_t = r["mean_migration"] / lbt if lbt > 0 else float("inf")
        checks.append(("(a) auto within 10 % of its lower bound", ratio_t <= 1.10,
                       f"mean migration / mean reported lower bound = {ratio_t:.3f}"))
    u = results.get("a-unbounded", {})
    if "auto" in u:
        r = u["auto"]
        lbt = r["mean_lb_table"]
        ratio = r["mean_migration"] / lbt if lbt > 0 else float("inf")
        checks.append(("(a-unbounded) auto within 10 % of its lower bound", ratio <= 1.10,
                       f"mean migration / mean reported lower bound = {ratio:.3f}"))
    for scenario in ("b-z0.85", "b-z0.7"):
        for name in ("mixed", "auto"):
            r = results.get(scenario, {}).get(name)
            if r:
                checks.append((f"({scenario}) {name}: median plan <= 1 s",
                               r["median_seconds"] <= 1.0, f"{r['median_seconds']:.3f} s"))
                checks.append((f"({scenario}) {name}: peak memory <= 1.5 GB",
                               r["peak_mb"] <= 1536, f"{r['peak_mb']:.0f} MB"))
        r, whole = results.get(scenario, {}).get(SPLIT), results.get(scenario, {}).get("auto")
        if r:
            limit = 1 + SCENARIOS[scenario]["theta"]
            checks.append((f"({scenario}) {SPLIT}: imbalance <= {limit:g} (hot keys split)",
                           r["max_imbalance"] <= limit + 1e-9, f"max {r['max_imbalance']:.4f}"))
            if whole:
                ratio = r["median_seconds"] / whole["median_seconds"]
                checks.append((f"({scenario}) {SPLIT}: median plan <= 2 x auto's", ratio <= 2.0,
                               f"{r['median_seconds']:.3f} s = {ratio:.2f} x"))
        r = results.get(scenario, {}).get("auto")
        if r:
            limit = 1 + SCENARIOS[scenario]["theta"]
            if r["best_possible"] <= limit:
                checks.append((f"({scenario}) auto: imbalance <= {limit:g}",
                               r["max_imbalance"] <= limit + 1e-9,
                               f"max {r['max_imbalance']:.4f}"))
            else:
                checks.append((f"({scenario}) UNREACHABLE imbalance <= {limit:g} (the top key "
                               f"alone is {r['best_possible']:.4f} mean loads); auto reaches "
                               "the best possible imbalance instead",
                               r["max_imbalance"] <= r["best_possible"] * (1 + 1e-9),
                               f"max {r['max_imbalance']:.4f}"))
    return checks


def run_scale_scenario(args) -> list[dict]:
    """Scenario ``scale`` (see the module docstring); prints its table, writes the plot."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # rebalance, if not installed
    from rebalance.evaluation.scale import format_scale, plot_scale, run_scale, summarise_scale

    keys = [int(k) for k in args.scale_keys.split(",")]
    rows = run_scale(args.scale_workdir, keys=keys, runs=max(1, args.scale_runs),
                     progress=lambda line: print(f"scale {line}", flush=True))
    summary = summarise_scale(rows)
    print(f"\n### scenario scale: rebalance plan end to end, N=64, theta=0.02, Zipf 0.7, one "
          f"window of Parquet; median (worst) of {args.scale_runs} runs, the first cold")
    print(format_scale(summary))
    print(f"plot: {plot_scale(summary, args.scale_plot)}")
    return summary


def scale_targets(summary: list[dict]) -> list[tuple[str, bool, str]]:
    """The scale targets for the whole command (each point's ``target``), on the worst run
    of each point."""
    checks = []
    for s in summary:
        if "pass" in s:
            checks.append((f"(scale) K={s['K']} {s['placement']} {s['method']}: {s['target']}",
                           bool(s["pass"]), f"worst {s['wall_max']:.2f} s, "
                           f"{s['peak_mb_max']:.0f} MB; median {s['wall']:.2f} s"))
    return checks


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        scenario, planner, intervals, time_limit = argv[1], argv[2], int(argv[3]), float(argv[4])
        print(json.dumps(run_worker(scenario, planner, intervals, time_limit)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer intervals (10 for a, 2 for b)")
    ap.add_argument("--only", help="run only the scenarios whose name starts with this "
                                   "(a, b, a-current, ...), or a comma-separated list of "
                                   "exact scenario names")
    ap.add_argument("--planners", help="comma-separated planners (default: all for a; "
                                       f"{','.join(B_PLANNERS)} for b)")
    ap.add_argument("--time-limit", type=float, default=2.0,
                    help="PlanParams.time_limit for milp and auto (default 2 s)")
    ap.add_argument("--intervals", type=int, help="override the number of counted intervals")
    ap.add_argument("--json", type=Path, help="also write all figures to this JSON file")
    ap.add_argument("--scale-keys", default="10000,100000,1000000,10000000",
                    help="scale: numbers of keys (comma-separated)")
    ap.add_argument("--scale-runs", type=int, default=3, help="scale: runs per point (>= 1)")
    ap.add_argument("--scale-workdir", type=Path, default=Path("/tmp/rebalance-scale"),
                    help="scale: folder of the generated inputs (kept and reused)")
    ap.add_argument("--scale-plot", type=Path,
                    default=Path(__file__).resolve().parents[2] / "docs" / "img" / "plan_scale.png",
                    help="scale: where the log-log plot of time against K goes")
    args = ap.parse_args(argv)

    names = [*SCENARIOS, "scale"]
    if args.only and "," in args.only:
        chosen = [s for s in args.only.split(",") if s in names]
    else:
        chosen = [s for s in names if args.only is None or s.startswith(args.only)]
    scale_rows = None
    if "scale" in chosen:
        chosen.remove("scale")
        scale_rows = run_scale_scenario(args)
    results: dict[str, dict[str, dict]] = {}
    raw = []
    for scenario in chosen:
        s = SCENARIOS[scenario]
        planners = (args.planners.split(",") if args.planners
                    else ALL_PLANNERS if scenario == "a"
                    else UNBOUNDED_PLANNERS if scenario == "a-unbounded"
                    else ALL_PLANNERS if scenario == "a-current"
                    else DIAGNOSTIC_PLANNERS if scenario.startswith("a-") else B_PLANNERS)
        n = args.intervals or (s["quick_intervals"] if args.quick else s["intervals"])
        summaries = []
        for planner in planners:
            t0 = time.perf_counter()
            result = run_in_subprocess(scenario, planner, n, args.time_limit)
            if "error" in result:
                print(f"{scenario} {planner}: FAILED: {result['error']}", flush=True)
                continue
            raw.append(result)
            summary = summarise(result)
            summaries.append(summary)
            print(f"{scenario} {planner}: done in {time.perf_counter() - t0:.1f} s", flush=True)
        if summaries:
            print_table(scenario, summaries)
            results[scenario] = {r["planner"]: r for r in summaries}
    print("\n### targets")
    failed = 0
    checks = check_targets(results)
    if scale_rows is not None:
        checks += scale_targets(scale_rows)
    for name, ok, detail in checks:
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    if args.json:
        args.json.write_text(json.dumps({"summaries": results, "raw": raw}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
