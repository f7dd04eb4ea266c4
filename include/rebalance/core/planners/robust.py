"""Robust (multi-scenario) variants of the heuristics: the ELB/CLB paper's robust view.

A problem with ``scenarios`` (S x K loads, e.g. the last W windows; see
:mod:`rebalance.core.forecast`) asks for an assignment under which *every* scenario keeps each
active instance within ``(1 + theta)`` times that scenario's own mean. Each scenario s has
its own bound B_s = (1 + theta) * mean_s (or its heaviest key when that is larger: no
assignment can do better); loads are normalised by it, Y[s, k] = X[s, k] / B_s, so an
instance fits when every row of its normalised load is <= 1 (a vector bin).
:func:`robust_llfd` is Fang et al.'s LLFD and :func:`robust_greedy` Maric et al.'s greedy,
both with these vector loads.

Deterministic: ties go to the lower instance, then the lower key index. Pure numpy.
"""

from __future__ import annotations

import heapq

import numpy as np

from rebalance.core.float_tolerances import LOAD_TOL
from rebalance.core.model import PlanParams, Problem

#: Loop cap of LLFD per candidate key (as :mod:`rebalance.core.planners.table_migration`).
LOOP_CAP_PER_KEY = 20
#: ADJUST and the exchanges look at this many instances, those with the lowest peak
#: (the backtest plans hundreds of times; the others rarely have room).
CANDIDATE_INSTANCES = 8


def normalised(problem: Problem, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """(Y, B): scenario loads divided by each scenario's bound, and the bounds."""
    x = problem.scenarios if problem.scenarios is not None else problem.load[None, :]
    n_active = int(problem.active.sum())
    totals = x.sum(axis=1)
    bound = (1.0 + theta) * totals / n_active
    bound = np.maximum(bound, x.max(axis=1, initial=0.0))
    bound = np.where(bound > 0, bound, 1.0)
    return x / bound[:, None], bound


class _State:
    """Normalised instance loads (S x N) of an assignment, updated by moves."""

    def __init__(self, problem: Problem, y: np.ndarray, a: np.ndarray) -> None:
        self.problem, self.y, self.a = problem, y, a
        n = problem.n_instances
        placed = a < n
        self.loads = np.zeros((y.shape[0], n))
        for s in range(y.shape[0]):
            self.loads[s] = np.bincount(a[placed], weights=y[s, placed], minlength=n)
        self.active = problem.active
        self.tol = LOAD_TOL

    def peaks(self) -> np.ndarray:
        p = self.loads.max(axis=0)
        return np.where(self.active, p, np.inf)

    def move(self, k: int, d: int) -> None:
        src = int(self.a[k])
        if 0 <= src < self.problem.n_instances:
            self.loads[:, src] -= self.y[:, k]
        self.loads[:, d] += self.y[:, k]
        self.a[k] = d


def _gamma(y_peak: np.ndarray, state: np.ndarray, beta: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.where(state > 0, y_peak ** beta / state, np.inf)
    return np.where(y_peak > 0, g, 0.0)


def robust_llfd(problem: Problem, params: PlanParams) -> tuple[np.ndarray, list[str]]:
    """Fang et al.'s LLFD (MinMig psi order) with vector loads; returns the assignment and notes.

    (II) From every instance above 1 in some scenario, detach keys in decreasing gamma =
    c^beta / S (c = the key's largest normalised load over the scenarios that instance
    breaks) until it fits; (III) place the detached keys, heaviest (largest normalised
    load in any scenario) first: back where they came from when that fits, else on the
    fitting instance with the lowest peak (its largest normalised load over the
    scenarios) after the key, else ADJUST: on the CANDIDATE_INSTANCES instances of lowest
    peak, in increasing peak, swap out strictly lighter keys in psi order until key and
    instance fit; a key nothing takes goes where the peak after it is least. A final pass
    moves keys off the worst instance while that lowers the worst peak (the bound may be
    unreachable).
    """
    y, bound = normalised(problem, params.theta)
    n = problem.n_instances
    a = problem.current.copy()
    must = problem.must_move()
    st = _State(problem, y, np.where(must, n, a))
    key_peak = y.max(axis=0)
    heap: list[tuple[float, int]] = []
    origin = np.where(must, -1, a)
    for k in np.flatnonzero(must).tolist():
        heapq.heappush(heap, (-float(key_peak[k]), k))
    # Phase II: detach from instances above 1 in some scenario, in gamma order.
    detached = 0
    for d in np.flatnonzero(problem.active).tolist():
        over = st.loads[:, d] > 1 + st.tol
        if not over.any():
            continue
        on = np.flatnonzero(st.a == d)
        c = y[np.ix_(over, on)].max(axis=0)
        order = on[np.lexsort((on, -_gamma(c, problem.state[on], params.beta)))]
        for k in order.tolist():
            if (st.loads[:, d] <= 1 + st.tol).all():
                break
            if not (y[over, k] > 0).any():
                continue
            st.loads[:, d] -= y[:, k]
            st.a[k] = n
            heapq.heappush(heap, (-float(key_peak[k]), k))
            detached += 1
    # Phase III: LLFD with vector loads.
    cap = LOOP_CAP_PER_KEY * (len(heap) + 1) + 1024
    popped = adjusted = fallbacks = 0
    while heap:
        _, k = heapq.heappop(heap)
        popped += 1
        after = st.loads + y[:, k][:, None]
        peak_after = np.where(st.active, after.max(axis=0), np.inf)
        home = int(origin[k])
        if home >= 0 and st.active[home] and peak_after[home] <= 1 + st.tol:
            st.move(k, home)
            continue
        fits = peak_after <= 1 + st.tol
        if fits.any():
            st.move(k, int(np.argmin(np.where(fits, st.peaks(), np.inf))))
            continue
        target = None if popped > cap else _adjust(st, k, key_peak, problem, params, heap)
        if target is None:
            fallbacks += 1
            target = int(np.argmin(peak_after))
        else:
            adjusted += 1
        st.move(k, target)
    passes = _improve(st, problem)
    a = st.a
    notes = [f"robust LLFD over {y.shape[0]} load scenario(s), each within (1 + theta) x its "
             f"own mean (bounds {_fmt(bound)}): {detached} key(s) detached, {adjusted} "
             f"ADJUST swap(s), {fallbacks} key(s) placed where the peak stays least, "
             f"{passes} improving move(s) off the worst instance"]
    return a, notes


def _adjust(st: _State, k: int, key_peak: np.ndarray, problem: Problem, params: PlanParams,
            heap: list) -> int | None:
    """ADJUST with vector loads: the first instance (increasing peak) whose strictly lighter
    keys, taken in gamma order, make room for k in every scenario; they go back to C."""
    y = st.y
    peaks = st.peaks()
    for d in np.argsort(peaks, kind="stable")[:CANDIDATE_INSTANCES].tolist():
        if not st.active[d]:
            break
        need = st.loads[:, d] + y[:, k] - 1.0
        on = np.flatnonzero((st.a == d) & (key_peak < key_peak[k]))
        if not len(on):
            continue
        if (y[:, on].sum(axis=1) < need - st.tol).any():
            continue
        over = need > st.tol
        c = y[np.ix_(over, on)].max(axis=0)
        order = on[np.lexsort((on, -_gamma(c, problem.state[on], params.beta)))]
        taken = []
        left = need.copy()
        for j in order.tolist():
            if (left <= st.tol).all():
                break
            if not (y[left > st.tol, j] > 0).any():
                continue
            taken.append(j)
            left -= y[:, j]
        if (left > st.tol).any():
            continue
        for j in taken:
            st.loads[:, d] -= y[:, j]
            st.a[j] = st.problem.n_instances
            heapq.heappush(heap, (-float(key_peak[j]), j))
        return d
    return None


def _improve(st: _State, problem: Problem, limit: int | None = None) -> int:
    """Move single keys off the worst instance while that lowers its peak below it
    (the larger of the two peaks after the move); returns the number of moves."""
    y = st.y
    moves = 0
    limit = 4 * problem.n_keys + 16 if limit is None else limit
    while moves < limit:
        peaks = st.peaks()
        src = int(np.argmax(np.where(st.active, peaks, -np.inf)))
        if peaks[src] <= 1 + st.tol:
            break
        on = np.flatnonzero((st.a == src) & (y.max(axis=0) > 0))
        if not len(on):
            break
        # best (key, destination): min over both of max(peak of src after, peak of dst after)
        src_after = (st.loads[:, src][:, None] - y[:, on]).max(axis=0)          # |on|
        dst_after = (st.loads[:, None, :] + y[:, on][:, :, None]).max(axis=0)    # |on| x N
        dst_after[:, ~st.active] = np.inf
        dst_after[:, src] = np.inf
        worst = np.maximum(src_after[:, None], dst_after)
        flat = int(np.argmin(worst))
        i, d = divmod(flat, worst.shape[1])
        if worst[i, d] < peaks[src] - st.tol:
            st.move(int(on[i]), int(d))
            moves += 1
            continue
        swap = _best_swap(st, src, on, peaks[src])
        if swap is None:
            break
        st.move(swap[0], swap[2])
        st.move(swap[1], src)
        moves += 2
    return moves


def _best_swap(st: _State, src: int, on: np.ndarray, peak: float) -> tuple[int, int, int] | None:
    """(key of src, key of d, d): the exchange that lowers the larger of the two peaks the
    most below ``peak`` (None when none does). Only tried when no single move helps: with
    several scenarios a key can fit only where another leaves (a window loads a pair)."""
    y = st.y
    best = None
    ys = y[:, on]                                                   # S x |on|
    for d in np.argsort(st.peaks(), kind="stable")[:CANDIDATE_INSTANCES + 1].tolist():
        if d == src or not st.active[d]:
            continue
        other = np.flatnonzero((st.a == d) & (y.max(axis=0) > 0))
        if not len(other):
            continue
        yo = y[:, other]                                            # S x |other|
        delta = yo[:, None, :] - ys[:, :, None]                     # S x |on| x |other|
        src_after = (st.loads[:, src][:, None, None] + delta).max(axis=0)
        dst_after = (st.loads[:, d][:, None, None] - delta).max(axis=0)
        worst = np.maximum(src_after, dst_after)
        i, j = divmod(int(np.argmin(worst)), worst.shape[1])
        if worst[i, j] < peak - st.tol and (best is None or worst[i, j] < best[0] - st.tol):
            best = (float(worst[i, j]), int(on[i]), int(other[j]), d)
    return None if best is None else best[1:]


def robust_greedy(problem: Problem, params: PlanParams) -> tuple[np.ndarray, list[str]]:
    """Maric et al.'s greedy with vector loads; returns the assignment and notes.

    One key at a time from the instance with the highest peak to the one with the lowest,
    the key that minimises the larger of the two peaks after the move, while that lowers
    the peak; when no single move does, the exchange of two keys that does (with several
    scenarios a key may fit only where another leaves).
    """
    from rebalance.core.planners.packing import place_forced

    y, bound = normalised(problem, params.theta)
    a = problem.current.copy()
    max_load = problem.max_load(params.theta)
    to_default, to_least, _ = place_forced(problem, a, max_load)
    st = _State(problem, y, a)
    moves = _improve(st, problem)
    notes = [f"robust greedy over {y.shape[0]} load scenario(s) (bounds {_fmt(bound)}): "
             f"{moves} single-key move(s) off the instance with the highest peak"]
    if to_default or to_least:
        notes.append(f"{to_default + to_least} key(s) of drained/removed instances placed first")
    return st.a, notes


def _fmt(bound: np.ndarray) -> str:
    if len(bound) <= 3:
        return ", ".join(f"{b:.6g}" for b in bound)
    return f"{bound.min():.6g} .. {bound.max():.6g}"


def robust_proposal(problem: Problem, params: PlanParams, engine: str):
    """The Proposal of a robust heuristic (``engine``: "llfd" or "greedy"), with the table
    fitted to A_max when one is set (keys sent back to their default instance)."""
    from rebalance.core.planners.base import Proposal
    from rebalance.core.planners.table_fit import fit_table

    a, notes = (robust_llfd if engine == "llfd" else robust_greedy)(problem, params)
    if params.max_table is not None and int((a != problem.default).sum()) > params.max_table:
        fitted, back = fit_table(problem, params, a)
        if back:
            a = fitted
            notes.append(f"table fit (A_max = {params.max_table}): {back} key(s) sent back to "
                         "their default instance")
    if params.budget_bytes is not None or params.budget_keys is not None:
        notes.append("the robust heuristics do not enforce a migration budget: it is checked "
                     "on the plan")
    return Proposal(np.asarray(a, dtype=np.int64), notes)
