"""Madsen et al.'s model, fixed, over the units (constraints (1)-(5), L_max, the elastic
routing-table bound, the soft mode's overload and giant-key cuts).

Part of :mod:`rebalance.core.planners.milp` (design: ``docs/planning.md``).
"""

from __future__ import annotations

import numpy as np
import pulp

from rebalance.core.model import Problem
from rebalance.core.planners.milp.setting import (
    DISTANCE_WEIGHT,
    FLUID,
    FORCED,
    OVERLOAD_WEIGHT,
    PINNED,
    TABLE_WEIGHT,
    W1,
    W2,
    _Model,
    _Setting,
    _Units,
)


def _build(problem: Problem, units: _Units, s: _Setting, theta: float, hard: bool) -> _Model:
    """Madsen et al.'s model, fixed, over ``units`` (design: ``docs/planning.md``)."""
    m = _Model(pulp.LpProblem("rebalance_milp", pulp.LpMinimize), hard)
    load_terms: dict[int, list] = {int(i): [] for i in s.active}
    load_const = dict.fromkeys(load_terms, 0.0)
    moved_cost: list = []
    moved_count: list = []
    for p, k in enumerate(units.explicit):
        row = []
        for i in load_terms:
            v = m.x[p, i] = m.lp.add_variable(f"x_{p}_{i}", cat=pulp.LpBinary)
            row.append((v, 1.0))
            load_terms[i].append((v, float(s.load[k])))
            if i != problem.current[k]:
                moved_cost.append((v, float(s.cost[k])))
                moved_count.append((v, 1.0))
        m.lp += pulp.LpAffineExpression(row) == 1, f"one_instance_{p}"
    fixed_count = 0
    for r, res in enumerate(units.reservoirs):
        if res.kind == PINNED:
            load_const[res.source] += res.load
            continue
        flows = []
        for i in load_terms:
            if i != res.source:
                v = m.z[r, i] = m.lp.add_variable(f"z_{r}_{i}", lowBound=0)
                flows.append((v, 1.0))
                load_terms[i].append((v, 1.0))
        if res.kind == FORCED:
            m.lp += pulp.LpAffineExpression(flows) == res.load, f"empty_{r}"
            m.fixed_cost += float(s.cost[res.keys].sum())
            fixed_count += len(res.keys)
            continue
        fills = []
        for b, (bin_load, bin_cost) in enumerate(zip(res.bin_load, res.bin_cost, strict=True)):
            v = m.fill[r, b] = m.lp.add_variable(f"a_{r}_{b}", 0, float(bin_load))
            fills.append((v, -1.0))
            moved_cost.append((v, float(bin_cost / bin_load)))
        m.lp += pulp.LpAffineExpression(flows + fills) == 0, f"shed_{r}"
        load_const[res.source] += res.load
        load_terms[res.source] += [(v, -1.0) for v, _ in flows]
    for q, k in enumerate(units.returns):
        j, h = int(problem.current[k]), int(problem.default[k])
        v = m.y[q] = m.lp.add_variable(f"y_{q}", cat=pulp.LpBinary)
        load_const[j] += float(s.load[k])
        load_terms[j].append((v, -float(s.load[k])))
        load_terms[h].append((v, float(s.load[k])))
        moved_cost.append((v, float(s.cost[k])))
        moved_count.append((v, 1.0))
    table_objective = _table_constraint(m, problem, units, s)
    if s.budget_cost is not None:
        m.lp += (pulp.LpAffineExpression(moved_cost) <= s.budget_cost - m.fixed_cost,
                 "budget_bytes")
    if s.budget_keys is not None:
        m.lp += pulp.LpAffineExpression(moved_count) <= s.budget_keys - fixed_count, "budget_keys"
    objective = _load_constraints(m, load_terms, load_const, s, theta)
    if not hard:
        _giant_key_cuts(m, units, s)
    m.lp += pulp.LpAffineExpression(moved_cost + objective + table_objective)
    return m


def _table_constraint(m: _Model, problem: Problem, units: _Units, s: _Setting) -> list:
    """Routing-table size <= A_max, elastic: ``table - excess <= A_max``, excess penalised.

    Table size = keys whose planned instance differs from their default:

    * explicit key: ``1 - x[k, h(k)]`` (1 when h(k) is drained);
    * return unit: ``1 - y[k]`` (it is off its default unless it goes back);
    * light keys the model cannot route home count what they count now: keys that stay
      keep their membership; a fluid key already in the table stays in it wherever it
      goes (or leaves it, so 1 is an upper bound); keys of drained or removed instances
      count 1 (upper bound);
    * light keys at home that a fluid reservoir sheds: +1 each, modelled per cost bin as
      ``fill * (keys at home in the bin) / (load of the bin)``. Disaggregation takes a
      prefix of the bins, which can overshoot this count by a few keys per reservoir;
      the planner then sends keys home (:func:`fit_table`) to fit A_max.

    The penalty (:data:`TABLE_WEIGHT` per entry, above the total state) makes the
    elastic model choose the same plans as the strict one whenever the strict one is
    feasible, and keeps every warm start admissible.
    """
    if s.max_table is None:
        return []
    must = problem.must_move()
    other = np.ones(problem.n_keys, dtype=bool)
    other[units.explicit] = False
    other[units.returns] = False
    off = (problem.current != problem.default) | must
    const = float(off[other].sum())
    terms = []
    active = set(int(i) for i in s.active)
    for p, k in enumerate(units.explicit):
        const += 1.0
        h = int(problem.default[k])
        if h in active:
            terms.append((m.x[p, h], -1.0))
    for q, _k in enumerate(units.returns):
        const += 1.0
        terms.append((m.y[q], -1.0))
    for r, res in enumerate(units.reservoirs):
        if res.kind != FLUID:
            continue
        for b, (bin_load, home) in enumerate(zip(res.bin_load, res.bin_home, strict=True)):
            if home > 0:
                terms.append((m.fill[r, b], float(home / bin_load)))
    m.table_terms, m.table_const = terms, const
    m.table_excess = m.lp.add_variable("table_excess", lowBound=0)
    m.lp += (pulp.LpAffineExpression([*terms, (m.table_excess, -1.0)], const)
             <= float(s.max_table), "max_table")
    return [(m.table_excess, TABLE_WEIGHT)]


def _load_constraints(m: _Model, load_terms: dict[int, list], load_const: dict[int, float],
                      s: _Setting, theta: float) -> list:
    """Constraints (3), (4), (5) and the L_max bound; returns their objective terms."""
    d = m.lp.add_variable("d", lowBound=0, upBound=max(1.0, theta) if m.hard else None)
    d_u = m.lp.add_variable("d_u", lowBound=0)
    d_l = m.lp.add_variable("d_l", lowBound=0)
    m.dist = (d, d_u, d_l)
    objective = [(d, DISTANCE_WEIGHT), (d_u, -DISTANCE_WEIGHT * W2 / W1),
                 (d_l, -DISTANCE_WEIGHT * W2 / W1)]
    if not m.hard:
        # Some instance holds the heaviest key: its excess over L_max bounds e_max below.
        unavoidable = max(0.0, float(s.load.max()) - s.l_max)
        m.worst = m.lp.add_variable("e_max", lowBound=unavoidable)
        objective.append((m.worst, OVERLOAD_WEIGHT))
    for i, terms in load_terms.items():
        const = load_const[i]
        m.lp += pulp.LpAffineExpression([*terms, (d, -1.0), (d_u, 1.0)], const) <= 1.0, f"up_{i}"
        m.lp += pulp.LpAffineExpression([*terms, (d, 1.0), (d_l, -1.0)], const) >= 1.0, f"low_{i}"
        if m.hard:
            m.lp += pulp.LpAffineExpression(terms, const) <= s.l_max, f"lmax_{i}"
        else:
            e = m.overload[i] = m.lp.add_variable(f"e_{i}", lowBound=0)
            m.lp += pulp.LpAffineExpression([*terms, (e, -1.0)], const) <= s.l_max, f"lmax_{i}"
            m.lp += pulp.LpAffineExpression([(m.worst, 1.0), (e, -1.0)]) >= 0, f"worst_{i}"
            objective.append((e, OVERLOAD_WEIGHT / (2 * len(load_terms))))
    return objective


def _giant_key_cuts(m: _Model, units: _Units, s: _Setting) -> None:
    """``e_i >= (c_k - L_max) * x[k, i]`` for every key heavier than L_max.

    Valid (such a key overloads its instance by at least that much) and it stops the
    LP relaxation from spreading a giant key over several instances, which would
    leave the soft mode's bound near zero.
    """
    for p, k in enumerate(units.explicit):
        excess = float(s.load[k]) - s.l_max
        if excess > 0:
            for i, e in m.overload.items():
                m.lp += (pulp.LpAffineExpression([(e, 1.0), (m.x[p, i], -excess)]) >= 0,
                         f"giant_{p}_{i}")
