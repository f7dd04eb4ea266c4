"""ELB planner: the ELB/CLB paper's eager load balancing (Sec. 3, Algorithm 1) over key groups.

The paper hashes keys to p >> n substreams and only ever changes substream -> instance.
Here the substreams are the key groups of :mod:`rebalance.core.placement`
(``pmod(spark hash, 4096)``, or ``problem.key_group`` when given): keys of one group
always move together. From every instance above the mean, groups lighter than
``min(l - mean, theta * mean)`` are detached largest first; they and the groups of
drained or removed instances go, largest first, to the least-loaded instance. A group's
current instance is the active one holding most of its load; its keys elsewhere are
consolidated there. The algorithm, with its fixes to the paper: ``docs/planning.md``,
"ELB and CLB: design".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rebalance.core.float_tolerances import LOAD_TOL
from rebalance.core.model import PlanParams, Problem
from rebalance.core.placement import key_groups
from rebalance.core.planners.base import Planner, Proposal
from rebalance.core.planners.packing import heaviest_first


@dataclass(frozen=True)
class KeyGroups:
    """Keys aggregated to key groups, the ELB/CLB paper's unit of migration."""

    ids: np.ndarray        # key group ids present, ascending
    of_key: np.ndarray     # position in ``ids`` of each key's group
    load: np.ndarray       # load of each group
    home: np.ndarray       # current instance of each group, -1 when it must move
    split_keys: int        # keys not on their group's home instance

    @classmethod
    def of(cls, problem: Problem) -> KeyGroups:
        """Groups of ``problem`` (``key_group`` if given, else the Spark-hash groups)."""
        group = problem.key_group if problem.key_group is not None else key_groups(problem.keys)
        ids, of_key = np.unique(group, return_inverse=True)
        load = np.bincount(of_key, weights=problem.load, minlength=len(ids))
        home = _home_instances(problem, of_key, len(ids))
        split = int(((home[of_key] != problem.current) & (home[of_key] >= 0)).sum())
        return cls(ids, of_key, load, home, split)

    def assignment(self, instance_of_group: np.ndarray) -> np.ndarray:
        """Key assignment that puts every key on its group's instance."""
        return np.asarray(instance_of_group, dtype=np.int64)[self.of_key]


def _home_instances(problem: Problem, of_key: np.ndarray, n_groups: int) -> np.ndarray:
    """Active instance holding most of each group's load (then state, then lowest id)."""
    home = np.full(n_groups, -1, dtype=np.int64)
    stays = ~problem.must_move()
    if not stays.any():
        return home
    n = problem.n_instances
    pair = of_key[stays] * n + problem.current[stays]
    pairs, inverse = np.unique(pair, return_inverse=True)
    load = np.bincount(inverse, weights=problem.load[stays])
    state = np.bincount(inverse, weights=problem.state[stays])
    group, instance = pairs // n, pairs % n
    best = np.lexsort((instance, -state, -load, group))
    first = np.concatenate([[True], group[best][1:] != group[best][:-1]])
    home[group[best][first]] = instance[best][first]
    return home


@dataclass(frozen=True)
class Balance:
    """Outcome of :func:`balance`: new owner of each unit and what happened."""

    owner: np.ndarray
    detached: int          # units taken off instances above the mean
    forced: int            # units whose instance is drained or removed
    overflow: int          # placements that pushed an instance above u
    capped: bool           # detach threshold capped at theta * mean


def balance(load: np.ndarray, owner: np.ndarray, active: np.ndarray, theta: float,
            capped: bool = True) -> Balance:
    """ELB (the ELB/CLB paper's Algorithm 1) over units of ``load`` now on ``owner`` (-1: must move).

    ``active`` lists the instances that may hold units. With ``capped`` the detach
    threshold is ``min(l_j - mean, theta * mean)`` (the paper's ``(u - v) / 2``);
    without it, ``l_j - mean`` (CLB's balancing step, whose sets may hold heavy units).
    """
    owner = np.asarray(owner, dtype=np.int64).copy()
    size = int(max(owner.max(initial=-1), active.max())) + 1
    placed = owner >= 0
    loads = np.bincount(owner[placed], weights=load[placed], minlength=size)
    mean = float(load.sum()) / len(active)
    queue = list(np.flatnonzero(~placed))
    forced = len(queue)
    for j in active[loads[active] > mean]:
        queue += _detach(load, np.flatnonzero(owner == j), loads, int(j), mean,
                         theta * mean if capped else np.inf)
    detached = len(queue) - forced
    upper = (1.0 + theta) * mean
    order, targets, before = heaviest_first(load, np.sort(np.asarray(queue, dtype=np.int64)),
                                            active, loads)
    owner[order] = targets
    overflow = int((before + load[order] > upper * (1 + LOAD_TOL)).sum())
    return Balance(owner, detached, forced, overflow, capped)


def _detach(load: np.ndarray, members: np.ndarray, loads: np.ndarray, j: int, mean: float,
            cap: float) -> list[int]:
    """Largest units of instance ``j`` below ``min(l_j - mean, cap)``, threshold recomputed."""
    out = []
    for g in members[np.lexsort((members, -load[members]))]:
        threshold = min(loads[j] - mean, cap)
        if threshold <= 0:
            break
        if 0 < load[g] < threshold:
            out.append(int(g))
            loads[j] -= load[g]
    return out


def describe_groups(groups: KeyGroups) -> str:
    """The unit of migration, and the keys a plan consolidates onto their group."""
    note = (f"{len(groups.ids)} key groups (the ELB/CLB paper's substreams) are the unit of "
            "migration")
    if groups.split_keys:
        note += (f"; {groups.split_keys} key(s) away from their group's majority instance are "
                 "consolidated onto it")
    return note


def describe_balance(result: Balance, theta: float) -> str:
    """What an ELB pass did, for a plan's notes."""
    threshold = "min(l - mean, theta * mean)" if result.capped else "l - mean"
    note = (f"ELB: {result.detached} group(s) detached from instances above the mean "
            f"(threshold {threshold})")
    if result.forced:
        note += f", {result.forced} taken off drained/removed instances"
    note += ", placed largest first on the least-loaded instance"
    if result.overflow:
        note += (f"; {result.overflow} placement(s) exceeded u = (1 + {theta:g}) * mean "
                 "(no instance could hold them: the globally least-loaded took them)")
    return note


class ElbPlanner(Planner):
    """The ELB/CLB paper's eager load balancing over key groups."""

    name = "elb"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        groups = KeyGroups.of(problem)
        active = np.flatnonzero(problem.active)
        result = balance(groups.load, groups.home, active, params.theta)
        assignment = groups.assignment(result.owner)
        notes = [describe_groups(groups), describe_balance(result, params.theta)]
        if groups.load.sum() <= 0:
            notes.append("no load: only groups of drained/removed instances move")
        over = int((problem.instance_loads(assignment) > problem.max_load(params.theta)).sum())
        if over:
            heavy = int((groups.load >= params.theta * problem.mean_load()).sum())
            notes.append(f"{over} instance(s) stay above u: ELB never detaches a group of load "
                         f">= (u - v) / 2 = theta * mean ({heavy} such groups; the ELB/CLB paper "
                         "assumes none)")
        return Proposal(assignment, notes)
