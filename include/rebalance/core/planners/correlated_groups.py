"""CLB planner: the ELB/CLB paper's correlation-based load balancing (Sec. 4, Algorithm 2), fixed.

CLB plans for the next m windows at once from the per-window load series of each key group
(``problem.load_series``, W x K, summed per group; key groups as in
:mod:`rebalance.core.planners.eager_groups`). Keys of one group always move together. The
groups are split into one set per active instance by the Pearson correlation of their load
series (threshold ``params.clb_threshold``, not ``theta``), an ELB pass balances the sets'
loads, and each set goes to the instance that already holds most of its state. With fewer
than two windows the planner falls back to ELB. The steps, with their fixes to the paper:
``docs/planning.md``, "ELB and CLB: design".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rebalance.core.model import PlanParams, Problem
from rebalance.core.planners.base import Planner, Proposal
from rebalance.core.planners.eager_groups import KeyGroups, balance, describe_balance, describe_groups


class ClbPlanner(Planner):
    """The ELB/CLB paper's correlation-based balancing over key groups."""

    name = "clb"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        threshold = _threshold(params)
        groups = KeyGroups.of(problem)
        active = np.flatnonzero(problem.active)
        windows = 0 if problem.load_series is None else problem.load_series.shape[0]
        loaded = np.flatnonzero(groups.load > 0)
        if windows < 2:
            return _elb_fallback(groups, active, params,
                                 f"a load series of at least 2 windows, got {windows}")
        if len(loaded) == 0:
            return _elb_fallback(groups, active, params, "groups with load")
        corr = correlation(group_series(problem, groups)[:, loaded])
        labels, split = correlation_split(corr, groups.load[loaded], len(active), threshold)
        sets = balance(groups.load[loaded], labels, np.arange(len(active)), params.theta,
                       capped=False)
        instance_of_set, kept = map_sets_to_instances(problem, groups, loaded, sets.owner,
                                                      active)
        owner = groups.home.copy()
        owner[loaded] = instance_of_set[sets.owner]
        idle = _place_idle(problem, groups, owner, active)
        notes = [
            describe_groups(groups),
            f"CLB: {len(loaded)} loaded groups over {windows} windows split into "
            f"{int(labels.max()) + 1} sets ({split.by_correlation} splits by Pearson "
            f"correlation >= {threshold:g}, {split.by_load} by load where no pair passed it)",
            describe_balance(sets, params.theta) + " (between sets)",
            f"sets mapped to instances by largest state overlap (Hungarian): "
            f"{kept:.2%} of the loaded groups' state stays in place",
        ]
        if idle:
            notes.append(f"{idle} group(s) without load left drained/removed instances for the "
                         "least-loaded instance")
        return Proposal(groups.assignment(owner), notes)


def _elb_fallback(groups: KeyGroups, active: np.ndarray, params: PlanParams,
                  needs: str) -> Proposal:
    """ELB over the groups, when CLB lacks what it ``needs``."""
    result = balance(groups.load, groups.home, active, params.theta)
    return Proposal(groups.assignment(result.owner), [
        f"fallback to ELB: CLB needs {needs}", describe_groups(groups),
        describe_balance(result, params.theta)])


def _place_idle(problem: Problem, groups: KeyGroups, owner: np.ndarray,
                active: np.ndarray) -> int:
    """Put groups without load and without an instance on the least-loaded instance."""
    idle = np.flatnonzero(owner < 0)
    if len(idle):
        loads = np.bincount(owner[owner >= 0], weights=groups.load[owner >= 0],
                            minlength=problem.n_instances)
        owner[idle] = active[np.argmin(loads[active])]
    return len(idle)


def _threshold(params: PlanParams) -> float:
    return float(params.clb_threshold)  # checked in [0, 1) by PlanParams


def group_series(problem: Problem, groups: KeyGroups) -> np.ndarray:
    """Per-window load of every key group: W x (number of groups)."""
    return np.stack([np.bincount(groups.of_key, weights=row, minlength=len(groups.ids))
                     for row in problem.load_series])


def correlation(series: np.ndarray) -> np.ndarray:
    """Pearson correlation of the columns of ``series``; 0 for a constant column.

    float32: with 4096 key groups the matrix takes 64 MB.
    """
    centred = series - series.mean(axis=0)
    scale = np.sqrt((centred ** 2).mean(axis=0))
    z = np.divide(centred, scale, out=np.zeros_like(centred), where=scale > 0)
    z = z.astype(np.float32)
    return (z.T @ z) / np.float32(len(series))


@dataclass(frozen=True)
class Splits:
    by_correlation: int
    by_load: int


def correlation_split(corr: np.ndarray, load: np.ndarray, n_sets: int,
                      threshold: float) -> tuple[np.ndarray, Splits]:
    """The ELB/CLB paper's Algorithm 2 with the empty-set fix: the set (0..n_sets-1) of each unit.

    Stops early, with fewer sets, only when every set holds a single unit.
    """
    labels = np.zeros(len(load), dtype=np.int64)
    weight = np.where(corr >= threshold, corr, 0.0)
    np.fill_diagonal(weight, 0.0)
    omega = weight.sum(axis=1)
    by_load = by_correlation = 0
    for new in range(1, n_sets):
        pivot = int(np.argmax(omega)) if omega.max(initial=0.0) > 0 else -1
        if pivot >= 0:
            same = np.flatnonzero(labels == labels[pivot])
            moved = same[(corr[pivot, same] >= threshold) & (same != pivot)]
            by_correlation += 1
        else:
            moved = _split_heaviest(labels, load)
            by_load += 1
            if len(moved) == 0:
                break
        old = labels[moved[0]] if pivot < 0 else labels[pivot]
        labels[moved] = new
        for s in (old, new):
            members = np.flatnonzero(labels == s)
            omega[members] = weight[np.ix_(members, members)].sum(axis=1)
    return labels, Splits(by_correlation, by_load)


def _split_heaviest(labels: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Units to move out of the heaviest splittable set: largest first into the lighter half."""
    sizes = np.bincount(labels)
    totals = np.bincount(labels, weights=load)
    totals[sizes < 2] = -np.inf
    if not np.isfinite(totals.max()):
        return np.empty(0, dtype=np.int64)
    members = np.flatnonzero(labels == int(np.argmax(totals)))
    halves, moved = [0.0, 0.0], []
    for u in members[np.lexsort((members, -load[members]))]:
        side = int(halves[1] < halves[0])
        halves[side] += load[u]
        if side:
            moved.append(int(u))
    return np.array(moved, dtype=np.int64)


def map_sets_to_instances(problem: Problem, groups: KeyGroups, units: np.ndarray,
                          set_of_unit: np.ndarray,
                          active: np.ndarray) -> tuple[np.ndarray, float]:
    """Instance of each set maximising the state that stays in place; and that share.

    ``units`` are group positions, ``set_of_unit`` their set (0..len(active)-1). The
    overlap of set s and instance i is the state of keys of s's groups now on i.
    """
    n = len(active)
    weight = problem.state if problem.state.sum() > 0 else np.ones(problem.n_keys)
    set_of_group = np.full(len(groups.ids), -1)
    set_of_group[units] = set_of_unit
    key_set = set_of_group[groups.of_key]
    slot = np.full(max(problem.n_instances, int(problem.current.max()) + 1), -1)
    slot[active] = np.arange(n)
    key_slot = slot[problem.current]
    inside = (key_set >= 0) & (key_slot >= 0)
    overlap = np.bincount(key_set[inside] * n + key_slot[inside], weights=weight[inside],
                          minlength=n * n).reshape(n, n)
    column = min_cost_assignment(-overlap)
    total = float(weight[key_set >= 0].sum())
    kept = float(overlap[np.arange(n), column].sum()) / total if total > 0 else 1.0
    return active[column], kept


def min_cost_assignment(cost: np.ndarray) -> np.ndarray:
    """Column of each row of a square matrix minimising the total cost.

    The Hungarian method with potentials (Kuhn-Munkres, O(n^3)); each augmentation is
    a vectorised Dijkstra-like scan. Ties resolve to the lowest column index.
    """
    cost = np.asarray(cost, dtype=np.float64)
    n = cost.shape[0]
    u = np.zeros(n + 1)
    v = np.zeros(n + 1)
    row_of = np.zeros(n + 1, dtype=np.int64)    # row_of[j]: row (1-based) on column j, 0 none
    way = np.zeros(n + 1, dtype=np.int64)
    for i in range(1, n + 1):
        row_of[0] = i
        j0 = 0
        best = np.full(n + 1, np.inf)
        used = np.zeros(n + 1, dtype=bool)
        while row_of[j0] != 0:
            used[j0] = True
            i0 = row_of[j0]
            reduced = cost[i0 - 1] - u[i0] - v[1:]
            better = ~used[1:] & (reduced < best[1:])
            best[1:][better] = reduced[better]
            way[1:][better] = j0
            j1 = int(np.argmin(np.where(used[1:], np.inf, best[1:]))) + 1
            delta = best[j1]
            u[row_of[used]] += delta
            v[used] -= delta
            best[~used] -= delta
            j0 = j1
        while j0:
            j1 = way[j0]
            row_of[j0] = row_of[j1]
            j0 = j1
    column = np.empty(n, dtype=np.int64)
    column[row_of[1:] - 1] = np.arange(n)
    return column
