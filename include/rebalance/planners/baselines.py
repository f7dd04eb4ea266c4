"""Comparison baselines: plain hashing (no rebalancing) and a full LPT re-pack.

* ``hash`` keeps every key where it is; only keys that must move (drained or removed
  instance) go to their default instance when it is active, else to the least-loaded
  active instance, heaviest first. It is the "do nothing" reference every planner must
  beat on balance (seed 003 compares Mixed against plain hashing, Sec. V).
* ``lpt`` is the longest-processing-time-first re-pack: every key, heaviest first (ties:
  lower key index), goes to the least-loaded active instance (ties: lower index),
  ignoring where it is now. It balances well and moves almost every key: seed 004
  (Sec. 3.3) rejects exactly this in favour of moving few partitions, and it is the
  upper reference for migration.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..model import PlanParams, Problem
from .base import Planner, Proposal


class HashPlanner(Planner):
    """No rebalancing: the current assignment, with the keys that must move re-homed."""

    name = "hash"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        a = problem.current.copy()
        must = problem.must_move()
        active = problem.active
        home = must & active[problem.default]
        a[home] = problem.default[home]
        rest = np.flatnonzero(must & ~home)
        if len(rest):
            placed = ~must | home
            loads = np.bincount(a[placed], weights=problem.load[placed],
                                minlength=problem.n_instances).astype(np.float64)
            loads[~active] = np.inf
            for k in rest[np.lexsort((rest, -problem.load[rest]))].tolist():
                a[k] = int(np.argmin(loads))
                loads[a[k]] += problem.load[k]
        notes = ["hash: no rebalancing, every key stays on its current instance"]
        if must.any():
            notes.append(f"{int(home.sum())} key(s) of drained/removed instances go to their "
                         f"default instance, {len(rest)} (default drained) to the least-loaded "
                         "active instance")
        return Proposal(a, notes)


class LptPlanner(Planner):
    """Longest processing time first over all keys, ignoring the current placement."""

    name = "lpt"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        k = problem.n_keys
        heap = [(0.0, d) for d in np.flatnonzero(problem.active).tolist()]
        order = np.argsort(-problem.load, kind="stable")
        targets = []
        for c in problem.load[order].tolist():
            level, d = heap[0]
            targets.append(d)
            heapq.heapreplace(heap, (level + c, d))
        a = np.empty(k, dtype=np.int64)
        a[order] = targets
        moved = int((a != problem.current).sum())
        return Proposal(a, [
            "lpt: full re-pack, every key heaviest first onto the least-loaded active "
            "instance, ignoring the current placement",
            f"{moved} of {k} key(s) change instance: LPT balances but does not try to "
            "keep keys where they are"])
