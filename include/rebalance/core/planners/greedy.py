"""Greedy redistribution of Maric et al. (the MLDC paper, Sec. 3.3).

When its trigger fires (:mod:`rebalance.core.trigger`) the paper moves a few whole
partitions (here: keys) off the most loaded worker instead of re-partitioning (a fresh
LPT, :class:`rebalance.core.planners.baselines.LptPlanner`, would move almost every key).
Keys that must move are placed first; then, while an instance is above L_max, one key
moves from the most loaded instance that has an improving move to the least-loaded one
(the key closest to half their load difference), within the table and migration limits.
The algorithm, why it ends and how the key is found quickly: ``docs/planning.md``,
"The greedy planner: design".
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import numpy as np

from rebalance.core.float_tolerances import CHECK_TOL, LOAD_TOL
from rebalance.core.model import PlanParams, Problem
from rebalance.core.planners.base import Planner, Proposal
from rebalance.core.planners.packing import place_forced


@dataclass
class _Usage:
    """Table size and migration so far, against the limits of PlanParams."""

    table: int
    moved: int
    bytes: float
    params: PlanParams

    def table_full(self) -> bool:
        return self.params.max_table is not None and self.table >= self.params.max_table

    def keys_spent(self) -> bool:
        return self.params.budget_keys is not None and self.moved >= self.params.budget_keys

    def bytes_left(self) -> float:
        budget = self.params.budget_bytes
        return np.inf if budget is None else budget * (1 + CHECK_TOL) - self.bytes


class _Groups:
    """Keys of every instance in four groups sorted by load: (off default, moved).

    Plain lists with bisection: a move or a search touches a few entries, which Python
    lists do faster than numpy calls.
    """

    def __init__(self, problem: Problem, a: np.ndarray) -> None:
        self.problem, self.a = problem, a
        self.load = problem.load.tolist()
        self.state = problem.state.tolist()
        n_groups = 4 * problem.n_instances
        group = ((a * 2 + (a != problem.default)) * 2 + (a != problem.current)).astype(
            np.uint16 if n_groups <= 1 << 16 else np.int64)  # uint16 sorts by radix
        by_load = np.argsort(problem.load)  # order among equal loads is irrelevant
        order = by_load[np.argsort(group[by_load], kind="stable")]
        bounds = np.searchsorted(group[order], np.arange(n_groups + 1)).tolist()
        self.keys = [order[lo:hi].tolist() for lo, hi in zip(bounds[:-1], bounds[1:])]
        sorted_load = problem.load[order]
        self.loads = [sorted_load[lo:hi].tolist() for lo, hi in zip(bounds[:-1], bounds[1:])]

    def _group(self, k: int, d: int) -> int:
        p = self.problem
        return (d * 2 + int(p.default[k] != d)) * 2 + int(p.current[k] != d)

    def move(self, k: int, t: int) -> None:
        """Move key k from its instance to t."""
        c = self.load[k]
        g = self._group(k, int(self.a[k]))
        loads, keys = self.loads[g], self.keys[g]
        i = bisect_left(loads, c)
        while keys[i] != k:
            i += 1
        del loads[i], keys[i]
        self.a[k] = t
        g = self._group(k, t)
        j = bisect_left(self.loads[g], c)
        self.loads[g].insert(j, c)
        self.keys[g].insert(j, k)

    def best(self, s: int, gap: float, usage: _Usage) -> tuple[int | None, set[str]]:
        """Admissible key of s with 0 < c < gap closest to gap / 2 (ties: less state, lower
        index), and the limits that ruled out an improving key."""
        blocked: set[str] = set()
        found: tuple[float, float, int] | None = None
        for off_default in (False, True):
            for moved in (False, True):
                g = (s * 2 + off_default) * 2 + moved
                lo = bisect_right(self.loads[g], 0.0)
                hi = bisect_left(self.loads[g], gap)
                if lo >= hi:
                    continue
                if not off_default and usage.table_full():
                    blocked.add("max table")
                    continue
                if not moved and usage.keys_spent():
                    blocked.add("key budget")
                    continue
                hit = self._closest(g, lo, hi, gap / 2, np.inf if moved else usage.bytes_left())
                if hit is None:
                    blocked.add("byte budget")
                elif found is None or hit < found:
                    found = hit
        return (None, blocked) if found is None else (found[2], set())

    def _closest(self, g: int, lo: int, hi: int, half: float,
                 room: float) -> tuple[float, float, int] | None:
        """(distance, state, key) of the key of group g in [lo, hi) closest to ``half``
        with state <= room: walk outwards from ``half`` in increasing distance."""
        loads, keys, state = self.loads[g], self.keys[g], self.state
        right = min(max(bisect_left(loads, half, lo, hi), lo), hi)
        left = right - 1
        found: tuple[float, float, int] | None = None
        while left >= lo or right < hi:
            if right < hi and (left < lo or loads[right] - half <= half - loads[left]):
                i, right = right, right + 1
            else:
                i, left = left, left - 1
            distance = abs(loads[i] - half)
            if found is not None and distance > found[0]:
                break
            k = keys[i]
            if state[k] <= room and (found is None or (distance, state[k], k) < found):
                found = (distance, state[k], k)
        return found


class GreedyPlanner(Planner):
    """Maric et al.'s greedy redistribution: few single-key moves off the most loaded instances."""

    name = "greedy"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        if problem.scenarios is not None:
            from rebalance.core.planners.robust import robust_proposal

            return robust_proposal(problem, params, "greedy")
        a = problem.current.copy()
        max_load = problem.max_load(params.theta)
        to_default, to_least, _ = place_forced(problem, a, max_load)
        notes = ["greedy (Maric et al., Sec. 3.3): single keys move from the most loaded instance "
                 "above L_max to the least-loaded one while that lowers the larger of the two "
                 "loads; the key moved is the one closest to half their difference"]
        if to_default or to_least:
            notes.append(f"{to_default + to_least} key(s) of drained/removed instances placed "
                         f"first: {to_default} on their default instance, {to_least} on the "
                         "least-loaded one")
        moved = a != problem.current
        usage = _Usage(int((a != problem.default).sum()), int(moved.sum()),
                       float(problem.state[moved].sum()), params)
        active = problem.active
        before = problem.instance_loads(a)[active].max(initial=0)
        moves, binding = _redistribute(problem, a, max_load, usage)
        after = problem.instance_loads(a)[active].max(initial=0)
        notes.append(f"{moves} move(s): max load {before:.6g} -> {after:.6g} "
                     f"(L_max {max_load:.6g}, mean {problem.mean_load():.6g})")
        if after <= max_load * (1 + LOAD_TOL):
            notes.append("stopped: every instance is within L_max")
        elif binding:
            names = " and ".join(binding)
            notes.append(f"stopped: improving moves remain but the {names} "
                         f"limit{'s forbid' if len(binding) > 1 else ' forbids'} them")
        else:
            notes.append("stopped: no single key move off an instance above L_max lowers its "
                         "load without raising the least-loaded one as high")
        for name, value, limit in (("table size", usage.table, params.max_table),
                                   ("moved keys", usage.moved, params.budget_keys),
                                   ("migration bytes", usage.bytes, params.budget_bytes)):
            if limit is not None and value > limit * (1 + CHECK_TOL):
                notes.append(f"{name} {value:.6g} exceeds its limit {limit:.6g} because keys "
                             "of drained/removed instances had to move")
        return Proposal(a, notes)


def _redistribute(problem: Problem, a: np.ndarray, max_load: float,
                  usage: _Usage) -> tuple[int, list[str]]:
    """Single-key moves off the instances above ``max_load`` (step 2 of the design in
    ``docs/planning.md``), in place on ``a``; returns the number of moves and the binding
    limits."""
    active = problem.active
    loads = problem.instance_loads(a).astype(np.float64)
    loads[~active] = np.inf
    tol = LOAD_TOL * max(problem.mean_load(), 1e-300)
    groups = _Groups(problem, a)
    moves = 0
    while True:
        t = int(np.argmin(loads))
        over = np.flatnonzero(active & (loads > max_load * (1 + LOAD_TOL)))
        binding: set[str] = set()
        for s in over[np.lexsort((over, -loads[over]))].tolist():
            key, blocked = groups.best(s, float(loads[s] - loads[t]) - tol, usage)
            binding |= blocked
            if key is not None:
                break
        else:
            return moves, sorted(binding)
        _account(problem, a, key, t, usage)
        groups.move(key, t)
        c = float(problem.load[key])
        loads[s] -= c
        loads[t] += c
        moves += 1


def _account(problem: Problem, a: np.ndarray, k: int, t: int, usage: _Usage) -> None:
    """Update table size and migration for moving key k (now on a[k]) to t."""
    default, current = int(problem.default[k]), int(problem.current[k])
    usage.table += int(a[k] == default) - int(t == default)
    step = int(a[k] == current) - int(t == current)
    usage.moved += step
    usage.bytes += step * float(problem.state[k])
