"""Disaggregation and repair: the key assignment of a solution (light keys taken
cheapest first and placed heaviest first), re-routing off overloaded instances,
trimming to the byte budget, fitting the routing table, and what binds.

Part of :mod:`rebalance.core.planners.milp` (design: ``docs/planning.md``).
"""

from __future__ import annotations

import numpy as np

from rebalance.core.float_tolerances import LOAD_TOL
from rebalance.core.model import PlanParams, Problem
from rebalance.core.planners.milp.setting import FORCED, PINNED, TOL, _Model, _Reservoir, _Setting, _Units
from rebalance.core.planners.packing import heaviest_first
from rebalance.core.planners.table_fit import fit_table


def _assignment(problem: Problem, units: _Units, s: _Setting,
                m: _Model) -> tuple[np.ndarray, np.ndarray]:
    """Key assignment of the solution and the instance loads the model planned (raw)."""
    a = problem.current.copy()
    active = [int(i) for i in s.active]
    for p, k in enumerate(units.explicit):
        a[k] = max(active, key=lambda i: m.x[p, i].varValue or 0.0)
    for q, k in enumerate(units.returns):
        if (m.y[q].varValue or 0.0) > 0.5:
            a[k] = problem.default[k]
    modelled = np.concatenate([units.explicit, units.returns]).astype(np.int64)
    planned = np.bincount(a[modelled], weights=problem.load[modelled],
                          minlength=problem.n_instances)
    picked = []
    for r, res in enumerate(units.reservoirs):
        if res.kind == PINNED:
            planned[res.source] += res.load * s.mean
            continue
        flows = {i: max(0.0, m.z[r, i].varValue or 0.0) for i in active if i != res.source}
        for i, flow in flows.items():
            planned[i] += flow * s.mean
        if res.kind == FORCED:
            picked.append(res.keys)
            continue
        shed = sum(flows.values())
        planned[res.source] += (res.load - shed) * s.mean
        picked.append(_cheapest(res, s, shed))
    if picked:
        _place_worst_fit(problem, a, np.concatenate(picked), planned, s.active)
    return a, planned


def _cheapest(res: _Reservoir, s: _Setting, shed: float) -> np.ndarray:
    """Prefix of the reservoir (cheapest state per load first) carrying ``shed`` load."""
    if shed <= TOL:
        return res.keys[:0]
    cum = np.cumsum(s.load[res.keys])
    n = int(np.searchsorted(cum, shed * (1 - TOL), side="left")) + 1
    return res.keys[:min(n, len(res.keys))]


def _place_worst_fit(problem: Problem, a: np.ndarray, picked: np.ndarray, planned: np.ndarray,
                     active: np.ndarray) -> None:
    """Place ``picked`` keys, heaviest first, on the instance with most room left by the plan."""
    a[picked] = -1
    loads = problem.instance_loads(a)
    order, targets, _ = heaviest_first(problem.load, picked, active, loads - planned)
    a[order] = targets


def _repair_overload(problem: Problem, units: _Units, s: _Setting, a: np.ndarray,
                     planned: np.ndarray) -> list[str]:
    """Re-route light keys off instances the disaggregation left above their limit.

    The limit is L_max, or the planned load where the (soft) plan itself exceeds it.
    Light keys that already move are re-routed first (it costs nothing), then, unless
    a key budget pins them, the cheapest per unit of load; each goes to the active
    instance with the most room.
    """
    if not units.reduced:
        return []
    limit = np.full(problem.n_instances, -np.inf)
    limit[s.active] = np.maximum(s.l_max * s.mean, planned[s.active]) * (1 + LOAD_TOL)
    loads = problem.instance_loads(a)
    movable = np.zeros(problem.n_keys, dtype=bool)
    movable[units.light] = True
    if s.budget_keys is not None:
        movable &= a != problem.current
    over = s.active[loads[s.active] > limit[s.active]]
    rerouted = sum(_shed(problem, s, a, loads, limit, int(i), movable) for i in over)
    notes = [f"disaggregation: re-routed {rerouted} light key(s) to keep instances under "
             "their limit"] if rerouted else []
    excess = (loads - limit)[s.active]
    if (excess > 0).any():
        notes.append(f"disaggregation: {int((excess > 0).sum())} instance(s) stay above their "
                     f"limit by up to {excess.max() / s.mean:.3%} of the mean load "
                     "(light keys too coarse)")
    return notes


def _shed(problem: Problem, s: _Setting, a: np.ndarray, loads: np.ndarray, limit: np.ndarray,
          i: int, movable: np.ndarray) -> int:
    """Move keys off instance ``i`` until it is under its limit; returns the count."""
    keys = np.flatnonzero(movable & (a == i) & (problem.load > 0))
    moving = problem.current[keys] != i
    keys = keys[np.lexsort((s.cost[keys] / s.load[keys], ~moving))]
    moves = 0
    for k in keys:
        if loads[i] <= limit[i]:
            break
        room = limit - loads
        room[i] = -np.inf
        j = int(np.argmax(room))
        if problem.load[k] <= room[j]:
            a[k] = j
            loads[i] -= problem.load[k]
            loads[j] += problem.load[k]
            moves += 1
    return moves


def _trim_to_budget(problem: Problem, units: _Units, s: _Setting, a: np.ndarray) -> list[str]:
    """Send moved light keys home, most expensive first, while the byte budget is exceeded.

    Only the disaggregation's overshoot (at most about one light key per reservoir) can
    break the budget the model respected.
    """
    if s.budget_cost is None or not units.reduced:
        return []
    moved = a != problem.current
    excess = float(s.cost[moved].sum()) - s.budget_cost * (1 + TOL)
    if excess <= 0:
        return []
    light = units.light
    back = light[moved[light] & ~problem.must_move()[light]]
    back = back[np.argsort(-s.cost[back], kind="stable")]
    n = int(np.searchsorted(np.cumsum(s.cost[back]), excess, side="left")) + 1
    a[back[:n]] = problem.current[back[:n]]
    return [f"disaggregation: sent {min(n, len(back))} light key(s) back to stay within the "
            "byte budget"]


def _fit_table(problem: Problem, params: PlanParams, a: np.ndarray) -> list[str]:
    """With A_max: send keys that move anyway to their default (free), then, only if the
    disaggregation's rounding left the table above A_max, send keys home to fit it
    (:func:`rebalance.core.planners.auto.fit_table`)."""
    if params.max_table is None:
        return []
    before = int((a != problem.default).sum())
    fitted, back = fit_table(problem, params, a)
    a[:] = fitted
    after = int((a != problem.default).sum())
    if not back:
        return []
    return [f"table fit: {back} key(s) sent to their default instance, table {before} -> "
            f"{after} (A_max {params.max_table})"]


def _binding(problem: Problem, s: _Setting, a: np.ndarray) -> list[str]:
    """Which limits the plan presses against."""
    loads = problem.instance_loads(a) / s.mean
    moved = a != problem.current
    unit = "state" if s.state_scale > 0 else "keys"
    notes = [f"plan: max load {loads.max():.4f} x mean (limit {s.l_max:.4f}), "
             f"{int(moved.sum())} key(s) moved, {s.cost[moved].sum():.4%} of the {unit}"]
    if s.budget_cost is not None and s.cost[moved].sum() >= 0.999 * s.budget_cost:
        notes.append("binding: the byte budget is used up")
    if s.budget_keys is not None and int(moved.sum()) >= s.budget_keys:
        notes.append("binding: the key budget is used up")
    return notes
