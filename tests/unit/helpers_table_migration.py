"""Problems and a key-by-key reference LLFD for the seed 003 planner tests."""

from __future__ import annotations

import numpy as np

from rebalance.core.model import Problem

D1, D2 = 0, 1


def worked_example() -> Problem:
    """Seed 003 Fig. 4: d1 = {k1:7, k2:4, k5:5}, d2 = {k3:2, k4:1, k6:1}, table
    {k3 -> d2, k5 -> d1}, so h(k3) = d1 and h(k5) = d2. State = load."""
    load = [7, 4, 2, 1, 5, 1]
    return Problem(keys=np.array([f"k{i}" for i in range(1, 7)], dtype=object),
                   load=load, state=load,
                   current=[D1, D1, D2, D2, D1, D2],
                   default=[D1, D1, D1, D2, D2, D2], n_instances=2)


def table_of(problem: Problem, assignment: np.ndarray) -> dict[str, int]:
    """Routing table of an assignment: key -> instance for the keys off their default."""
    off = np.flatnonzero(assignment != problem.default)
    return {str(problem.keys[k]): int(assignment[k]) for k in off}


def random_problem(seed: int, n_keys: int = 40, n_instances: int = 4, table: float = 0.3,
                   drain: tuple[int, ...] = (), removed: int = 0) -> Problem:
    """Distinct skewed loads and states; a fraction ``table`` of the keys off their default;
    ``removed`` extra instances beyond n_instances hold keys that must move."""
    rng = np.random.default_rng(seed)
    load = rng.pareto(1.5, n_keys) + rng.random(n_keys)
    state = rng.random(n_keys) * 100 + 1
    default = rng.integers(0, n_instances, n_keys)
    current = default.copy()
    off = rng.random(n_keys) < table
    current[off] = rng.integers(0, n_instances + removed, int(off.sum()))
    return Problem(keys=np.array([f"k{i}" for i in range(n_keys)], dtype=object), load=load,
                   state=state, current=current, default=default, n_instances=n_instances,
                   drain=frozenset(drain))


def reference_llfd(problem: Problem, psi_value: np.ndarray, n_clean: int, bound: float,
                   heavy: float) -> np.ndarray:
    """Seed 003's three phases key by key, straight from Algorithm 1, for distinct loads.

    ``psi_value``: detach order (decreasing; keys heavier than ``heavy`` last, ties by key).
    The n_clean table keys of smallest state (ties by key) go back to their default.
    """
    load = problem.load
    n = problem.n_instances
    active = problem.active
    limit = bound * (1 + 1e-12)
    a = problem.current.copy()
    cleanable = np.flatnonzero((a != problem.default) & active[problem.default])
    cleaned = cleanable[np.lexsort((cleanable, problem.state[cleanable]))][:n_clean]
    a[cleaned] = problem.default[cleaned]
    a[problem.must_move() & ~np.isin(np.arange(problem.n_keys), cleaned)] = -1
    psi_order = np.lexsort((np.arange(problem.n_keys), -psi_value, load > heavy))
    rank = np.empty(problem.n_keys, dtype=np.int64)
    rank[psi_order] = np.arange(problem.n_keys)

    def loads() -> np.ndarray:
        out = np.bincount(a[a >= 0], weights=load[a >= 0], minlength=n)
        return np.where(active, out, np.inf)

    def detach(d: int, need: float, lighter_than: float) -> list[int]:
        out = []
        for k in psi_order:
            if need <= bound * 1e-12:
                break
            if a[k] == d and 0 < load[k] < lighter_than:
                a[k] = -1
                out.append(int(k))
                need -= load[k]
        return out

    candidates = []
    for d in range(n):
        if active[d] and loads()[d] > limit:
            candidates += detach(d, loads()[d] - bound, np.inf)
    candidates += np.flatnonzero(a < 0).tolist()
    candidates = sorted(set(candidates), key=lambda k: (-load[k], rank[k]))
    while candidates:
        k = candidates.pop(0)
        current = loads()
        if current.min() + load[k] <= limit:
            a[k] = int(np.argmin(current))
            continue
        need = current + load[k] - bound
        lighter = np.array([load[(a == d) & (load < load[k])].sum() for d in range(n)])
        able = np.flatnonzero(active & (lighter >= need - bound * 1e-12))
        if len(able):
            d = int(able[np.lexsort((able, current[able]))[0]])
            candidates += detach(d, need[d], load[k])
            candidates.sort(key=lambda j: (-load[j], rank[j]))
        else:
            d = int(np.argmin(current))
        a[k] = d
    return a
