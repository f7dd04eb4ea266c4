"""Flux-style moves: the baseline Madsen et al. compare their MILP against (Sec. 2, 5.1).

Flux (Shah et al.) sorts nodes by load and moves "the biggest suitable" partition from
the most loaded node to the least loaded one, so that the load variance drops. Here:
repeat, while the most loaded active instance s is above L_max = (1 + theta) * mean and
the migration budget (``params.budget_keys`` / ``params.budget_bytes``) allows: take the
least loaded active instance t and move the heaviest key of s lighter than
``L_s - L_t`` (so the larger of the two loads drops); stop when s has no such key.
Keys of drained or removed instances go first to the least-loaded instance (they must
move whatever the budget). This is a baseline of the evaluation harness only; it is not
in the planner registry.
"""

from __future__ import annotations

import numpy as np

from rebalance.core.float_tolerances import CHECK_TOL, LOAD_TOL
from rebalance.core.model import PlanParams, Problem
from rebalance.core.planners.base import Planner, Proposal
from rebalance.core.planners.packing import place_forced


class FluxPlanner(Planner):
    """Heaviest suitable key from the most to the least loaded instance, within the budget."""

    name = "flux"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        a = problem.current.copy()
        load, state = problem.load, problem.state
        active = problem.active
        _, _, loads = place_forced(problem, a)   # keys of drained instances: least-loaded
        loads[~active] = -np.inf
        low = loads.copy()
        low[~active] = np.inf
        max_load = problem.max_load(params.theta)
        moved = a != problem.current
        n_moved, bytes_moved = int(moved.sum()), float(state[moved].sum())
        key_budget = params.budget_keys
        byte_budget = np.inf if params.budget_bytes is None else params.budget_bytes * (1 + CHECK_TOL)
        moves = 0
        reason = "every instance is within L_max"
        for _ in range(problem.n_keys + 1):
            s = int(np.argmax(loads))
            if loads[s] <= max_load * (1 + LOAD_TOL):
                break
            t = int(np.argmin(low))
            gap = loads[s] - low[t]
            first_move = a == problem.current   # moving these costs budget
            ok = (a == s) & (load > 0) & (load < gap)
            if key_budget is not None and n_moved >= key_budget:
                ok &= ~first_move | (problem.current == t)
            ok &= np.where(first_move & (problem.current != t), state, 0.0) <= byte_budget - bytes_moved
            cand = np.flatnonzero(ok)
            if len(cand) == 0:
                reason = ("the migration budget is spent" if key_budget is not None
                          and n_moved >= key_budget else
                          "no key of the most loaded instance lowers it without raising the "
                          "least loaded one as high")
                break
            k = int(cand[np.argmax(load[cand])])
            if a[k] == problem.current[k]:
                n_moved += 1
                bytes_moved += float(state[k])
            elif t == problem.current[k]:
                n_moved -= 1
                bytes_moved -= float(state[k])
            a[k] = t
            loads[s] -= load[k]
            low[s] -= load[k]
            loads[t] += load[k]
            low[t] += load[k]
            moves += 1
        else:
            reason = f"the cap of {problem.n_keys + 1} moves"
        return Proposal(a, [f"flux: {moves} move(s) of the heaviest suitable key from the most "
                            f"to the least loaded instance; stopped: {reason}"])
