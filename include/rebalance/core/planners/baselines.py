"""Comparison baselines: plain hashing (no rebalancing) and a full LPT re-pack.

* ``hash`` keeps every key where it is; only keys that must move (drained or removed
  instance) go to their default instance when it is active, else to the least-loaded
  active instance, heaviest first. It is the "do nothing" reference every planner must
  beat on balance (Fang et al. compare Mixed against plain hashing, Sec. V).
* ``lpt`` is the longest-processing-time-first re-pack: every key, heaviest first (ties:
  lower key index), goes to the least-loaded active instance (ties: lower index),
  ignoring where it is now. It balances well and moves almost every key: Maric et al.
  (Sec. 3.3) reject exactly this in favour of moving few partitions, and it is the
  upper reference for migration.
"""

from __future__ import annotations

import numpy as np

from rebalance.core.model import PlanParams, Problem
from rebalance.core.planners.base import Planner, Proposal
from rebalance.core.planners.packing import heaviest_first, place_forced


class HashPlanner(Planner):
    """No rebalancing: the current assignment, with the keys that must move re-homed."""

    name = "hash"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        a = problem.current.copy()
        home, rest, _ = place_forced(problem, a, max_load=np.inf)
        notes = ["hash: no rebalancing, every key stays on its current instance"]
        if home or rest:
            notes.append(f"{home} key(s) of drained/removed instances go to their "
                         f"default instance, {rest} (default drained) to the least-loaded "
                         "active instance")
        return Proposal(a, notes)


class LptPlanner(Planner):
    """Longest processing time first over all keys, ignoring the current placement."""

    name = "lpt"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        k = problem.n_keys
        order, targets, _ = heaviest_first(problem.load, np.arange(k),
                                           np.flatnonzero(problem.active),
                                           np.zeros(problem.n_instances))
        a = np.empty(k, dtype=np.int64)
        a[order] = targets
        moved = int((a != problem.current).sum())
        return Proposal(a, [
            "lpt: full re-pack, every key heaviest first onto the least-loaded active "
            "instance, ignoring the current placement",
            f"{moved} of {k} key(s) change instance: LPT balances but does not try to "
            "keep keys where they are"])
