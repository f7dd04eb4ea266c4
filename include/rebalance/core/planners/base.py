"""The planner interface: every planner takes a Problem and PlanParams and returns a Plan."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from rebalance.core.bounds import cover_lower_bound, migration_lower_bound, table_cannot_bind
from rebalance.core.float_tolerances import CHECK_TOL, LOAD_TOL
from rebalance.core.model import Metrics, Plan, PlanParams, Problem, evaluate


@dataclass
class Proposal:
    """What a planner's search returns before evaluation."""

    assignment: np.ndarray
    notes: list[str] = field(default_factory=list)
    solver_bound: float | None = None
    #: (max load, bytes): an integer knapsack-cover bound the planner already computed
    #: for that max load; ``finish_plan`` reuses it instead of solving the covers again.
    cover_bound: tuple[float, float] | None = None


class Planner(ABC):
    """Base class of all planners.

    Subclasses set ``name`` and implement :meth:`propose`. :meth:`plan` times
    the search, evaluates the assignment from scratch (so reported metrics are
    always the recomputed ones), checks the hard limits and adds the lower bound.
    Planners must be deterministic for the same input and parameters.
    """

    name: str = ""
    #: Report the integer knapsack-cover bound too (``rebalance.core.bounds.cover_lower_bound``,
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
    if metrics.imbalance_after > limit * (1 + CHECK_TOL):
        reasons.append(f"imbalance {metrics.imbalance_after:.4f} exceeds 1 + theta = {limit:.4f}")
    if params.max_table is not None and metrics.table_size > params.max_table:
        reasons.append(f"table size {metrics.table_size} exceeds max table {params.max_table}")
    if params.budget_bytes is not None and metrics.migration_bytes > params.budget_bytes * (1 + CHECK_TOL):
        reasons.append(
            f"migration {metrics.migration_bytes:.0f} bytes exceeds budget {params.budget_bytes:.0f}")
    if params.budget_keys is not None and metrics.moved_keys > params.budget_keys:
        reasons.append(f"{metrics.moved_keys} moved keys exceed budget {params.budget_keys}")
    if problem.drain and np.isin(assignment, list(problem.drain)).any():
        reasons.append(f"keys remain on drained instances {sorted(problem.drain)}")
    return reasons


def finish_plan(method: str, problem: Problem, params: PlanParams, proposal: Proposal,
                seconds: float, cover_bound: bool = False) -> Plan:
    """Evaluate a proposal into a Plan with metrics, feasibility and lower bound.

    With ``cover_bound`` the reported bound is also at least the integer knapsack-cover
    bound for the plan's own maximum load (``rebalance.core.bounds.cover_lower_bound``); the
    notes say which bound was reported.
    """
    a = np.asarray(proposal.assignment, dtype=np.int64)
    metrics = evaluate(problem, a)
    reasons = check_limits(problem, params, metrics, a)
    # Bound for reaching the looser of the target and what this plan reached, and (with
    # A_max) the looser of A_max and this plan's table, so it is a true lower bound for
    # this plan too. With A_max it is the table-aware (Lagrangian) bound of
    # rebalance.core.bounds, never below the plain one.
    target = max(problem.max_load(params.theta), metrics.max_load_after)
    table = None
    if params.max_table is not None:
        table = max(int(params.max_table), int(metrics.table_size))
    if table is not None and table_cannot_bind(problem, target, table):
        table = None  # the table-aware bound equals the plain one here; skip its search
    lb = migration_lower_bound(problem, target, max_table=table)
    notes = list(proposal.notes)
    if cover_bound:
        known = proposal.cover_bound
        whole = (known[1] if known is not None and abs(known[0] - target) <= LOAD_TOL * target
                 else cover_lower_bound(problem, target))
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
