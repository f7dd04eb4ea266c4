"""HiGHS through PuLP: the model hand-over in bulk, a MIP start and a wall-clock deadline;
the solve's outcome and the migration lower bound it proves.

Part of :mod:`rebalance.core.planners.milp` (design: ``docs/planning.md``).
"""

from __future__ import annotations

import time

import highspy
import numpy as np
import pulp

from rebalance.core.planners.milp.setting import (
    DISTANCE_WEIGHT,
    FLUID,
    MIN_SOLVE_SECONDS,
    PINNED,
    _Model,
    _Outcome,
    _Setting,
    _Units,
)


class _HighsWithStart(pulp.HiGHS):
    """``pulp.HiGHS`` (highspy API) with a MIP start and a wall-clock deadline.

    The time limit is set when HiGHS starts, so the time PuLP spends passing the
    model to HiGHS counts against the same deadline.
    """

    def __init__(self, start: dict[pulp.LpVariable, float] | None, deadline: float,
                 highs_options: dict | None = None, **options):
        super().__init__(**options)
        self._start = start
        self._deadline = deadline
        self._highs_options = dict(highs_options or {})

    def buildSolverModel(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (PuLP's name)
        """PuLP's model hand-over in bulk: one ``addCols``, one ``changeColsIntegrality``
        and one ``addRows`` call instead of one call per column and row (per-column calls,
        ``changeColIntegrality`` above all, made most of the hand-over time:
        ``docs/planning.md``, "The default planner: auto")."""
        h = lp.solverModel
        inf = highspy.kHighsInf
        variables = lp.variables()
        n = len(variables)
        objective = lp.objective
        sign = -1.0 if lp.sense == pulp.LpMaximize else 1.0
        cost = np.fromiter((sign * objective.get(v, 0.0) for v in variables), np.float64, n)
        lower = np.fromiter((-inf if v.lowBound is None else v.lowBound for v in variables),
                            np.float64, n)
        upper = np.fromiter((inf if v.upBound is None else v.upBound for v in variables),
                            np.float64, n)
        for i, v in enumerate(variables):
            v.index = i
        none_i, none_f = np.zeros(0, dtype=np.int32), np.zeros(0)
        h.addCols(n, cost, lower, upper, 0, none_i, none_i, none_f)
        if self.mip:
            integer = np.fromiter((v.index for v in variables if v.cat == pulp.LpInteger),
                                  np.int32)
            if len(integer):
                h.changeColsIntegrality(len(integer), integer,
                                        np.full(len(integer), highspy.HighsVarType.kInteger))
        constraints = list(lp._constraints.values())
        row_lower = np.empty(len(constraints))
        row_upper = np.empty(len(constraints))
        starts = np.empty(len(constraints), dtype=np.int32)
        index: list[int] = []
        value: list[float] = []
        for i, c in enumerate(constraints):
            c.index = i
            starts[i] = len(index)
            for v, coefficient in c.items():
                if coefficient != 0:
                    index.append(v.index)
                    value.append(coefficient)
            lb, ub = c.getLb(), c.getUb()
            row_lower[i] = -inf if lb is None else lb
            row_upper[i] = inf if ub is None else ub
        if constraints:
            h.addRows(len(constraints), row_lower, row_upper, len(index), starts,
                      np.asarray(index, dtype=np.int32), np.asarray(value, dtype=np.float64))

    def callSolver(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (PuLP's name)
        h = lp.solverModel
        h.setOptionValue("time_limit", max(MIN_SOLVE_SECONDS, self._deadline - time.perf_counter()))
        for name, value in self._highs_options.items():
            h.setOptionValue(name, value)
        if self._start:
            index = np.fromiter((v.index for v in self._start), dtype=np.int32)
            value = np.fromiter(self._start.values(), dtype=np.float64)
            h.setSolution(len(index), index, value)
        h.run()


def _solve(m: _Model, start: dict | None, deadline: float, seed: int,
           highs_options: dict | None = None) -> _Outcome:
    """Run HiGHS single-threaded until ``deadline`` and read back status and bound.

    ``highs_options`` (``params.highs_options``, e.g. ``{"mip_rel_gap": 0.01}``)
    are set on HiGHS as they are; a gap or node limit that stops the search before the
    deadline makes the result independent of the machine's speed."""
    solver = _HighsWithStart(start, deadline, highs_options, msg=False, threads=1,
                             random_seed=int(seed))
    t = time.perf_counter()
    try:
        m.lp.solve(solver)
    except pulp.PulpSolverError as exc:
        nan = float("nan")
        return _Outcome(f"solver error: {exc}", False, False, nan, nan, nan,
                        time.perf_counter() - t)
    h = m.lp.solverModel
    info = h.getInfo()
    status = h.getModelStatus()
    return _Outcome(
        status=h.modelStatusToString(status),
        has_solution=info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible,
        infeasible=status == highspy.HighsModelStatus.kInfeasible,
        objective=float(info.objective_function_value),
        bound=float(info.mip_dual_bound),
        gap=float(info.mip_gap),
        seconds=time.perf_counter() - t,
    )


def _describe_outcome(mode: str, o: _Outcome) -> str:
    return (f"{mode}: HiGHS '{o.status}' in {o.seconds:.2f} s, objective {o.objective:.6g}, "
            f"dual bound {o.bound:.6g}, gap {o.gap:.2%}")


def _solver_bound(m: _Model, outcome: _Outcome, s: _Setting, units: _Units,
                  theta: float) -> tuple[float | None, str]:
    """Migration lower bound (bytes) from the HiGHS dual bound, with what it means.

    Any plan meeting L_max and the budgets has an image in the model whose objective
    exceeds the plan's migrated share by at most the tie-breaker (lambda * max(1, theta))
    plus, per reservoir, the chord error of its bins; so the dual bound minus both is a
    lower bound for the full problem, unless the model restricts it.
    """
    if not m.hard:
        return None, (f"solver_bound: none (soft mode optimises overload first); HiGHS bound "
                      f"{outcome.bound:.6g} on the weighted overload + migrated share")
    if not np.isfinite(outcome.bound):
        return None, "solver_bound: none (HiGHS reported no finite dual bound)"
    if any(r.kind == PINNED for r in units.reservoirs):
        return None, "solver_bound: none (light keys pinned by the key budget)"
    if any(r.kind == FLUID for r in units.reservoirs) and s.budget_cost is not None:
        return None, ("solver_bound: none (a byte budget on the reduced model's cost bins "
                      "does not relax the full problem)")
    if s.max_table is not None and units.reduced:
        return None, ("solver_bound: none (with A_max the reduced model counts light keys' "
                      "table entries conservatively and restricts light table keys to "
                      "staying or going home, so it does not relax the full problem)")
    slack = DISTANCE_WEIGHT * max(1.0, theta) + sum(r.chord_gap for r in units.reservoirs)
    bound = s.state_scale * max(0.0, outcome.bound + m.fixed_cost - slack)
    return bound, (f"solver_bound: {bound:.0f} bytes, least state any plan meeting L_max, "
                   f"{'A_max and ' if s.max_table is not None else ''}"
                   f"the budgets must move (HiGHS dual bound of the "
                   f"{'reduced' if units.reduced else 'exact'} model minus {slack:.3g}, the "
                   "most the tie-breaker and the cost bins can add)")
