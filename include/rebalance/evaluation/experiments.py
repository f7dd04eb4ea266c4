"""The experiments of ``rebalance bench``: grids of points, each a trace and planners,
replayed by :func:`rebalance.evaluation.runner.replay` (one flat ``results.csv``).

:data:`EXPERIMENTS` holds ``quick`` (one small point of each paper's workload, used by a
test), ``zipf-sweeps`` (Fang et al.), ``migration-budgets`` (Madsen et al.), ``elb-clb`` and
``hash-routings`` (the ELB/CLB paper) and ``replay`` (a histogram table of the streaming
job, every planner). Each experiment's grid, the figures it reproduces and its former
names: ``docs/evaluation.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from rebalance.core.histogram_files import read_histogram_table
from rebalance.core.model import PlanningError, PlanParams
from rebalance.evaluation.runner import PlannerSpec, parse_planners, replay
from rebalance.evaluation.workloads import (
    Trace,
    histogram_trace,
    perturbation_trace,
    substream_trace,
    zipf_trace,
)

#: The replay experiments (``rebalance bench`` also has ``scale``, :mod:`.scale`).
EXPERIMENTS = ("quick", "zipf-sweeps", "migration-budgets", "elb-clb", "hash-routings",
               "replay")


@dataclass
class Point:
    """One experiment point: parameters (for the table), a trace factory and planners."""

    labels: dict[str, Any]
    make_trace: Callable[[], Trace]
    planners: list[PlannerSpec]
    params: PlanParams
    window: int = 1
    intervals: int = 0   # number of intervals of the trace (for the progress bar)


@dataclass
class Settings:
    """User choices that override the experiment defaults."""

    planners: str | None = None
    intervals: int | None = None
    seed: int = 0
    time_limit: float | None = None
    histograms: str | None = None
    instances: int | None = None
    theta: float | None = None


def _specs(default: str, settings: Settings) -> list[PlannerSpec]:
    return parse_planners(settings.planners or default)


# ----------------------------------------------------------------- Fang et al.: sweeps

SWEEP_DEFAULTS = dict(K=10_000, N=15, z=0.85, f=1.0, theta=0.08, A_max=3000)
SWEEPS = {
    "N": [5, 10, 15, 20, 30, 40],
    "theta": [0.02, 0.05, 0.08, 0.2, 0.5],
    "K": [5_000, 10_000, 100_000],
    "f": [0.25, 0.5, 1.0, 1.5, 2.0],
    "A_max": [0, 100, 300, 1000, 3000],
}
SWEEP_PLANNERS = "hash,mintable,minmig,mixed,greedy,auto"


def _sweep_point(sweep: str, values: dict[str, Any], specs, intervals: int, seed: int,
                 time_limit: float) -> Point:
    v = dict(values)
    params = PlanParams(theta=v["theta"], max_table=v["A_max"], time_limit=time_limit,
                        seed=seed)
    return Point(
        labels=dict(sweep=sweep, **v),
        make_trace=lambda: zipf_trace(n_keys=v["K"], n_instances=v["N"], intervals=intervals,
                                      zipf=v["z"], fluctuation=v["f"], seed=seed),
        planners=specs, params=params, intervals=intervals)


def zipf_sweeps(settings: Settings, sweeps: dict[str, list] | None = None,
                defaults: dict[str, Any] | None = None) -> list[Point]:
    intervals = settings.intervals or 11
    specs = _specs(SWEEP_PLANNERS, settings)
    base = dict(SWEEP_DEFAULTS, **(defaults or {}))
    points = []
    for name, values in (sweeps or SWEEPS).items():
        for value in values:
            points.append(_sweep_point(name, dict(base, **{name: value}), specs, intervals,
                                       settings.seed, settings.time_limit or 2.0))
    return points


# -------------------------------------------------------------- Madsen et al.: budgets

BUDGET_CLUSTERS = [(20, 400), (40, 800), (60, 1200)]
BUDGETS = [10, 20, 30, 40]
BUDGET_VARIES = [0.2, 0.6]
BUDGET_PLANNERS = "milp,flux,greedy"
BUDGET_THETA = 0.01


def migration_budgets(settings: Settings, clusters=None, budgets=None,
                      varies=None) -> list[Point]:
    intervals = settings.intervals or 3
    specs = _specs(BUDGET_PLANNERS, settings)
    theta = settings.theta or BUDGET_THETA
    points = []
    for n, g in clusters or BUDGET_CLUSTERS:
        for var in varies or BUDGET_VARIES:
            for budget in budgets or BUDGETS:
                params = PlanParams(theta=theta, budget_keys=budget,
                                    time_limit=settings.time_limit or 2.0, seed=settings.seed)
                points.append(Point(
                    labels=dict(sweep="budget", N=n, G=g, varies=var, budget=budget,
                                theta=theta),
                    make_trace=(lambda n=n, g=g, var=var: perturbation_trace(
                        n, g, intervals=intervals, varies=var, seed=settings.seed)),
                    planners=specs, params=params, intervals=intervals))
    return points


# ---------------------------------------------------- the ELB/CLB paper: ELB, CLB, baselines

ELB_CLB_PLANNERS = "hash,elb,clb@24,lpt"


def elb_clb(settings: Settings, instances: Sequence[int] = (5, 10, 15),
            thetas: Sequence[float] = (0.1, 0.2), n_substreams: int = 100) -> list[Point]:
    intervals = settings.intervals or 121
    specs = _specs(ELB_CLB_PLANNERS, settings)
    points = []
    for theta in ([settings.theta] if settings.theta else thetas):
        for dist in ("gaussian", "zipf"):
            for n in instances:
                params = PlanParams(theta=theta, time_limit=settings.time_limit or 2.0,
                                    seed=settings.seed)
                points.append(Point(
                    labels=dict(sweep="distribution", distribution=dist, N=n, p=n_substreams,
                                theta=theta),
                    make_trace=(lambda dist=dist, n=n: substream_trace(
                        dist, n_substreams, n, intervals=intervals, seed=settings.seed)),
                    planners=specs, params=params, intervals=intervals))
    return points


HASH_ROUTING_PLANNERS = "hash,uhlb,pkg,dchoices,elb,clb@24,auto"
#: The hash-routings experiment's (label, distribution, number of keys) of the N = 10
#: comparison. The paper compares on a Twitter word count we do not have: "words" stands
#: in for it (1000 keys, Zipf 1, the same traffic model as its synthetic substreams).
HASH_ROUTING_STREAMS = (("substreams", "zipf", 100), ("substreams", "gaussian", 100),
                   ("words", "zipf", 1000))
SPEEDUP_N = tuple(range(1, 16))


def hash_routings(settings: Settings, speedup_n: Sequence[int] = SPEEDUP_N,
                  streams=HASH_ROUTING_STREAMS, n_instances: int = 10) -> list[Point]:
    """The ELB/CLB paper, Sec. 5: its baselines UHLB and PKG (and D-Choices) against ELB,
    CLB, the project's default (auto) and plain hash. Part 1: N = 10 on each stream of
    ``streams``, 121 windows (120 routed or planned). Part 2: the speedup over
    N = 1..15 on the Zipf substreams, 49 windows each (two CLB rebalances). With
    ``--intervals I`` both parts use I windows (the quick mode: a few)."""
    specs = _specs(HASH_ROUTING_PLANNERS, settings)
    theta = settings.theta or 0.1
    params = PlanParams(theta=theta, time_limit=settings.time_limit or 2.0,
                        seed=settings.seed)
    points = []
    parts = [("n10", label, dist, p, n_instances, settings.intervals or 121)
             for label, dist, p in streams]
    parts += [("speedup", "substreams", "zipf", 100, n, settings.intervals or 49)
              for n in speedup_n]
    for sweep, label, dist, p, n, intervals in parts:
        points.append(Point(
            labels=dict(sweep=sweep, stream=label, distribution=dist, N=n, p=p, theta=theta),
            make_trace=(lambda dist=dist, p=p, n=n, intervals=intervals: substream_trace(
                dist, p, n, intervals=intervals, seed=settings.seed)),
            planners=specs, params=params, intervals=intervals))
    return points


# --------------------------------------------------------------------------- quick / replay

def quick(settings: Settings) -> list[Point]:
    """One small point per paper's workload: seconds, not minutes."""
    intervals = settings.intervals or 4
    tl = settings.time_limit or 0.5
    seed = settings.seed
    specs = settings.planners
    points = [
        Point(labels=dict(sweep="zipf", K=2000, N=8, z=0.85, f=1.0, theta=0.08, A_max=300),
              make_trace=lambda: zipf_trace(2000, 8, intervals=intervals, seed=seed),
              planners=parse_planners(specs or "hash,greedy,mixed,mintable,flux"),
              params=PlanParams(theta=0.08, max_table=300, time_limit=tl, seed=seed),
              intervals=intervals),
        Point(labels=dict(sweep="perturbation", N=10, G=100, varies=0.4, budget=10, theta=0.01),
              make_trace=lambda: perturbation_trace(10, 100, intervals=intervals, varies=0.4,
                                                    seed=seed),
              planners=parse_planners(specs or "milp,flux,greedy"),
              params=PlanParams(theta=0.01, budget_keys=10, time_limit=tl, seed=seed),
              intervals=intervals),
        Point(labels=dict(sweep="substreams", distribution="zipf", N=5, p=50, theta=0.1),
              make_trace=lambda: substream_trace("zipf", 50, 5, intervals=3 * intervals,
                                                 seed=seed),
              planners=parse_planners(specs or f"hash,elb,clb@{intervals},uhlb,pkg"),
              params=PlanParams(theta=0.1, time_limit=tl, seed=seed),
              intervals=3 * intervals),
    ]
    return points


def replay_points(settings: Settings) -> list[Point]:
    if not settings.histograms or not settings.instances:
        raise PlanningError("replay needs --histograms PATH and --instances N")
    frame = read_histogram_table(settings.histograms)
    trace = histogram_trace(frame, settings.instances, name=str(settings.histograms))
    if settings.intervals:
        trace = _first_intervals(trace, settings.intervals)
    theta = settings.theta or 0.08
    params = PlanParams(theta=theta, time_limit=settings.time_limit or 2.0, seed=settings.seed)
    specs = _specs("hash,greedy,mixed,mintable,elb,flux,milp", settings)
    return [Point(labels=dict(sweep="replay", N=settings.instances, K=trace.n_keys,
                              theta=theta),
                  make_trace=lambda: trace, planners=specs, params=params,
                  intervals=trace.n_intervals)]


def _first_intervals(trace: Trace, n: int) -> Trace:
    if n < 2:
        raise PlanningError(f"--intervals must be >= 2, got {n}")
    return dataclasses.replace(trace, load=trace.load[:n], state=trace.state[:n])


def build(experiment: str, settings: Settings) -> list[Point]:
    if settings.intervals is not None and settings.intervals < 2:
        raise PlanningError(f"--intervals must be >= 2, got {settings.intervals}")
    if experiment == "quick":
        return quick(settings)
    if experiment == "zipf-sweeps":
        return zipf_sweeps(settings)
    if experiment == "migration-budgets":
        return migration_budgets(settings)
    if experiment == "elb-clb":
        return elb_clb(settings)
    if experiment == "hash-routings":
        return hash_routings(settings)
    if experiment == "replay":
        return replay_points(settings)
    raise PlanningError(f"unknown experiment {experiment!r}; choose one of "
                        f"{', '.join(EXPERIMENTS)}")


def total_steps(points: Sequence[Point]) -> int:
    return sum(len(p.planners) * max(0, p.intervals - 1) for p in points)


def run(experiment: str, points: Sequence[Point],
        progress: Callable[[int], None] | None = None) -> pd.DataFrame:
    """Run every point; one row per point, planner and interval."""
    rows = []
    for i, point in enumerate(points):
        trace = point.make_trace()
        for row in replay(trace, point.planners, point.params, point.window, progress):
            rows.append(dict(experiment=experiment, point=i,
                             **point.labels, **row))
    return pd.DataFrame(rows)


def summarise(results: pd.DataFrame) -> pd.DataFrame:
    """One row per experiment point and planner.

    ``migration_fraction`` is the mean over all intervals (amortised, held intervals count
    as 0); ``migration_per_rebalance`` the mean over the intervals that rebalanced;
    ``plan_seconds`` and ``gap`` are over rebalancing intervals only; ``load_var_next_std``
    is the standard deviation over intervals of the realised load variance / mean^2.
    """
    if results.empty:
        return results
    label_cols = [c for c in results.columns
                  if c not in _metric_columns(results) and c not in ("interval",)]
    out = []
    for key, grp in results.groupby(label_cols, sort=False, dropna=False):
        reb = grp[grp["rebalanced"].astype(bool)]
        row = dict(zip(label_cols, key))
        row.update(
            intervals=len(grp), rebalances=len(reb),
            imbalance_before=grp["imbalance_before"].mean(),
            imbalance_after=grp["imbalance_after"].mean(),
            imbalance_after_max=grp["imbalance_after"].max(),
            imbalance_next=grp["imbalance_next"].mean(),
            load_distance_after=grp["load_distance_after"].mean(),
            load_var_next=grp["load_var_next"].mean(),
            load_var_next_std=grp["load_var_next"].std(ddof=0),
            migration_fraction=grp["migration_fraction"].mean(),
            migration_per_rebalance=reb["migration_fraction"].mean() if len(reb) else 0.0,
            moved_keys=reb["moved_keys"].mean() if len(reb) else 0.0,
            table_size=grp["table_size"].mean(),
            plan_seconds=reb["plan_seconds"].mean() if len(reb) else 0.0,
            plan_seconds_max=reb["plan_seconds"].max() if len(reb) else 0.0,
            lower_bound_fraction=reb["lower_bound_fraction"].mean() if len(reb) else 0.0,
            gap=reb["gap"].mean() if len(reb) else 0.0,
            feasible_share=reb["feasible"].astype(float).mean() if len(reb) else float("nan"),
        )
        row.update(_routing_summary(grp))
        out.append(row)
    return pd.DataFrame(out)


def _routing_summary(grp: pd.DataFrame) -> dict[str, float]:
    """Speedup and the consolidation columns (hash routings that split keys).

    ``speedup`` = sum over windows of the total load / sum of the largest instance load:
    the throughput relative to one instance when the most loaded instance sets the pace
    (the ELB/CLB paper's Fig. 6, from loads). ``split_keys``, ``extra_partials`` and
    ``consolidation_fraction`` are means per window; ``choices`` the mean d of a routing.
    """
    out: dict[str, float] = {}
    if "imbalance_next" in grp:
        out["imbalance_next_max"] = grp["imbalance_next"].max()
    if {"load_next", "max_load_next"} <= set(grp.columns):
        busy = float(grp["max_load_next"].sum())
        out["speedup"] = float(grp["load_next"].sum()) / busy if busy > 0 else 1.0
    for col in ("split_keys", "extra_partials", "consolidation_fraction", "choices"):
        if col in grp:
            out[col] = grp[col].mean()
    return out


_RUNNER_METRICS = {
    "imbalance_before", "imbalance_after", "load_distance_after", "load_var_after",
    "migration_fraction", "migration_bytes", "moved_keys", "table_size", "n_keys",
    "plan_seconds", "lower_bound_fraction", "gap", "feasible", "rebalanced",
    "imbalance_next", "load_distance_next", "load_var_next", "load_next", "max_load_next",
    "split_keys", "extra_partials", "consolidation_fraction", "choices",
}


def _metric_columns(results: pd.DataFrame) -> set[str]:
    return {c for c in results.columns if c in _RUNNER_METRICS}
