"""The planner interface: every planner takes a Problem and PlanParams and returns a Plan."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from ..bounds import _ratio, cover_lower_bound, migration_lower_bound
from ..model import Metrics, Plan, PlanParams, Problem, evaluate


@dataclass
class Proposal:
    """What a planner's search returns before evaluation."""

    assignment: np.ndarray
    notes: list[str] = field(default_factory=list)
    solver_bound: float | None = None


class Planner(ABC):
    """Base class of all planners.

    Subclasses set ``name`` and implement :meth:`propose`. :meth:`plan` times
    the search, evaluates the assignment from scratch (so reported metrics are
    always the recomputed ones), checks the hard limits and adds the lower bound.
    Planners must be deterministic for the same input and parameters.
    """

    name: str = ""
    #: Report the integer knapsack-cover bound too (``rebalance.bounds.cover_lower_bound``,
    #: a few tenths of a second at 10^4 keys): only the planners that search (auto, milp),
    #: so cheap planners stay cheap.
    cover_bound: bool = False

    @abstractmethod
    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        """Compute a new assignment (int64 array of length K, values in [0, N))."""

    def plan(self, problem: Problem, params: PlanParams, cover_bound: bool | None = None) -> Plan:
        t0 = time.perf_counter()
        proposal = self.propose(problem, params)
        seconds = time.perf_counter() - t0
        return finish_plan(self.name, problem, params, proposal, seconds,
                           cover_bound=self.cover_bound if cover_bound is None else cover_bound)


def check_limits(problem: Problem, params: PlanParams, metrics: Metrics,
                 assignment: np.ndarray) -> list[str]:
    """Reasons the assignment breaks a hard limit (empty when it meets all of them)."""
    reasons = []
    limit = 1.0 + params.theta
    if metrics.imbalance_after > limit * (1 + 1e-9):
        reasons.append(f"imbalance {metrics.imbalance_after:.4f} exceeds 1 + theta = {limit:.4f}")
    if params.max_table is not None and metrics.table_size > params.max_table:
        reasons.append(f"table size {metrics.table_size} exceeds max table {params.max_table}")
    if params.budget_bytes is not None and metrics.migration_bytes > params.budget_bytes * (1 + 1e-9):
        reasons.append(
            f"migration {metrics.migration_bytes:.0f} bytes exceeds budget {params.budget_bytes:.0f}")
    if params.budget_keys is not None and metrics.moved_keys > params.budget_keys:
        reasons.append(f"{metrics.moved_keys} moved keys exceed budget {params.budget_keys}")
    if problem.drain and np.isin(assignment, list(problem.drain)).any():
        reasons.append(f"keys remain on drained instances {sorted(problem.drain)}")
    return reasons


def _table_cannot_bind(problem: Problem, max_load: float, max_table: int) -> bool:
    """True when the table-aware bound (``rebalance.bounds``) equals the plain one, so
    ``finish_plan`` can skip its multiplier search (about 1 s at 10^6 keys).

    The plain bound is the optimum of the LP "every overloaded instance sheds its
    excess", solved by a fractional knapsack per instance that touches, in increasing
    state per load, only as many keys as cover the excess. If the current table (keys off
    their default instance, not forced to move) plus every key those knapsacks touch fits
    in ``max_table``, that optimal solution meets the relaxed table inequality, so the LP
    with the table inequality has the same optimum and the Lagrangian bound (<= that
    optimum by weak duality, >= the plain bound by construction) equals it. Returning the
    plain bound is valid in any case; this only decides when the tighter one cannot help.
    """
    forced = problem.must_move()
    stay = ~forced
    cur = problem.current
    room = int(max_table) - int(((cur != problem.default) & stay).sum())
    if room < 0:
        return False
    if float(problem.load.max(initial=0.0)) > max_load * (1 + 1e-12):
        return True  # both bounds are inf
    load = problem.load[stay]
    state = problem.state[stay]
    cur_s = cur[stay]
    loads = np.bincount(cur_s, weights=load, minlength=problem.n_instances)
    over = np.flatnonzero(loads > max_load * (1 + 1e-12))
    if len(over) == 0:
        return True
    is_over = np.zeros(len(loads), dtype=bool)
    is_over[over] = True
    sel = np.flatnonzero(is_over[cur_s])
    if len(sel) <= room:
        return True
    sel = sel[np.argsort(cur_s[sel], kind="stable")]
    grouped = cur_s[sel]
    starts = np.searchsorted(grouped, over, side="left")
    ends = np.searchsorted(grouped, over, side="right")
    touched = 0
    for d, lo, hi in zip(over, starts, ends):
        keys = sel[lo:hi]
        excess = float(loads[d] - max_load)
        ratio = _ratio(state[keys], load[keys])
        n = len(keys)
        k = min(n, 256)
        while True:
            part = np.argpartition(ratio, k - 1)[:k] if k < n else np.arange(n)
            part = part[np.argsort(ratio[part], kind="stable")]
            cum = np.cumsum(load[keys][part])
            if k >= n or cum[-1] >= excess:
                break
            k = min(n, 4 * k)
        # Keys the knapsack takes: whole ones, plus the fractional one (ties in the ratio
        # order only change which optimal solution, not how many keys it needs at most k).
        touched += min(n, int(np.searchsorted(cum, excess, side="left")) + 1)
        if touched > room:
            return False
    return True


def finish_plan(method: str, problem: Problem, params: PlanParams, proposal: Proposal,
                seconds: float, cover_bound: bool = False) -> Plan:
    """Evaluate a proposal into a Plan with metrics, feasibility and lower bound.

    With ``cover_bound`` the reported bound is also at least the integer knapsack-cover
    bound for the plan's own maximum load (``rebalance.bounds.cover_lower_bound``); the
    notes say which bound was reported.
    """
    a = np.asarray(proposal.assignment, dtype=np.int64)
    metrics = evaluate(problem, a)
    reasons = check_limits(problem, params, metrics, a)
    # Bound for reaching the looser of the target and what this plan reached, and (with
    # A_max) the looser of A_max and this plan's table, so it is a true lower bound for
    # this plan too. With A_max it is the table-aware (Lagrangian) bound of
    # rebalance.bounds, never below the plain one.
    target = max(problem.max_load(params.theta), metrics.max_load_after)
    table = None
    if params.max_table is not None:
        table = max(int(params.max_table), int(metrics.table_size))
    if table is not None and _table_cannot_bind(problem, target, table):
        table = None  # the table-aware bound equals the plain one here; skip its search
    lb = migration_lower_bound(problem, target, max_table=table)
    notes = list(proposal.notes)
    if cover_bound:
        whole = cover_lower_bound(problem, target)
        if whole is None:
            notes.append("lower bound: combinatorial (integer cover bound not computed: "
                         "too many keys on overloaded instances)")
        elif whole > lb:
            notes.append(f"lower bound: integer knapsack cover, {whole:.0f} bytes "
                         f"(combinatorial {lb:.0f})")
            lb = whole
        else:
            notes.append(f"lower bound: combinatorial, {lb:.0f} bytes (integer cover {whole:.0f})")
    total_state = float(problem.state.sum())
    lb_frac = lb / total_state if total_state > 0 and np.isfinite(lb) else (0.0 if lb == 0 else lb)
    return Plan(
        method=method,
        assignment=a,
        moved=a != problem.current,
        metrics=metrics,
        params=params,
        feasible=not reasons,
        lower_bound_bytes=lb,
        lower_bound_fraction=float(lb_frac),
        plan_seconds=seconds,
        notes=notes + reasons,
        solver_bound=proposal.solver_bound,
    )
