"""The default planner: seed 003's Mixed, then a MILP polish when it can pay off.

Why (measured by ``include/benchmarks/plan_benchmark.py``, see ``docs/planning.md``):
Mixed is fast at any size and keeps the routing table within A_max, but on seed 003's
workload it moves about twice the state of the migration lower bound; the MILP of seed
002 (warm-started) lands within a few percent of that bound on 10^4 keys in well under
a second, with A_max in the model, but it gets slow on millions of keys. So:

1. Run Mixed (:class:`~rebalance.planners.llfd.MixedPlanner`).
2. Stop there when polishing cannot pay off: Mixed is feasible and already within
   :data:`GOOD_ENOUGH` of the migration lower bound, or the problem is larger than
   :data:`MILP_MAX_KEYS` keys, or less than :data:`MIN_MILP_SECONDS` of
   ``params.time_limit`` is left.
3. Otherwise run the MILP (:class:`~rebalance.planners.milp.MilpPlanner`) warm-started
   from Mixed's assignment with MILP_SHARE of the time left. The MILP models A_max
   (table size = keys off their default instance) and itself applies :func:`fit_table`
   to its result: keys it moves anyway go to their default instance where that stays
   within L_max (free), and only if the rounding of its light keys left the table above
   A_max, keys go back home, cheapest first. Auto applies :func:`fit_table` again only as
   a fallback, if the MILP's plan still exceeds A_max (e.g. it returned its start).
4. Keep the better plan: feasible beats infeasible; among feasible plans the one that
   migrates fewer bytes (ties: smaller table, then Mixed); among infeasible ones the
   lower imbalance, then less migration.

Deterministic: Mixed is; the MILP runs single-threaded with a fixed seed, a model size
that follows ``params.time_limit`` only, and stops at a relative gap of :data:`MILP_GAP`.
Only a MILP stopped by the deadline before it reaches that gap (a much slower machine,
or a very short time limit) can differ between runs, and auto then still returns a plan
at least as good as Mixed's; the notes show the solver status.
"""

from __future__ import annotations

import time

import numpy as np

from ..model import Plan, PlanParams, Problem
from .base import Planner, Proposal

#: Mixed within this fraction above the lower bound: no polish (the MILP gains little).
GOOD_ENOUGH = 0.02
#: Above this many keys the MILP's disaggregation and model building alone exceed the
#: one-second planning target of the benchmark; auto returns Mixed's plan.
MILP_MAX_KEYS = 200_000
#: The MILP needs at least this much time left to be worth starting.
MIN_MILP_SECONDS = 0.2
#: Relative MIP gap at which the polish stops (well inside the 10 % target; stopping on
#: the gap rather than the deadline keeps auto deterministic).
MILP_GAP = 0.01
#: Share of the time left after Mixed that the MILP gets (it overruns its limit a little).
MILP_SHARE = 0.75


class AutoPlanner(Planner):
    """Mixed, polished by a warm-started MILP when small enough and worthwhile."""

    name = "auto"
    cover_bound = True

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        from .llfd import MixedPlanner

        t0 = time.perf_counter()
        if problem.n_keys > MILP_MAX_KEYS:
            # No polish possible: skip evaluating Mixed's plan here (the lower bound alone
            # takes ~0.35 s at 10^6 keys); finish_plan evaluates auto's plan once.
            proposal = MixedPlanner().propose(problem, params)
            return Proposal(proposal.assignment, [
                f"kept Mixed's plan: {problem.n_keys} keys exceed the MILP polish limit of "
                f"{MILP_MAX_KEYS}", *_prefixed("mixed", proposal.notes)])
        mixed = MixedPlanner().plan(problem, params)
        notes = [f"mixed: {_summary(mixed)}"]
        skip = self._skip_reason(problem, params, mixed, time.perf_counter() - t0)
        if skip:
            notes.append(f"kept Mixed's plan: {skip}")
            return Proposal(mixed.assignment, notes + _prefixed("mixed", mixed.notes))
        from .milp import MilpPlanner, _max_explicit_keys, _max_returns

        # The MILP overruns its limit a little (model hand-over, disaggregation) and the
        # table fit and evaluation follow: it gets MILP_SHARE of the time left.
        left = MILP_SHARE * (params.time_limit - (time.perf_counter() - t0))
        # Determinism: the model size follows the configured time limit (not the time
        # left, which varies), and HiGHS stops at a relative gap, not at the deadline.
        sized = PlanParams(theta=params.theta, budget_keys=params.budget_keys,
                           time_limit=MILP_SHARE * params.time_limit, extra=params.extra)
        extra = dict(params.extra, warm_start=mixed.assignment,
                     milp_max_keys=params.extra.get("milp_max_keys",
                                                    _max_explicit_keys(problem, sized)),
                     milp_max_returns=params.extra.get("milp_max_returns",
                                                       _max_returns(sized)),
                     highs_options={"mip_rel_gap": MILP_GAP,
                                    **params.extra.get("highs_options", {})})
        milp_params = PlanParams(theta=params.theta, beta=params.beta, max_table=params.max_table,
                                 budget_bytes=params.budget_bytes, budget_keys=params.budget_keys,
                                 time_limit=left, seed=params.seed, extra=extra)
        # auto's own finish_plan computes the integer cover bound for the plan it keeps.
        milp = MilpPlanner().plan(problem, milp_params, cover_bound=False)
        notes.append(f"milp polish ({left:.2f} s, warm start = Mixed): {_summary(milp)}")
        # The MILP models A_max (and fits its own rounding); this is only a fallback.
        over = params.max_table is not None and milp.metrics.table_size > params.max_table
        fitted, moved_back = fit_table(problem, params, milp.assignment) if over else (None, 0)
        if moved_back:
            from .base import finish_plan

            milp = finish_plan("milp", problem, params, Proposal(fitted), milp.plan_seconds)
            notes.append(f"table fit (A_max = {params.max_table}): {moved_back} key(s) sent back "
                         f"to their default instance: {_summary(milp)}")
        best = milp if _better(milp, mixed) else mixed
        notes.append(f"chose {'the MILP polish' if best is milp else 'Mixed'}")
        return Proposal(best.assignment, notes + _prefixed(best.method, best.notes),
                        solver_bound=milp.solver_bound)

    @staticmethod
    def _skip_reason(problem: Problem, params: PlanParams, mixed: Plan, spent: float) -> str | None:
        m = mixed.metrics
        if mixed.feasible and m.migration_bytes <= (1 + GOOD_ENOUGH) * mixed.lower_bound_bytes:
            return (f"it is within {GOOD_ENOUGH:.0%} of the migration lower bound "
                    f"({mixed.lower_bound_fraction:.4%})")
        if problem.n_keys > MILP_MAX_KEYS:
            return f"{problem.n_keys} keys exceed the MILP polish limit of {MILP_MAX_KEYS}"
        if MILP_SHARE * (params.time_limit - spent) < MIN_MILP_SECONDS:
            return f"less than {MIN_MILP_SECONDS} s of the time limit left for a MILP polish"
        if float(problem.load.sum()) <= 0:
            return "no load to balance"
        return None


def _better(a: Plan, b: Plan) -> bool:
    """Is plan ``a`` strictly better than plan ``b`` (ties keep ``b``)?"""
    if a.feasible != b.feasible:
        return a.feasible
    ma, mb = a.metrics, b.metrics
    if a.feasible:
        key_a = (ma.migration_bytes, ma.table_size)
        key_b = (mb.migration_bytes, mb.table_size)
    else:
        key_a = (round(ma.imbalance_after, 9), ma.migration_bytes)
        key_b = (round(mb.imbalance_after, 9), mb.migration_bytes)
    return key_a < key_b


def fit_table(problem: Problem, params: PlanParams,
              assignment: np.ndarray) -> tuple[np.ndarray, int]:
    """Send routing-table keys back to their default instance: for free, then to fit A_max.

    A key goes back only if its default instance is active and stays within
    L_max = (1 + theta) * mean. First, always, every key the plan moves anyway from one
    table instance to another (current and planned instance both off the default): going
    to its default instead costs no migration and shrinks the table. Then, only while
    the table exceeds A_max: keys the plan moved off their default (going back undoes a
    move), then current table keys the plan leaves in place, by increasing state. Ties by
    lower load first (more of them fit), then key index. Returns the new assignment and
    the number of keys sent back.
    """
    a = np.asarray(assignment, dtype=np.int64).copy()
    table = np.flatnonzero(a != problem.default)
    limit = params.max_table
    excess = len(table) - limit if limit is not None else 0
    if len(table) == 0:
        return a, 0
    active = problem.active
    cur, dft = problem.current[table], problem.default[table]
    rank = np.where(cur != dft, np.where(a[table] != cur, 0, 2), 1)
    cost = np.where(rank == 2, problem.state[table], 0.0)
    order = np.lexsort((table, problem.load[table], cost, rank))
    loads = problem.instance_loads(a)
    l_max = problem.max_load(params.theta) * (1 + 1e-12)
    back = 0
    for k, r in zip(table[order], rank[order]):
        if r > 0 and back >= excess:
            break
        d = problem.default[k]
        c = problem.load[k]
        if not active[d] or loads[d] + c > l_max:
            continue
        loads[a[k]] -= c
        loads[d] += c
        a[k] = d
        back += 1
    return a, back


def _summary(plan: Plan) -> str:
    m = plan.metrics
    return (f"feasible={plan.feasible}, imbalance {m.imbalance_after:.4f}, migration "
            f"{m.migration_fraction:.4%} (lower bound {plan.lower_bound_fraction:.4%}), "
            f"table {m.table_size}, {plan.plan_seconds:.3f} s")


def _prefixed(method: str, notes: list[str]) -> list[str]:
    return [f"{method}: {n}" for n in notes]
