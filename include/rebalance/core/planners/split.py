"""Split placement: keys too hot for any one instance get ``d >= 2`` instances, with shares.

A key whose load alone exceeds the bound ``(1 + theta) x mean`` is the floor of every
plan of whole keys. The ELB/CLB paper's PKG and the D-Choices / W-Choices follow-up
spread such a key over several instances and merge the partial results of a window;
:func:`plan_split` does this inside the planners: only keys above the bound are split,
into the least number of equal shares that fit (``ceil(load / bound)``); the expanded
problem is planned by the base planner like any other (the first share keeps the key's
state and place, so a key split in place moves no state); shares on one instance are
merged back, and while the plan exceeds the bound each split key gets one more share (at
most :data:`MAX_ROUNDS` rounds). The costs (table entries, moved state, ``merge_rows``)
are counted and reported. In full: ``docs/planning.md``, "Keys heavier than the bound".
Pure numpy: no Spark or Airflow import.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from rebalance.core.float_tolerances import CHECK_TOL
from rebalance.core.model import Metrics, Plan, PlanningError, PlanParams, Problem, imbalance

#: Rounds of "one more share per split key" after the first expanded plan.
MAX_ROUNDS = 3


@dataclass(frozen=True, eq=False)
class SplitKeys:
    """Keys spread over several instances: ``index`` (increasing key indices into the
    problem's arrays), and per split key its distinct ``instances`` and their ``shares``
    of its events (each > 0, summing to 1)."""

    index: np.ndarray
    instances: tuple[np.ndarray, ...]
    shares: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        index = np.asarray(self.index, dtype=np.int64)
        if index.ndim != 1 or len(index) != len(self.instances) or len(index) != len(self.shares):
            raise PlanningError("split keys: index, instances and shares must have one entry "
                                "per split key")
        if len(index) > 1 and not (index[1:] > index[:-1]).all():
            raise PlanningError("split keys: the key indices must be increasing")
        instances = tuple(np.asarray(i, dtype=np.int64) for i in self.instances)
        shares = tuple(np.asarray(s, dtype=np.float64) for s in self.shares)
        for k, inst, share in zip(index, instances, shares):
            if len(inst) < 2 or len(inst) != len(share):
                raise PlanningError(f"split key {int(k)}: needs >= 2 instances, one share each")
            if len(set(inst.tolist())) != len(inst):
                raise PlanningError(f"split key {int(k)}: instances must be distinct")
            if not (share > 0).all() or abs(float(share.sum()) - 1.0) > 1e-9:
                raise PlanningError(f"split key {int(k)}: shares must be > 0 and sum to 1, "
                                    f"got {share.tolist()}")
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "instances", instances)
        object.__setattr__(self, "shares", shares)

    @classmethod
    def none(cls) -> SplitKeys:
        return cls(np.zeros(0, dtype=np.int64), (), ())

    def __len__(self) -> int:
        return len(self.index)

    @property
    def entries(self) -> int:
        """Routing-table entries of the split keys: one per share."""
        return int(sum(len(i) for i in self.instances))

    @property
    def merge_rows(self) -> int:
        """Partial results to merge per window: one per share beyond a key's first."""
        return int(sum(len(i) - 1 for i in self.instances))

    def loads(self, problem: Problem, assignment: np.ndarray,
              weights: np.ndarray | None = None) -> np.ndarray:
        """Load of every instance: whole keys by ``assignment``, split keys by their
        shares (``weights``: per-key loads, the problem's load by default)."""
        w = problem.load if weights is None else np.asarray(weights, dtype=np.float64)
        a = np.asarray(assignment, dtype=np.int64)
        whole = np.ones(len(a), dtype=bool)
        whole[self.index] = False
        whole &= (a >= 0) & (a < problem.n_instances)
        out = np.bincount(a[whole], weights=w[whole], minlength=problem.n_instances)
        for k, inst, share in zip(self.index, self.instances, self.shares):
            np.add.at(out, inst, share * w[k])
        return out

    def mapping(self, keys: np.ndarray) -> dict[str, dict[int, float]]:
        """The split keys as key -> {instance: share} (what an assignment publishes)."""
        return {str(keys[k]): {int(i): float(s) for i, s in zip(inst, share)}
                for k, inst, share in zip(self.index, self.instances, self.shares)}

    def records(self, keys: np.ndarray) -> list[dict]:
        """The split keys as JSON-able rows: key, instances, shares."""
        return [{"key": keys[k], "instances": [int(i) for i in inst],
                 "shares": [float(s) for s in share]}
                for k, inst, share in zip(self.index, self.instances, self.shares)]


def evaluate_split(problem: Problem, assignment: np.ndarray, split: SplitKeys) -> Metrics:
    """:func:`rebalance.core.model.evaluate` for an assignment with split keys.

    ``assignment`` gives every key one instance (for a split key: its largest share's,
    the one reported as its instance). Loads count shares; a split key is moved (its
    state migrates) only when none of its instances is its current one; the table counts
    one entry per share of a split key and the whole keys off their default instance.
    """
    from rebalance.core.model import evaluate

    base = evaluate(problem, assignment)
    if not len(split):
        return base
    if split.index.max() >= problem.n_keys:
        raise PlanningError(f"split key index {int(split.index.max())} is outside the "
                            f"{problem.n_keys} keys")
    for inst in split.instances:
        if inst.min() < 0 or inst.max() >= problem.n_instances:
            raise PlanningError(f"split key instances outside [0, {problem.n_instances})")
    a = np.asarray(assignment, dtype=np.int64)
    active = problem.active
    loads = split.loads(problem, a)
    total = float(problem.load.sum())
    imb_after = imbalance(loads, active) if total > 0 else 1.0
    if problem.scenarios is not None:
        for row in problem.scenarios:
            if row.sum() > 0:
                imb_after = max(imb_after, imbalance(split.loads(problem, a, row), active))
    moved = moved_keys(problem, a, split)
    whole = np.ones(problem.n_keys, dtype=bool)
    whole[split.index] = False
    mig = float(problem.state[moved].sum())
    total_state = float(problem.state.sum())
    return dataclasses.replace(
        base, imbalance_after=imb_after, max_load_after=float(loads.max()),
        migration_bytes=mig, migration_fraction=mig / total_state if total_state > 0 else 0.0,
        moved_keys=int(moved.sum()),
        table_size=int((a[whole] != problem.default[whole]).sum()) + split.entries)


def moved_keys(problem: Problem, assignment: np.ndarray, split: SplitKeys) -> np.ndarray:
    """Keys whose state migrates: whole keys off their current instance, split keys
    none of whose instances is their current one (:func:`rebalance.core.records.moved_mask`
    by key names; this one by index, for the planners' 10^6-key arrays)."""
    moved = np.asarray(assignment, dtype=np.int64) != problem.current
    for k, inst in zip(split.index, split.instances):
        moved[k] = not (inst == problem.current[k]).any()
    return moved


def hot_keys(problem: Problem, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """Keys that cannot be placed whole within ``1 + theta`` and the least number of
    equal shares each needs: (indices, shares), the load in every scenario against that
    scenario's bound."""
    n_active = int(problem.active.sum())
    rows = problem.scenarios if problem.scenarios is not None else problem.load[None, :]
    ratio = np.zeros(problem.n_keys)
    for row in rows:
        total = float(row.sum())
        if total > 0:
            ratio = np.maximum(ratio, row / ((1.0 + theta) * total / n_active))
    hot = np.flatnonzero(ratio > 1.0 + CHECK_TOL)
    need = np.minimum(np.ceil(ratio[hot] - CHECK_TOL).astype(np.int64), n_active)
    return hot, np.maximum(need, 2)


def expand(problem: Problem, hot: np.ndarray, shares: np.ndarray) -> tuple[Problem, np.ndarray]:
    """The problem with each hot key replaced by ``shares`` equal parts (in place of the
    key, in order): the first part keeps the key's state, the others have none (new
    partials). Returns it and, for every part, the index of its key."""
    reps = np.ones(problem.n_keys, dtype=np.int64)
    reps[hot] = shares
    owner = np.repeat(np.arange(problem.n_keys), reps)
    first = _firsts(owner)
    part = np.zeros(len(owner), dtype=np.int64)        # 0 for the first part of a key
    starts = np.flatnonzero(first)
    part[~first] = (np.arange(len(owner)) - np.repeat(starts, reps))[~first]
    divide = reps[owner].astype(np.float64)
    keys = problem.keys[owner]             # a part after the first: (key, part number)
    for i in np.flatnonzero(~first).tolist():
        keys[i] = (problem.keys[owner[i]], int(part[i]))
    expanded = Problem(
        keys=keys, load=problem.load[owner] / divide,
        state=np.where(first, problem.state[owner], 0.0),
        current=problem.current[owner], default=problem.default[owner],
        n_instances=problem.n_instances, drain=problem.drain,
        load_series=None if problem.load_series is None else problem.load_series[:, owner] / divide,
        key_group=None if problem.key_group is None else problem.key_group[owner],
        scenarios=None if problem.scenarios is None else problem.scenarios[:, owner] / divide)
    return expanded, owner


def _firsts(owner: np.ndarray) -> np.ndarray:
    """Which parts of an expanded problem are the first of their key (``owner`` sorted)."""
    first = np.ones(len(owner), dtype=bool)
    first[1:] = owner[1:] != owner[:-1]
    return first


def collapse(problem: Problem, owner: np.ndarray, parts: np.ndarray,
             hot: np.ndarray) -> tuple[np.ndarray, SplitKeys]:
    """An expanded plan's placement back on the problem's keys: every key's instance
    (a split key's: its largest share's, its current one among equals) and the keys
    whose parts landed on two or more instances, with their shares."""
    assignment = np.empty(problem.n_keys, dtype=np.int64)
    first = _firsts(owner)
    assignment[owner[first]] = parts[first]
    index, instances, shares = [], [], []
    positions = np.searchsorted(owner, hot)
    ends = np.searchsorted(owner, hot, side="right")
    for k, lo, hi in zip(hot.tolist(), positions.tolist(), ends.tolist()):
        inst, count = np.unique(parts[lo:hi], return_counts=True)
        current = problem.current[k]
        # largest share first; among equal shares the current instance, then the lowest
        order = sorted(range(len(inst)), key=lambda i: (-count[i], inst[i] != current, inst[i]))
        assignment[k] = inst[order[0]]
        if len(inst) >= 2:
            index.append(k)
            instances.append(inst[order])
            shares.append(count[order] / float(hi - lo))
    return assignment, SplitKeys(np.array(index, dtype=np.int64), tuple(instances),
                                 tuple(shares))


def plan_split(problem: Problem, params: PlanParams, base: str = "auto",
               max_shares: int | None = None) -> Plan:
    """Plan with ``base``, splitting the keys no instance can hold whole within the bound
    (module docstring). Without such keys this is ``base``'s plan, unchanged."""
    from rebalance.core.planners import get_planner
    from rebalance.core.planners.base import check_limits

    t0 = time.perf_counter()
    hot, need = hot_keys(problem, params.theta)
    n_active = int(problem.active.sum())
    limit = n_active if max_shares is None else int(max_shares)
    if limit < 2:
        raise PlanningError(f"max_shares must be >= 2, got {max_shares!r}")
    if not len(hot) or n_active < 2:
        plan = get_planner(base).plan(problem, params)
        plan.notes.insert(0, "split: no key above the bound alone, every key placed whole"
                          if not len(hot) else "split: one active instance, nothing to split")
        return plan
    need = np.minimum(need, limit)
    best: Plan | None = None
    notes: list[str] = []
    deadline = t0 + params.time_limit
    total_state = float(problem.state.sum())
    for round_ in range(1 + MAX_ROUNDS):
        left = max(deadline - time.perf_counter(), 0.1 * params.time_limit)
        expanded, owner = expand(problem, hot, need)
        inner = get_planner(base).plan(expanded, dataclasses.replace(params, time_limit=left))
        assignment, split = collapse(problem, owner, inner.assignment, hot)
        metrics = evaluate_split(problem, assignment, split)
        whole = np.ones(problem.n_keys, dtype=bool)
        whole[split.index] = False
        reasons = check_limits(problem, params, metrics, np.where(whole, assignment, -1))
        drained = sorted(i for i in problem.drain if any(i in inst for inst in split.instances))
        if drained:
            reasons.append(f"split keys keep shares on drained instances {drained}")
        notes.append(f"split round {round_ + 1}: {len(hot)} key(s) above the bound alone, "
                     f"in {int(need.sum())} shares ({int(need.min())}-{int(need.max())} "
                     f"each), {len(split)} split: imbalance {metrics.imbalance_after:.4f}, "
                     f"migration {metrics.migration_fraction:.4f}, table {metrics.table_size}")
        # The bound of the expanded problem: for plans with these shares (a key split
        # otherwise could need less).
        lb = inner.lower_bound_bytes
        plan = Plan(method=f"{base}+split", assignment=assignment,
                    moved=moved_keys(problem, assignment, split), metrics=metrics,
                    params=params, feasible=not reasons, lower_bound_bytes=lb,
                    lower_bound_fraction=lb / total_state if total_state > 0 else 0.0,
                    plan_seconds=0.0, notes=[*inner.notes, *reasons], split=split)
        if best is None or _better(plan, best):
            best = plan
        if plan.feasible or (need >= limit).all() or time.perf_counter() >= deadline:
            break
        need = np.minimum(need + 1, limit)
    assert best is not None
    best.plan_seconds = time.perf_counter() - t0
    best.notes[:0] = notes + [f"split: {len(best.split)} key(s) on {best.split.entries} "
                              f"shares, {best.split.merge_rows} partial result(s) to merge "
                              "per window"]
    return best


def _better(a: Plan, b: Plan) -> bool:
    """Feasible first, then the lower imbalance, then the lower migration."""
    ka = (not a.feasible, round(a.metrics.imbalance_after, 9), a.metrics.migration_bytes)
    kb = (not b.feasible, round(b.metrics.imbalance_after, 9), b.metrics.migration_bytes)
    return ka < kb


__all__ = ["MAX_ROUNDS", "SplitKeys", "collapse", "evaluate_split", "expand", "hot_keys",
           "plan_split"]
