"""MILP planner: the mixed-integer program of Madsen et al. (Sec. 3.2), fixed.

Binary ``x[k, i]`` puts key ``k`` on instance ``i``; the objective is lexicographic:
within L_max = (1 + theta) * mean (hard mode) least migrated state, the paper's load
distance as a tie-breaker; when L_max is out of reach (soft mode) least overload
first. Large inputs are reduced (heaviest keys as binaries, light keys as fluid
reservoirs with cost bins) and disaggregated after the solve. The design, with every
fix to the paper's model, is in ``docs/planning.md`` ("The MILP planner:
design"). The parts: :mod:`.setting`, :mod:`.reduce`, :mod:`.build`, :mod:`.starts`,
:mod:`.solve`, :mod:`.repair`.
"""

from __future__ import annotations

import time

import numpy as np

from rebalance.core.model import PlanParams, Problem
from rebalance.core.planners.base import Planner, Proposal
from rebalance.core.planners.milp.build import _build
from rebalance.core.planners.milp.reduce import _describe_units, _reduce
from rebalance.core.planners.milp.repair import (
    _assignment,
    _binding,
    _fit_table,
    _repair_overload,
    _trim_to_budget,
)
from rebalance.core.planners.milp.setting import (
    HARD_SHARE,
    _max_explicit_keys,
    _max_returns,
    _Model,
    _Outcome,
    _Setting,
    _setting,
    _Units,
    _unreachable,
)
from rebalance.core.planners.milp.solve import _describe_outcome, _solve, _solver_bound
from rebalance.core.planners.milp.starts import _mip_starts, _start_assignment, _start_values


class MilpPlanner(Planner):
    """Madsen et al.'s MILP with HiGHS: least migration within the imbalance bound."""

    name = "milp"
    cover_bound = True

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        if problem.scenarios is not None:
            from rebalance.core.planners.milp.robust import robust_milp

            assignment, notes = robust_milp(problem, params)
            return Proposal(assignment, notes)
        deadline = time.perf_counter() + params.time_limit
        start, start_note = _start_assignment(problem, params)
        if problem.n_keys == 0 or float(problem.load.sum()) <= 0:
            return Proposal(start, [start_note, "no load to balance: kept the start assignment"])
        setting, budget_notes = _setting(problem, params)
        units = _reduce(problem, setting, _max_explicit_keys(problem, params), params.theta,
                        _max_returns(params), start)
        notes = [start_note, *budget_notes, _describe_units(problem, units, setting, params.theta)]
        # Time kept back for disaggregation and the caller's evaluation.
        solve_end = deadline - (0.05 + 2e-6 * problem.n_keys + 0.02 * params.time_limit)
        model, outcome = _solve_modes(problem, params, setting, units,
                                      _mip_starts(problem, setting, units, start), solve_end, notes)
        if not outcome.has_solution:
            notes.append("fallback: the solver returned no plan; proposing the start assignment")
            return Proposal(start, notes)
        assignment, planned = _assignment(problem, units, setting, model)
        notes += _repair_overload(problem, units, setting, assignment, planned)
        notes += _trim_to_budget(problem, units, setting, assignment)
        notes += _fit_table(problem, params, assignment)
        bound, bound_note = _solver_bound(model, outcome, setting, units, params.theta)
        notes.append(bound_note)
        notes += _binding(problem, setting, assignment)
        return Proposal(assignment, notes, bound)


def _solve_modes(problem: Problem, params: PlanParams, s: _Setting, units: _Units,
                 starts: dict[str, np.ndarray], solve_end: float,
                 notes: list[str]) -> tuple[_Model, _Outcome]:
    """The hard mode if the bound looks reachable; the soft mode if not or if it fails."""
    unreachable = _unreachable(problem, params, s)
    if unreachable is None:
        model = _build(problem, units, s, params.theta, hard=True)
        values, start_note = _start_values(problem, units, s, model, starts)
        now = time.perf_counter()
        share = 1.0 if values is not None else HARD_SHARE
        outcome = _solve(model, values, now + (solve_end - now) * share, params.seed,
                         params.highs_options)
        notes += [start_note, _describe_outcome("hard bound", outcome)]
        if outcome.has_solution:
            return model, outcome
        unreachable = ("the hard model is infeasible" if outcome.infeasible
                       else "no plan within the bound found in time")
    notes.append(f"theta unreachable ({unreachable}): minimising the load above "
                 f"L_max = {s.l_max * s.mean:.6g} first, then migration")
    model = _build(problem, units, s, params.theta, hard=False)
    values, start_note = _start_values(problem, units, s, model, starts)
    outcome = _solve(model, values, solve_end, params.seed, params.highs_options)
    notes += [start_note, _describe_outcome("soft bound", outcome)]
    return model, outcome
