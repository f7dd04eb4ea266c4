"""Lower bounds on the migration any assignment needs to reach a load bound.

Beyond the papers: every plan reports how far it may be from optimal.

The bound relaxes the problem instance by instance. To end with load <= L, instance d
must shed at least ``L_d - L`` of load, and only keys now on d can leave it. The cheapest
way to shed that much, even allowing fractions of keys, is the fractional knapsack that
takes keys by increasing state per unit of load. Keys on drained or removed instances
must all move. Summing over instances gives a bound no assignment can beat (instances
shed disjoint key sets): the LP relaxation of "each overloaded instance sheds its
excess". With ``max_table`` (A_max) the bound also accounts for the routing table
(:func:`_table_bound`); :func:`cover_lower_bound` keeps keys whole. Only the keys of
overloaded instances are looked at, and of those only the cheapest few per instance are
sorted, so at 10^6 keys a bound costs a few linear passes instead of a full sort.
"""

from __future__ import annotations

import time

import numpy as np

from rebalance.core.float_tolerances import CHECK_TOL, LOAD_TOL
from rebalance.core.model import Problem

#: First prefix (keys) tried per overloaded instance; grown 4x until it covers the excess.
_FIRST_PREFIX = 256


def _ratio(state: np.ndarray, load: np.ndarray) -> np.ndarray:
    """State per unit of load; keys without load last (``inf``).

    A subnormal load can make the quotient overflow: ``inf`` is then the right order
    (the true ratio is above every finite double), so only overflow is silenced here,
    for this one division whose zero divisors are excluded by ``where``.
    """
    out = np.full(len(load), np.inf)
    with np.errstate(over="ignore"):
        np.divide(state, load, out=out, where=load > 0)
    return out


def _knapsack_prefix(load: np.ndarray, ratio: np.ndarray,
                     excess: float) -> tuple[np.ndarray, np.ndarray]:
    """The fractional knapsack's order, cut short: the keys in increasing ``ratio`` (ties by
    position, as a full stable sort) and their cumulative load, for the shortest prefix of
    :data:`_FIRST_PREFIX` keys grown 4x that carries ``excess`` (all keys if none does).
    Only that prefix is sorted, so a bound at 10^6 keys touches a few thousand."""
    n = len(load)
    k = min(n, _FIRST_PREFIX)
    while True:
        part = np.argpartition(ratio, k - 1)[:k] if k < n else np.arange(n)
        part = part[np.lexsort((part, ratio[part]))]
        cum = np.cumsum(load[part])
        if k >= n or (len(cum) and cum[-1] >= excess):
            return part, cum
        k = min(n, 4 * k)


def _shed_cost(load: np.ndarray, state: np.ndarray, excess: float) -> float:
    """Fractional knapsack: least state carrying ``excess`` load out of these keys."""
    part, cum = _knapsack_prefix(load, _ratio(state, load), excess)
    j = int(np.searchsorted(cum, excess, side="left"))
    full = float(state[part[:j]].sum())
    shed_before = float(cum[j - 1]) if j > 0 else 0.0
    rest = excess - shed_before
    if j < len(part) and load[part[j]] > 0:
        full += float(state[part[j]]) * min(1.0, rest / float(load[part[j]]))
    return full


def _overloaded_keys(problem: Problem, max_load: float
                     ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, np.ndarray]]]:
    """Where every bound starts: the keys forced to move (mask), the instance loads of
    the other keys, and per instance loaded above ``max_load`` the indices of its keys
    that may stay (ascending). Only the keys of overloaded instances are sorted, so this
    stays cheap at 10^6 keys."""
    forced = problem.must_move()
    stay = np.flatnonzero(~forced)
    cur = problem.current[stay]
    loads = np.bincount(cur, weights=problem.load[stay], minlength=problem.n_instances)
    over = np.flatnonzero(loads > max_load * (1 + LOAD_TOL))
    if len(over) == 0:
        return forced, loads, []
    is_over = np.zeros(len(loads), dtype=bool)
    is_over[over] = True
    sel = np.flatnonzero(is_over[cur])
    sel = sel[np.argsort(cur[sel], kind="stable")]
    grouped = cur[sel]
    starts = np.searchsorted(grouped, over, side="left")
    ends = np.searchsorted(grouped, over, side="right")
    return forced, loads, [(int(d), stay[sel[lo:hi]]) for d, lo, hi in zip(over, starts, ends)]


def migration_lower_bound(problem: Problem, max_load: float,
                          max_table: int | None = None) -> float:
    """Least state (bytes) any assignment must move so every instance load <= ``max_load``
    (and, with ``max_table``, at most that many keys are off their default instance).

    Returns ``inf`` when no assignment can reach ``max_load`` because a single
    key is heavier than it.
    """
    if max_table is not None:
        return _table_bound(problem, max_load, max_table)
    if problem.n_keys == 0:
        return 0.0
    if float(problem.load.max()) > max_load * (1 + LOAD_TOL):
        return float("inf")
    forced, loads, groups = _overloaded_keys(problem, max_load)
    bound = float(problem.state[forced].sum())
    for d, keys in groups:
        bound += _shed_cost(problem.load[keys], problem.state[keys], float(loads[d] - max_load))
    return bound


def table_cannot_bind(problem: Problem, max_load: float, max_table: int) -> bool:
    """True when the table-aware bound (``rebalance.core.bounds``) equals the plain one, so
    ``finish_plan`` (``rebalance.core.planners.base``) can skip its multiplier search (dozens
    of fractional knapsacks).

    The plain bound is the optimum of the LP "every overloaded instance sheds its
    excess", solved by a fractional knapsack per instance that touches, in increasing
    state per load, only as many keys as cover the excess. If the current table (keys off
    their default instance, not forced to move) plus every key those knapsacks touch fits
    in ``max_table``, that optimal solution meets the relaxed table inequality, so the LP
    with the table inequality has the same optimum and the Lagrangian bound (<= that
    optimum by weak duality, >= the plain bound by construction) equals it. Returning the
    plain bound is valid in any case; this only decides when the tighter one cannot help.
    """
    forced, loads, groups = _overloaded_keys(problem, max_load)
    room = int(max_table) - int(((problem.current != problem.default) & ~forced).sum())
    if room < 0:
        return False
    if float(problem.load.max(initial=0.0)) > max_load * (1 + LOAD_TOL):
        return True  # both bounds are inf
    if sum(len(keys) for _, keys in groups) <= room:
        return True
    touched = 0
    for d, keys in groups:
        load = problem.load[keys]
        excess = float(loads[d] - max_load)
        n = len(keys)
        _, cum = _knapsack_prefix(load, _ratio(problem.state[keys], load), excess)
        # Keys the knapsack takes: whole ones, plus the fractional one (ties in the ratio
        # order only change which optimal solution, not how many keys it needs at most k).
        touched += min(n, int(np.searchsorted(cum, excess, side="left")) + 1)
        if touched > room:
            return False
    return True


#: Golden-section steps over the multiplier of the table constraint.
_MU_STEPS = 24


def _signed_shed_cost(load: np.ndarray, cost: np.ndarray, excess: float) -> float:
    """Fractional knapsack with costs of any sign: least cost of shedding >= ``excess``."""
    neg = cost < 0
    total = float(cost[neg].sum())
    rest = excess - float(load[neg].sum())
    if rest <= 0:
        return total
    pos = ~neg & (load > 0)
    load, cost = load[pos], cost[pos]
    order = np.argsort(cost / load, kind="stable")
    cum = np.cumsum(load[order])
    j = int(np.searchsorted(cum, rest, side="left"))
    total += float(cost[order[:j]].sum())
    before = float(cum[j - 1]) if j > 0 else 0.0
    if j < len(order):
        total += float(cost[order[j]]) * min(1.0, (rest - before) / float(load[order[j]]))
    return total


def _table_bound(problem: Problem, max_load: float, max_table: int) -> float:
    """The Lagrangian bound with the routing-table inequality.

    Let T0 be the keys now off their default instance (excluding keys that must move),
    m_k = 1 if key k moves. A key at home that moves enters the table; a table key that
    stays stays in it; a table key that moves may leave it (only by going home). So every
    plan with table <= A_max has

        sum_{k at home} m_k - sum_{k in table, default active} m_k <= A_max - T0.

    Relaxing m_k to [0, 1], the LP "shed every excess, meet this inequality" is a
    relaxation of every plan meeting L_max and A_max. For any multiplier mu >= 0 its
    Lagrangian ``g(mu) = -mu (A_max - T0) + sum_d knapsack_d(costs s_k + mu at home,
    s_k - mu in the table) + sum_{table keys elsewhere} min(0, s_k - mu)`` is <= the LP
    optimum (weak duality), so any mu gives a valid bound; mu = 0 is the table-free
    bound. ``g`` is concave: a golden-section search over mu picks a good one. A
    knapsack with negative costs takes every negative-cost key whole (it may shed more
    than the excess), then the cheapest per unit of load.
    """
    plain = migration_lower_bound(problem, max_load)
    if not np.isfinite(plain) or problem.n_keys == 0:
        return plain
    forced, loads, over = _overloaded_keys(problem, max_load)
    active = problem.active
    cur, dft = problem.current, problem.default
    home = (cur == dft) & ~forced
    table = (cur != dft) & ~forced
    can_leave = table & active[dft]          # table keys that can leave the table (go home)
    room = float(max_table) - float(table.sum())
    sign = np.where(home, 1.0, np.where(can_leave, -1.0, 0.0))
    on_over = np.zeros(problem.n_keys, dtype=bool)
    groups = []
    for d, keys in over:
        on_over[keys] = True
        groups.append((keys, float(loads[d] - max_load)))
    elsewhere = np.flatnonzero(can_leave & ~on_over)
    spare_state = np.sort(problem.state[elsewhere])
    spare_cum = np.concatenate([[0.0], np.cumsum(spare_state)])
    base = float(problem.state[forced].sum())

    def g(mu: float) -> float:
        value = base - mu * room
        for keys, excess in groups:
            value += _signed_shed_cost(problem.load[keys],
                                       problem.state[keys] + mu * sign[keys], excess)
        n = int(np.searchsorted(spare_state, mu, side="left"))   # table keys with s < mu
        return value + float(spare_cum[n]) - mu * n

    # g is concave in mu >= 0; g(0) is the plain bound. Search mu in [0, hi], hi the
    # largest state (beyond it every table key is worth sending home in the relaxation).
    lo, hi = 0.0, float(problem.state.max()) if problem.n_keys else 0.0
    if hi <= 0:
        return plain
    best = plain
    phi = (5 ** 0.5 - 1) / 2
    a, b = lo, hi
    c, d = b - phi * (b - a), a + phi * (b - a)
    gc, gd = g(c), g(d)
    for _ in range(_MU_STEPS):
        best = max(best, gc, gd)
        if gc < gd:
            a, c, gc = c, d, gd
            d = a + phi * (b - a)
            gd = g(d)
        else:
            b, d, gd = d, c, gc
            c = b - phi * (b - a)
            gc = g(c)
    best = max(best, gc, gd, g(hi))
    return best



# --------------------------------------------------------------------------------------
# Integer knapsack-cover bound (auto and milp only)
# --------------------------------------------------------------------------------------

#: Largest number of keys on overloaded instances the cover bound models; above it the
#: combinatorial bound is reported.
COVER_MAX_KEYS = 50_000
#: Seconds HiGHS may spend per overloaded instance (at a time-out its dual bound, still
#: valid, is used).
COVER_TIME_LIMIT = 0.3
#: Seconds for all the covers of one bound; instances left when it is spent keep their
#: fractional knapsack (still valid), so the bound's cost stays small on any input.
COVER_TOTAL_SECONDS = 1.0
#: Largest instance (keys) whose cover is solved: HiGHS overruns its time limit by far on
#: one-row knapsacks of many thousand columns; larger instances keep their fractional
#: knapsack.
COVER_MAX_INSTANCE_KEYS = 5_000


def _cover_dual_bound(load: np.ndarray, state: np.ndarray, excess: float,
                      time_limit: float) -> float | None:
    """HiGHS's dual bound on min sum s_k y_k, sum c_k y_k >= excess, y binary (or None)."""
    return _cover(load, state, excess, time_limit)[0]


def _cover(load: np.ndarray, state: np.ndarray, excess: float,
           time_limit: float) -> tuple[float | None, np.ndarray | None]:
    """HiGHS on min sum s_k y_k, sum c_k y_k >= excess, y binary: its dual bound and the
    best set it found (a boolean mask; None without a primal solution)."""
    import highspy

    n = len(load)
    s_scale = float(state.max()) if n and float(state.max()) > 0 else 1.0
    c_scale = float(load.max()) if n and float(load.max()) > 0 else 1.0
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = 1
    lp.col_cost_ = state / s_scale
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.ones(n)
    lp.row_lower_ = np.array([excess / c_scale])
    lp.row_upper_ = np.array([np.inf])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.arange(n + 1, dtype=np.int32)
    lp.a_matrix_.index_ = np.zeros(n, dtype=np.int32)
    lp.a_matrix_.value_ = load / c_scale
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    h = highspy.Highs()
    for name, value in (("output_flag", False), ("threads", 1), ("random_seed", 0),
                        ("time_limit", float(time_limit)), ("mip_rel_gap", 1e-4)):
        h.setOptionValue(name, value)
    try:
        if h.passModel(lp) != highspy.HighsStatus.kOk:
            return None, None
        h.run()
        info = h.getInfo()
        bound = float(info.mip_dual_bound)
        chosen = None
        if info.primal_solution_status == 2:  # a feasible integer solution
            chosen = np.asarray(h.getSolution().col_value) > 0.5
            if float(load[chosen].sum()) < excess * (1 - CHECK_TOL):
                chosen = None
    except Exception:  # any solver failure: the caller keeps the fractional knapsack
        return None, None
    if not np.isfinite(bound):
        return None, chosen
    return bound * s_scale, chosen


def min_knapsack_cover(load: np.ndarray, state: np.ndarray, excess: float,
                       time_limit: float = COVER_TIME_LIMIT) -> np.ndarray:
    """A set of keys (mask) carrying >= ``excess`` with as little state as HiGHS finds in
    ``time_limit`` (greedy by state per load without a solution; all keys if even they
    do not carry it)."""
    if float(load.sum()) < excess:
        return np.ones(len(load), dtype=bool)
    chosen = (_cover(load, state, excess, time_limit)[1]
              if len(load) <= COVER_MAX_INSTANCE_KEYS else None)
    return chosen if chosen is not None else _greedy_cover(load, state, excess)


def _greedy_cover(load: np.ndarray, state: np.ndarray, excess: float) -> np.ndarray:
    """A set of keys carrying >= ``excess``: by increasing state per load (a mask)."""
    order = np.lexsort((-load, _ratio(state, load)))
    take = np.searchsorted(np.cumsum(load[order]), excess * (1 - LOAD_TOL)) + 1
    chosen = np.zeros(len(load), dtype=bool)
    chosen[order[:take]] = True
    return chosen


def knapsack_covers(problem: Problem, max_load: float,
                    time_limit: float = COVER_TIME_LIMIT,
                    total_seconds: float = COVER_TOTAL_SECONDS,
                    movable: np.ndarray | None = None
                    ) -> tuple[float, np.ndarray, bool] | None:
    """:func:`cover_lower_bound` and the keys that reach it: (bound in bytes, the keys to
    move: forced keys and each overloaded instance's best cover, whether every cover is
    HiGHS's own set). Instances HiGHS did not solve get a greedy cover (by increasing
    state per load), so moving the returned keys always relieves every instance; their
    state is the plan's migration if they all find room elsewhere (see
    :func:`rebalance.core.planners.auto.cover_plan`). None as for :func:`cover_lower_bound`;
    ``inf`` bound (and no keys) when a key is heavier than ``max_load``.

    ``movable`` (a boolean mask) restricts the covers to those keys, e.g. to keys that fit
    somewhere; the bound is then that of the restricted problem, **not** a lower bound
    of the problem (an instance whose movable keys cannot cover its excess gets a greedy
    cover of all its keys)."""
    if problem.n_keys == 0:
        return 0.0, np.zeros(0, dtype=np.int64), True
    if float(problem.load.max()) > max_load * (1 + LOAD_TOL):
        return float("inf"), np.zeros(0, dtype=np.int64), False
    try:
        import highspy  # noqa: F401
    except ImportError:  # pragma: no cover
        return None
    forced, loads, groups = _overloaded_keys(problem, max_load)
    bound = float(problem.state[forced].sum())
    if sum(len(keys) for _, keys in groups) > COVER_MAX_KEYS:
        return None
    moved = [np.flatnonzero(forced)]
    exact = True
    deadline = time.perf_counter() + total_seconds
    for d, keys in groups:
        every = keys
        excess = float(loads[d] - max_load)
        if movable is not None:
            keys = keys[movable[keys]]
            if float(problem.load[keys].sum()) < excess:
                keys = every  # the movable keys alone cannot relieve d
        load, state = problem.load[keys], problem.state[keys]
        frac = _shed_cost(load, state, excess)
        left = deadline - time.perf_counter()
        whole, chosen = ((_cover(load, state, excess, min(time_limit, left)))
                         if left > 0.01 and len(keys) <= COVER_MAX_INSTANCE_KEYS
                         else (None, None))
        if whole is not None:
            frac = max(frac, whole - 1e-6 * abs(whole))
        bound += frac
        if chosen is None:
            exact = False
            chosen = _greedy_cover(load, state, excess)
        moved.append(keys[chosen])
    return bound, np.sort(np.concatenate(moved)), exact


def cover_lower_bound(problem: Problem, max_load: float,
                      time_limit: float = COVER_TIME_LIMIT,
                      total_seconds: float = COVER_TOTAL_SECONDS) -> float | None:
    """The plain bound with whole keys: per overloaded instance, the 0/1 knapsack cover.

    Keys move whole, so instance d (load L_d > ``max_load``) must shed a *set* of its
    keys carrying >= L_d - max_load; the least state of such a set is a 0/1 minimum
    knapsack-cover problem. Instances shed disjoint sets, so the sum over instances (plus
    the keys that must move) bounds every assignment meeting ``max_load``, and it is never
    below the fractional knapsack of :func:`migration_lower_bound` (its LP relaxation).
    Note that the LP relaxation of the *whole* assignment problem (x[k, i] in [0, 1],
    every instance's capacity, A_max) gives the fractional bound again whenever the
    underloaded instances can absorb the excess, so integrality is what tightens it.

    Each cover is solved by HiGHS and its **dual bound** is used (valid even at the time
    limit; a primal objective would not be), minus a relative margin of 1e-6 for solver
    tolerances, and never below the fractional knapsack of that instance; instances reached
    after ``total_seconds``, or with more than :data:`COVER_MAX_INSTANCE_KEYS` keys, keep
    their fractional knapsack. Returns None
    when more than :data:`COVER_MAX_KEYS` keys sit on overloaded instances or HiGHS is
    missing, ``inf`` when a key is heavier than ``max_load``.
    """
    covers = knapsack_covers(problem, max_load, time_limit, total_seconds)
    return None if covers is None else covers[0]
