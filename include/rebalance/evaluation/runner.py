"""The replay loop: every planner on the same trace, interval after interval.

For each planner the assignment starts at ``trace.initial``. At interval t = 1..I-1 the
planner sees a problem built from the last ``window`` windows before t (load: their
mean; state: their sum, Fang et al.'s S(k, w), or for a histogram table, which reports the
state held at each window close, that of window t-1) with the assignment carried from interval
t-1 as the current one, plans, and its assignment is carried on. A planner spec
``name@m`` rebalances only at t = m, 2m, ... (the ELB/CLB paper's CLB, with the load series
of the last m windows); in between the assignment is held and only measured.

One row per planner and interval, with the plan's metrics (recomputed by
:func:`rebalance.core.model.evaluate`, the lower bound of :mod:`rebalance.core.bounds` and the
gap to it) and the imbalance the assignment then meets on window t itself (the data it
was not planned on). The hash routings of :mod:`rebalance.evaluation.hash_routings` are
replayed into rows of the same columns by :func:`replay_routing`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rebalance.core.model import Plan, PlanningError, PlanParams, Problem, evaluate, imbalance
from rebalance.core.planners import METHODS, get_planner
from rebalance.evaluation.flux import FluxPlanner
from rebalance.evaluation.hash_routings import ROUTINGS, ChoiceRouter, key_ids
from rebalance.evaluation.workloads import Trace

EXTRA_PLANNERS = ("flux",) + ROUTINGS


@dataclass(frozen=True)
class PlannerSpec:
    """A planner as the harness runs it: registry name, rebalance period, parameters."""

    name: str
    period: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name if self.period == 1 else f"{self.name}@{self.period}"

    @classmethod
    def parse(cls, text: str) -> PlannerSpec:
        """``name`` or ``name@period`` (e.g. ``clb@24``)."""
        name, _, period = text.strip().partition("@")
        if name not in METHODS and name not in EXTRA_PLANNERS:
            raise PlanningError(f"unknown planner {name!r}; choose from "
                                f"{', '.join(METHODS + EXTRA_PLANNERS)}")
        try:
            p = int(period) if period else 1
        except ValueError:
            raise PlanningError(f"planner period must be an integer: {text!r}") from None
        if p < 1:
            raise PlanningError(f"planner period must be >= 1: {text!r}")
        if name in ROUTINGS and p != 1:
            raise PlanningError(f"{name} takes no @period: it routes each tuple as it "
                                f"arrives, there is nothing to rebalance: {text!r}")
        return cls(name, p)

    def planner(self):
        return FluxPlanner() if self.name == "flux" else get_planner(self.name)


def parse_planners(text: str | Sequence[str]) -> list[PlannerSpec]:
    items = text.split(",") if isinstance(text, str) else list(text)
    specs = [PlannerSpec.parse(t) for t in items if t.strip()]
    if not specs:
        raise PlanningError("no planner given")
    return specs


def interval_problem(trace: Trace, t: int, assignment: np.ndarray, window: int = 1,
                     series: int = 0) -> tuple[Problem, np.ndarray]:
    """The problem planned at interval t (windows max(0, t-window)..t-1) and the positions
    of its keys in the trace: keys with load or state in those windows."""
    if not 1 <= t < trace.n_intervals:
        raise PlanningError(f"interval {t} outside [1, {trace.n_intervals})")
    lo = max(0, t - window)
    load = trace.load[lo:t].mean(axis=0)
    state = trace.state[t - 1] if trace.state_is_snapshot else trace.state[lo:t].sum(axis=0)
    pos = np.flatnonzero((load > 0) | (state > 0))
    load_series = None
    if series > 1:
        load_series = trace.load[max(0, t - series):t][:, pos]
    problem = Problem(
        keys=trace.keys[pos], load=load[pos], state=state[pos], current=assignment[pos],
        default=trace.default[pos], n_instances=trace.n_instances, load_series=load_series,
        key_group=None if trace.key_group is None else trace.key_group[pos])
    return problem, pos


def instance_stats(loads: np.ndarray) -> tuple[float, float, float]:
    """(max / mean, max |L - mean| / mean, population variance / mean^2) of instance loads."""
    mean = float(loads.mean()) if len(loads) else 0.0
    if mean <= 0:
        return 1.0, 0.0, 0.0
    return (imbalance(loads), float(np.abs(loads - mean).max()) / mean,
            float(loads.var()) / mean ** 2)


def _row(plan: Plan | None, problem: Problem, assignment_keys: np.ndarray) -> dict[str, Any]:
    m = plan.metrics if plan is not None else evaluate(problem, assignment_keys)
    loads = problem.instance_loads(assignment_keys)
    _, distance, var = instance_stats(loads[problem.active])
    row = dict(
        imbalance_before=m.imbalance_before, imbalance_after=m.imbalance_after,
        load_distance_after=distance, load_var_after=var,
        migration_fraction=m.migration_fraction, migration_bytes=m.migration_bytes,
        moved_keys=m.moved_keys, table_size=m.table_size, n_keys=m.n_keys)
    if plan is None:
        row.update(plan_seconds=0.0, lower_bound_fraction=math.nan, gap=math.nan,
                   feasible=math.nan, rebalanced=False)
    else:
        lb = plan.lower_bound_fraction
        row.update(plan_seconds=plan.plan_seconds, lower_bound_fraction=lb,
                   gap=(m.migration_fraction - lb) if math.isfinite(lb) else math.nan,
                   feasible=bool(plan.feasible), rebalanced=True)
    return row


def replay(trace: Trace, specs: Sequence[PlannerSpec], params: PlanParams, window: int = 1,
           progress: Callable[[int], None] | None = None,
           keep_plans: bool = False) -> list[dict[str, Any]]:
    """Replay ``trace`` for every planner; one row per planner and interval 1..I-1.

    With ``keep_plans`` each row also carries ``_problem`` and ``_plan`` (for tests).
    """
    rows: list[dict[str, Any]] = []
    for spec in specs:
        if spec.name in ROUTINGS:
            rows.extend(replay_routing(trace, spec.name, params, window, progress))
            continue
        planner = spec.planner()
        spec_params = replace(params, **spec.overrides) if spec.overrides else params
        assignment = trace.initial.copy()
        for t in range(1, trace.n_intervals):
            rebalance = t % spec.period == 0  # period m: at t = m, 2m, ... (full series)
            series = spec.period if spec.period > 1 else (window if window > 1 else 0)
            if spec.name == "clb" and series < 2:
                series = max(2, window)
            problem, pos = interval_problem(trace, t, assignment, window, series)
            plan = None
            if rebalance:
                plan = planner.plan(problem, spec_params)
                assignment[pos] = plan.assignment
                row = _row(plan, problem, plan.assignment)
            else:
                row = _row(None, problem, assignment[pos])
            realised = np.bincount(assignment, weights=trace.load[t],
                                   minlength=trace.n_instances)[:trace.n_instances]
            row = dict(planner=spec.label, interval=t, **row, **_next(realised),
                       split_keys=0, extra_partials=0, consolidation_fraction=0.0)
            if keep_plans:
                row.update(_problem=problem, _plan=plan, _positions=pos)
            rows.append(row)
            if progress is not None:
                progress(1)
    return rows


def _next(realised: np.ndarray) -> dict[str, float]:
    """The columns of window t: imbalance, distance, variance, total and largest load."""
    imb, distance, var = instance_stats(realised)
    return dict(imbalance_next=imb, load_distance_next=distance, load_var_next=var,
                load_next=float(realised.sum()),
                max_load_next=float(realised.max()) if len(realised) else 0.0)


def replay_routing(trace: Trace, name: str, params: PlanParams, window: int = 1,
                   progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Rows of a hash routing (:data:`ROUTINGS`) over ``trace``, interval 1..I-1.

    The routings (``uhlb``, ``pkg``, ``dchoices``, ``wchoices``: the ELB/CLB paper's
    baselines and D-Choices) plan nothing and move no key (``migration_fraction`` 0: a
    key's candidates never change). ``split_keys``, ``extra_partials`` and
    ``consolidation_fraction`` are 0 for every planner, which keeps each key on one
    instance. The job is taken to have run with the routing from the start, so no state
    moves when the replay begins. "After" columns: window(s) t-1 routed (the load the planners plan
    on); "next" columns: window t routed, with the candidates chosen on window t-1
    (D-Choices' heavy hitters and d). ``split_keys`` and ``extra_partials`` count the
    keys on two or more instances of window t and their partial states beyond one;
    ``consolidation_fraction`` is the state a consolidation step ships (every split key
    merged into its largest part) over window t's state.
    """
    n = trace.n_instances
    router = ChoiceRouter(name, key_ids(trace.keys, trace.key_group), n, seed=params.seed,
                          theta=params.theta)
    rows = []
    routed = None
    for t in range(1, trace.n_intervals):
        lo = max(0, t - window)
        before = trace.load[lo:t].mean(axis=0)
        if window == 1 and routed is not None:
            after = routed.instance_loads   # window t-1, routed as the "next" one of t-1
        else:
            reference = trace.load[max(0, lo - 1):max(1, lo)].mean(axis=0)
            after = router.route(before, reference).instance_loads
        state_before = (trace.state[t - 1] if trace.state_is_snapshot
                        else trace.state[lo:t].sum(axis=0))
        routed = router.route(trace.load[t], before)
        realised = routed.instance_loads
        imb, distance, var = instance_stats(after)
        state = trace.state[t]
        total_state = float(state.sum())
        consolidation = routed.consolidation_bytes(state)
        rows.append(dict(
            planner=name, interval=t, imbalance_before=imb, imbalance_after=imb,
            load_distance_after=distance, load_var_after=var, migration_fraction=0.0,
            migration_bytes=0.0, moved_keys=0, table_size=math.nan,
            n_keys=int(((before > 0) | (state_before > 0)).sum()), plan_seconds=0.0,
            lower_bound_fraction=math.nan, gap=math.nan, feasible=math.nan,
            rebalanced=False, **_next(realised), split_keys=routed.split_keys,
            extra_partials=routed.extra_partials,
            consolidation_fraction=consolidation / total_state if total_state > 0 else 0.0,
            choices=router.last_d))
        if progress is not None:
            progress(1)
    return rows
