"""MinTable, MinMig and Mixed of seed 003 (Fang et al.) over one LLFD engine.

Seed 003 routes a key by a routing table A when it has an entry, else by the hash
h(k) (``problem.default``). It minimises the migrated state subject to
``max L(d) <= L_max = (1 + theta) * mean`` and ``|A'| <= A_max`` (Sec. II-B, Eq. 3).
Every algorithm runs three phases (Sec. III):

I. clean: send some table keys back to their default instance (virtually).
II. prepare: from every instance above L_max, detach keys in psi order until it is
   <= L_max; they form the candidate set C.
III. LLFD (Algorithm 1): take candidates in decreasing load; try the instances in
   increasing current load; accept when ``L + c <= L_max`` (the reading notes' fix: the
   pseudocode prints ``<``, the worked example of Fig. 4 needs ``<=``), else ADJUST:
   swap out a non-empty set E of keys on that instance, each strictly lighter than the
   candidate, chosen in psi order, such that ``L + c - c(E) <= L_max``; E joins C.

The heuristics differ in phase I and psi (Sec. III-B, III-C):

* MinTable (Alg. 2): clean every table key; psi = highest load first.
* MinMig (Alg. 3): clean nothing; psi = highest gamma(k) = c(k)^beta / S(k) first
  (S = 0: gamma = inf, the key is free to move; c = 0: gamma = 0, moving it balances
  nothing).
* Mixed (Alg. 4): clean the n table keys of smallest state, psi = gamma, and grow n while
  the table exceeds A_max (``params.max_table``).

Fixes and choices beyond the printed algorithms
-----------------------------------------------
* C is a heap (it grows while LLFD runs). A candidate that no instance accepts, even
  with ADJUST, goes to the least-loaded instance; after a cap on the candidates popped
  (:data:`LOOP_CAP_PER_RECORD` per record) ADJUST stops and every remaining candidate
  takes that fallback. ADJUST always terminates (it trades one key for strictly lighter
  ones), the cap only bounds the time.
* Mixed: the printed update ``n <- |A'| - A_max`` can cycle. n grows monotonically,
  ``n <- n + (|A'| - A_max)``, and stops at n = |A| (all table keys cleaned, as
  MinTable; after :data:`MIXED_MAX_TRIALS` trials n jumps there); if the table is still
  above A_max, MinTable itself (psi = load, the table-minimising order) is run and the
  smaller table wins.
* Keys on drained or removed instances (``problem.must_move()``) are candidates from the
  start and only active instances ever receive keys. A cleaning phase may instead send
  such a key to its default instance when that one is active (it moves either way).
* When one key is heavier than L_max no assignment meets theta; the bound LLFD packs to
  is then raised to that key's load (the least maximum any assignment can reach), so
  the other instances are not churned for nothing, and keys heavier than L_max come last
  in psi order: moving one brings no instance within L_max, so its instance sheds its
  other keys instead. The notes say so.
* Zero-load keys are never detached (they balance nothing); a zero-load key that must
  move goes to its default instance when active, else to the least-loaded one.
* Mean load is over the active instances (``problem.mean_load()``).
* Seed 003 has no migration budget (it minimises migration instead):
  ``budget_bytes``/``budget_keys`` are checked on the plan by ``finish_plan``, not
  enforced here; the notes say so. The greedy planner enforces them.

Compact representation (Sec. IV-A, IV-B)
----------------------------------------
The seed groups keys with equal (next, current, hash, cost, state) into one record with
a count, after discretising cost and state, so planning runs on records instead of
millions of keys. Here a record holds the keys with equal (current instance or "must
move", default instance, cost level, state level); the engine only ever works on
contiguous slices of records. Two differences, both in favour of accuracy:

* Levels: a value keeps the top ``bits`` bits of its binary mantissa, i.e. R = 2^bits
  linear steps inside every power-of-two octave (values of one level differ by less than
  a factor 1 + 1/R; integers below 2R keep their own level). This is the seed's
  half-linear-half-exponential grid made scale-free, so it works for measured float
  costs as well as event counts. Up to :data:`EXACT_KEYS` keys the levels are the exact
  distinct values, so the engine is the paper's key-by-key LLFD.
  ``params.extra["llfd_resolution_bits"]`` overrides the choice (None: exact).
* No estimation error: the seed keeps one representative value per record and a signed
  running error to keep sums close. Here every record keeps its keys in a fixed order
  with prefix sums of their exact loads, so every load LLFD compares with L_max is
  exact and the plan's balance is exactly what LLFD saw. Discretisation only coarsens
  the *order*: keys of one level are taken together (a partial take is the shortest
  prefix that suffices), and ADJUST treats only lower levels as "strictly lighter".

Inside a record keys go by key index, except the table keys of the gamma-ordered
planners, which go by increasing state then key index, so that "the n smallest-state
table keys" is a prefix of each of their records. Several keys of one record that fit
directly are water-filled over the least-loaded instances, which is what key-by-key
LLFD does with equal keys. Everything is deterministic: ties are broken by key index,
instance index, then record index. On 10^6 keys and 64 instances a run takes a few
tenths of a second: the records are built with numpy, the engine touches only the
records it moves.
"""

from __future__ import annotations

import heapq
from bisect import insort
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..model import PlanParams, Problem
from .base import Planner, Proposal

EXACT_KEYS = 65_536
"""Up to this many keys, levels are exact distinct values (no discretisation)."""

RESOLUTION_BITS = 3
"""Default mantissa bits of the compact levels above EXACT_KEYS: R = 8 steps per octave."""

LOOP_CAP_PER_RECORD = 16
"""Candidates popped per record (plus a constant) before ADJUST stops."""

MIXED_MAX_TRIALS = 32
"""Mixed trials before n jumps to |A|."""

_REL_TOL = 1e-12


class Psi(Enum):
    """Seed 003's key selection criterion psi (Sec. III-B)."""

    LOAD = "highest load first"
    GAMMA = "highest gamma = c^beta / S first"


# --------------------------------------------------------------------------- levels


def value_levels(values: np.ndarray, bits: int | None) -> np.ndarray:
    """Dense level of each value: equal values share a level, larger values get higher ones.

    ``bits=None`` keeps every distinct value. Otherwise a positive value keeps the top
    ``bits`` bits of its mantissa (R = 2^bits linear steps per power-of-two octave) and 0
    gets the lowest level.
    """
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    if bits is None:
        return np.unique(values, return_inverse=True)[1].reshape(-1).astype(np.int64)
    # The IEEE-754 bits of a non-negative double, read as an integer, grow with its value:
    # dropping all but the top ``bits`` mantissa bits cuts each octave into 2^bits steps.
    # abs: -0.0 has the sign bit set; + (values > 0): tiny subnormals stay apart from 0.
    code = (np.abs(values).view(np.int64) >> (52 - bits)) + (values > 0)
    code -= code.min()
    present = np.bincount(code) > 0
    return (np.cumsum(present) - 1)[code]


def resolution_bits(problem: Problem, params: PlanParams) -> int | None:
    """Mantissa bits of the compact levels: ``params.extra["llfd_resolution_bits"]`` when
    given (None = exact), else exact up to EXACT_KEYS keys and RESOLUTION_BITS above."""
    if "llfd_resolution_bits" in params.extra:
        bits = params.extra["llfd_resolution_bits"]
        return None if bits is None else int(bits)
    return None if problem.n_keys <= EXACT_KEYS else RESOLUTION_BITS


# --------------------------------------------------------------- compact representation


@dataclass(frozen=True)
class CompactKeys:
    """Keys grouped into records (seed 003 Sec. IV-A), each a slice ``order[start:stop]``.

    ``prefix[i]`` is the exact load of ``order[:i]``. A record's keys share their home
    (the instance they are on before cleaning, -1 when they must move), default
    instance, load level and state level. ``clean_positions`` are the positions in
    ``order`` of the cleanable table keys (off their default, default active) by
    increasing state then key index: cleaning n keys cleans ``clean_positions[:n]``,
    which is a prefix of each of their records. ``by_psi`` lists the records by home
    (must-move records last), then psi order: the records at home d are
    ``by_psi[home_bounds[d]:home_bounds[d + 1]]``.
    """

    order: np.ndarray
    prefix: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    level: np.ndarray
    psi_rank: np.ndarray
    home: np.ndarray
    default: np.ndarray
    clean_positions: np.ndarray
    clean_records: np.ndarray
    by_psi: np.ndarray
    home_bounds: np.ndarray
    n_instances: int
    n_levels: int
    bits: int | None

    @property
    def n_records(self) -> int:
        return len(self.start)

    @property
    def n_cleanable(self) -> int:
        return len(self.clean_positions)

    @classmethod
    def build(cls, problem: Problem, psi: Psi, beta: float, bits: int | None, max_load: float,
              candidates: np.ndarray | None = None) -> CompactKeys:
        """Records of ``problem``; keys in ``candidates`` (and those that must move) start in C.

        Keys heavier than ``max_load`` never share a record with lighter ones and come last
        in psi order.
        """
        n, k = problem.n_instances, problem.n_keys
        active = problem.active
        away = problem.must_move()
        if candidates is not None:
            away = away | np.asarray(candidates, dtype=bool)
        home_of_key = np.where(away, -1, problem.current)
        bucket = np.where(away, n, problem.current)
        cleanable = (problem.current != problem.default) & active[problem.default]
        load_level = value_levels(problem.load, bits)
        state_level = (value_levels(problem.state, bits) if psi is Psi.GAMMA
                       else np.zeros(k, dtype=np.int64))
        n_load = int(load_level.max(initial=0)) + 1
        n_state = int(state_level.max(initial=0)) + 1
        oversized = problem.load > max_load
        flags = oversized * 2 + cleanable
        code = (((bucket * n + problem.default) * 4 + flags) * n_load + load_level) * n_state \
            + state_level
        order = _record_order(code, cleanable, problem.state, psi,
                              (n + 1) * n * 4 * n_load * n_state)
        sorted_code = code[order]
        start = np.flatnonzero(np.r_[True, sorted_code[1:] != sorted_code[:-1]]) if k else \
            np.zeros(0, dtype=np.int64)
        stop = np.r_[start[1:], k].astype(np.int64)
        prefix = np.r_[0.0, np.cumsum(problem.load[order])]
        first = order[start]
        count = stop - start
        mean_load = (prefix[stop] - prefix[start]) / np.maximum(count, 1)
        mean_state = (np.add.reduceat(problem.state[order], start) / np.maximum(count, 1)
                      if k else np.zeros(0))
        psi_value = _psi_values(mean_load, mean_state, psi, beta)
        rank = np.empty(len(start), dtype=np.int64)
        rank[np.lexsort((np.arange(len(start)), -psi_value, oversized[first]))] = \
            np.arange(len(start))
        clean_positions = np.flatnonzero(cleanable[order])
        table = order[clean_positions]
        clean_positions = clean_positions[np.lexsort((table, problem.state[table]))]
        record_bucket = bucket[first]
        home_bounds = np.searchsorted(record_bucket, np.arange(n + 1), "left")
        return cls(order=order, prefix=prefix, start=start, stop=stop,
                   level=load_level[first], psi_rank=rank, home=home_of_key[first],
                   default=problem.default[first], clean_positions=clean_positions,
                   clean_records=np.searchsorted(start, clean_positions, "right") - 1,
                   by_psi=np.lexsort((rank, record_bucket)), home_bounds=home_bounds,
                   n_instances=n, n_levels=n_load, bits=bits)


def _record_order(code: np.ndarray, cleanable: np.ndarray, state: np.ndarray, psi: Psi,
                  code_span: int) -> np.ndarray:
    """Key order: by record code, inside a record by key index, except cleanable keys of
    the gamma planners, which go by increasing state then key index."""
    k = len(code)
    within = np.arange(k, dtype=np.int64)
    if psi is Psi.GAMMA and cleanable.any():
        table = np.flatnonzero(cleanable)
        within[table[np.lexsort((table, state[table]))]] = np.arange(len(table))
    shift = max(k, 1).bit_length()
    if code_span << shift < 2**63:
        return np.argsort((code << shift) | within)  # unique values: any sort is stable
    return np.lexsort((within, code))


def _psi_values(mean_load: np.ndarray, mean_state: np.ndarray, psi: Psi,
                beta: float) -> np.ndarray:
    """Value of psi per record; records are detached in decreasing value."""
    if psi is Psi.LOAD:
        return mean_load
    with np.errstate(divide="ignore", invalid="ignore"):
        gamma = np.where(mean_state > 0, mean_load ** beta / mean_state, np.inf)
    return np.where(mean_load > 0, gamma, 0.0)


# ------------------------------------------------------------------------ the engine
#
# A range is a list [psi_rank, lo, hi, rec]: the keys order[lo:hi] of record rec. Lists
# compare element-wise, so ranges sort into psi order (ties by position) with no key
# function; taking keys off the front of a range (raising lo) keeps that order.


@dataclass(frozen=True)
class LlfdOutcome:
    """Assignment of one LLFD run and what it did."""

    assignment: np.ndarray
    cleaned: int               # table keys sent back to their default instance (phase I)
    detached: int              # keys detached from instances above the bound (phase II)
    forced: int                # keys of drained/removed instances (or given) that start in C
    adjusted: int              # keys swapped out by ADJUST
    fallbacks: int             # candidate keys no instance accepted
    capped: bool               # the loop cap stopped ADJUST
    table_size: int
    moved_keys: int


class _Run:
    """Phases II and III of one trial over a CompactKeys with n table keys cleaned."""

    def __init__(self, ck: CompactKeys, problem: Problem, n_clean: int, bound: float) -> None:
        self.ck, self.problem, self.n_clean, self.bound = ck, problem, n_clean, bound
        self.limit = bound * (1 + _REL_TOL)
        self.tol = bound * _REL_TOL
        self.level = ck.level.tolist()
        self.psi = ck.psi_rank.tolist()
        cleaned = np.bincount(ck.clean_records[:n_clean], minlength=ck.n_records)
        self.split = ck.start + cleaned  # keys before split went back to their default
        self.loads, self.by_level = self._initial_loads()
        n = ck.n_instances
        self.lists: list[list[list[int]] | None] = [None] * n  # ranges per instance
        self.pending: list[list[list[int]]] = [[] for _ in range(n)]  # until lists[d] exists
        for r in np.flatnonzero(cleaned > 0).tolist():
            self.pending[int(ck.default[r])].append(
                [self.psi[r], int(ck.start[r]), int(self.split[r]), r])
        self.heap: list[tuple[int, int, int, int, int]] = []  # the candidate set C
        self.log: list[tuple[int, int, int]] = []  # placements (lo, hi, instance) in order
        self.detached = self.adjusted = self.fallbacks = self.forced = 0
        self.capped = False
        for r in np.flatnonzero((ck.home < 0) & (self.split < ck.stop)).tolist():
            self._push(int(self.split[r]), int(ck.stop[r]), r)
            self.forced += int(ck.stop[r] - self.split[r])

    def _initial_loads(self) -> tuple[np.ndarray, np.ndarray]:
        """Load per instance (inf on drained ones: they get nothing) and per (instance, load
        level) after cleaning, without the keys that must move."""
        ck, n = self.ck, self.ck.n_instances
        clean_cost = ck.prefix[self.split] - ck.prefix[ck.start]
        rest_cost = ck.prefix[ck.stop] - ck.prefix[self.split]
        stays = ck.home >= 0
        loads = np.zeros(n)
        loads += np.bincount(ck.default, clean_cost, minlength=n)
        loads += np.bincount(ck.home[stays], rest_cost[stays], minlength=n)
        loads[~self.problem.active] = np.inf
        cells = np.zeros(n * ck.n_levels)
        cells += np.bincount(ck.default * ck.n_levels + ck.level, clean_cost,
                             minlength=n * ck.n_levels)
        cells += np.bincount(ck.home[stays] * ck.n_levels + ck.level[stays], rest_cost[stays],
                             minlength=n * ck.n_levels)
        return loads, cells.reshape(n, ck.n_levels)

    def _ranges(self, d: int) -> list[list[int]]:
        """Ranges on instance d in psi order, built on first use."""
        ranges = self.lists[d]
        if ranges is None:
            recs = self.ck.by_psi[self.ck.home_bounds[d]:self.ck.home_bounds[d + 1]]
            ranges = [[p, b, e, r] for p, b, e, r in zip(
                self.ck.psi_rank[recs].tolist(), self.split[recs].tolist(),
                self.ck.stop[recs].tolist(), recs.tolist()) if b < e]
            if self.pending[d]:
                ranges += self.pending[d]
                ranges.sort()
                self.pending[d] = []
            self.lists[d] = ranges
        return ranges

    def _push(self, lo: int, hi: int, rec: int) -> None:
        """Add keys to C, ordered by decreasing load level (then psi, then position)."""
        heapq.heappush(self.heap, (-self.level[rec], self.psi[rec], lo, hi, rec))

    def _place(self, d: int, lo: int, hi: int, rec: int) -> None:
        cost = float(self.ck.prefix[hi] - self.ck.prefix[lo])
        self.loads[d] += cost
        self.by_level[d, self.level[rec]] += cost
        rng = [self.psi[rec], lo, hi, rec]
        if self.lists[d] is None:
            self.pending[d].append(rng)
        else:
            insort(self.lists[d], rng)
        self.log.append((lo, hi, d))

    def _take(self, d: int, need: float, below_level: int | None) -> int:
        """Detach keys of d in psi order into C until their load reaches ``need``.

        Only keys of levels below ``below_level`` when given (ADJUST's "strictly
        lighter"), never zero-load keys; a range is cut at the shortest prefix that
        suffices. Returns the number of keys detached.
        """
        prefix = self.ck.prefix
        ranges = self._ranges(d)
        keep: list[list[int]] = []
        taken = 0
        for i, rng in enumerate(ranges):
            if need <= self.tol:
                keep += ranges[i:]
                break
            _, lo, hi, rec = rng
            cost = float(prefix[hi] - prefix[lo])
            if cost <= 0 or (below_level is not None and self.level[rec] >= below_level):
                keep.append(rng)
                continue
            cut = hi
            if cost > need:
                cut = min(hi, lo + 1 + int(np.searchsorted(prefix[lo + 1:hi + 1],
                                                           prefix[lo] + need, "left")))
            part = float(prefix[cut] - prefix[lo])
            self._push(lo, cut, rec)
            self.loads[d] -= part
            self.by_level[d, self.level[rec]] -= part
            taken += cut - lo
            need -= part
            if cut < hi:
                rng[1] = cut
                keep.append(rng)
        self.lists[d] = keep
        return taken

    def prepare(self) -> None:
        """Phase II: detach keys in psi order from every instance above the bound."""
        for d in np.flatnonzero(self.problem.active).tolist():
            excess = float(self.loads[d]) - self.bound
            if excess > self.tol:
                self.detached += self._take(d, excess, None)

    def assign(self) -> None:
        """Phase III: LLFD over the candidate heap."""
        cap = LOOP_CAP_PER_RECORD * (self.ck.n_records + len(self.heap)) + 1024
        popped = 0
        prefix = self.ck.prefix
        while self.heap:
            neg_level, _, lo, hi, rec = heapq.heappop(self.heap)
            popped += 1
            cost = float(prefix[lo + 1] - prefix[lo])
            if cost <= 0:
                self._place(self._zero_load_target(rec), lo, hi, rec)
                continue
            least = int(np.argmin(self.loads))
            if self.loads[least] + cost <= self.limit:
                if hi - lo == 1:
                    self._place(least, lo, hi, rec)
                else:
                    self._fill(lo, hi, rec)
                continue
            if popped > cap:
                self.capped = True
                self.fallbacks += 1
                target = least
            else:
                target = self._adjust(cost, -neg_level)
            self._place(target, lo, lo + 1, rec)
            if hi > lo + 1:
                self._push(lo + 1, hi, rec)

    def _adjust(self, cost: float, level: int) -> int:
        """Instance that takes a key of ``cost`` and ``level`` no instance fits directly.

        ADJUST on the instances in increasing load: the first whose strictly lighter keys
        (lower levels) weigh enough swaps them out in psi order. When there is none the
        key falls back to the least-loaded instance.
        """
        need = self.loads + cost - self.bound
        lighter = self.by_level[:, :level].sum(axis=1)
        able = lighter >= need - self.tol
        if not able.any():
            self.fallbacks += 1
            return int(np.argmin(self.loads))
        d = int(np.argmin(np.where(able, self.loads, np.inf)))
        self.adjusted += self._take(d, float(need[d]), level)
        return d

    def _fill(self, lo: int, hi: int, rec: int) -> None:
        """Water-fill keys of one record over the least-loaded instances, as key-by-key
        LLFD does with equal keys; keys that do not fit directly go back to C."""
        prefix = self.ck.prefix
        order = np.argsort(self.loads, kind="stable")
        loads = self.loads[order]
        total = float(prefix[hi] - prefix[lo])
        # Level the water reaches when poured over the j least-loaded instances.
        levels = (total + np.cumsum(loads)) / np.arange(1, len(loads) + 1)
        filled = int(np.argmax(levels <= np.r_[loads[1:], np.inf]))
        water = min(float(levels[filled]), self.bound)
        pos = lo
        for d in order[:filled + 1].tolist():
            base = float(self.loads[d])
            # A key goes on d while d is below the water before it and fits after it.
            starts_below = int(np.searchsorted(prefix[pos:hi], prefix[pos] + (water - base),
                                               "left"))
            fits = int(np.searchsorted(prefix[pos + 1:hi + 1], prefix[pos] + (self.limit - base),
                                       "right"))
            m = min(starts_below, fits)
            if m:
                self._place(d, pos, pos + m, rec)
                pos += m
                if pos == hi:
                    return
        if pos == lo:  # water at the bound already: the front key still fits the least-loaded
            self._place(int(order[0]), lo, lo + 1, rec)
            pos += 1
        self._push(pos, hi, rec)

    def _zero_load_target(self, rec: int) -> int:
        """A zero-load key balances nothing: its default instance when active."""
        default = int(self.ck.default[rec])
        return default if self.problem.active[default] else int(np.argmin(self.loads))

    def outcome(self) -> LlfdOutcome:
        ck, problem = self.ck, self.problem
        assignment = problem.current.copy()
        cleaned_keys = ck.order[ck.clean_positions[:self.n_clean]]
        assignment[cleaned_keys] = problem.default[cleaned_keys]
        for lo, hi, d in self.log:  # in order: a key's last placement wins
            assignment[ck.order[lo:hi]] = d
        return LlfdOutcome(
            assignment=assignment, cleaned=self.n_clean, detached=self.detached,
            forced=self.forced, adjusted=self.adjusted, fallbacks=self.fallbacks,
            capped=self.capped, table_size=int((assignment != problem.default).sum()),
            moved_keys=int((assignment != problem.current).sum()))


def run_llfd(ck: CompactKeys, problem: Problem, n_clean: int, bound: float) -> LlfdOutcome:
    """Seed 003's three phases on ``ck``: clean the first ``n_clean`` cleanable keys, detach
    from instances above ``bound`` in psi order, then LLFD accepting ``L + c <= bound``."""
    run = _Run(ck, problem, n_clean, bound)
    run.prepare()
    run.assign()
    return run.outcome()


# ------------------------------------------------------------------------ planners


def packing_bound(problem: Problem, theta: float) -> tuple[float, list[str]]:
    """The load a plan aims at: L_max, or the heaviest key's load when that is above it."""
    l_max = problem.max_load(theta)
    if problem.n_keys == 0 or float(problem.load.max()) <= l_max:
        return l_max, []
    heaviest = int(np.argmax(problem.load))
    load = float(problem.load[heaviest])
    return load, [
        f"key {problem.keys[heaviest]!r} alone has load {load:.6g} > L_max = {l_max:.6g} "
        f"(theta = {theta:g} is unreachable): the plan aims at {load:.6g} instead, the least "
        "maximum load any assignment can reach"]


def describe_compact(ck: CompactKeys, n_keys: int) -> str:
    """How the keys were represented (seed 003 Sec. IV)."""
    grid = ("exact levels" if ck.bits is None
            else f"levels with R = {1 << ck.bits} steps per power-of-two octave")
    return f"compact representation: {n_keys} keys in {ck.n_records} records ({grid}; loads exact)"


def describe_outcome(out: LlfdOutcome, ck: CompactKeys, bound: float,
                     params: PlanParams) -> list[str]:
    """Why an LLFD run's assignment is what it is."""
    notes = [
        f"phase I cleaned {out.cleaned} of {ck.n_cleanable} table key(s); phase II detached "
        f"{out.detached} key(s) from instances above {bound:.6g}; {out.forced} key(s) of "
        f"drained/removed instances joined the candidates; ADJUST swapped out {out.adjusted} "
        "lighter key(s)"]
    if out.fallbacks:
        notes.append(f"{out.fallbacks} candidate key(s) fit no instance even with ADJUST: "
                     "placed on the least-loaded instance")
    if out.capped:
        notes.append("LLFD hit its loop cap: remaining candidates went to the least-loaded "
                     "instance without ADJUST")
    table = f"table {out.table_size} entries"
    if params.max_table is not None:
        table += f" (A_max {params.max_table})"
    notes.append(f"result: {out.moved_keys} key(s) move, {table}")
    if params.budget_bytes is not None or params.budget_keys is not None:
        notes.append("seed 003 minimises migration but has no migration budget: the budget is "
                     "checked on the plan, not enforced while planning")
    return notes


class _LlfdPlanner(Planner):
    """Shared set-up of the three seed 003 heuristics."""

    def _compact(self, problem: Problem, params: PlanParams, psi: Psi) -> CompactKeys:
        return CompactKeys.build(problem, psi, params.beta, resolution_bits(problem, params),
                                 problem.max_load(params.theta))


class MinTablePlanner(_LlfdPlanner):
    """Seed 003 Algorithm 2: clean the whole table, psi = highest load first."""

    name = "mintable"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        bound, notes = packing_bound(problem, params.theta)
        ck = self._compact(problem, params, Psi.LOAD)
        out = run_llfd(ck, problem, ck.n_cleanable, bound)
        return Proposal(out.assignment, [
            "MinTable (seed 003 Alg. 2): every table key goes back to its default instance, "
            "then keys are detached and placed highest load first, so few keys leave their "
            "default instance", describe_compact(ck, problem.n_keys), *notes,
            *describe_outcome(out, ck, bound, params)])


class MinMigPlanner(_LlfdPlanner):
    """Seed 003 Algorithm 3: no cleaning, psi = highest gamma first."""

    name = "minmig"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        bound, notes = packing_bound(problem, params.theta)
        ck = self._compact(problem, params, Psi.GAMMA)
        out = run_llfd(ck, problem, 0, bound)
        return Proposal(out.assignment, [
            "MinMig (seed 003 Alg. 3): the table is kept, keys are detached and swapped by "
            f"highest gamma = c^{params.beta:g} / S first, so little state moves "
            "(the table may grow)", describe_compact(ck, problem.n_keys), *notes,
            *describe_outcome(out, ck, bound, params)])


class MixedPlanner(_LlfdPlanner):
    """Seed 003 Algorithm 4: MinMig after cleaning the n smallest-state table keys, n grown
    monotonically until the table fits A_max."""

    name = "mixed"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        bound, notes = packing_bound(problem, params.theta)
        ck = self._compact(problem, params, Psi.GAMMA)
        a_max = params.max_table
        out = run_llfd(ck, problem, 0, bound)
        trials = [out]
        while a_max is not None and out.table_size > a_max and out.cleaned < ck.n_cleanable:
            n = (ck.n_cleanable if len(trials) >= MIXED_MAX_TRIALS
                 else min(ck.n_cleanable, out.cleaned + out.table_size - a_max))
            out = run_llfd(ck, problem, n, bound)
            trials.append(out)
        notes.insert(0, describe_compact(ck, problem.n_keys))
        sizes = ", ".join(f"n={t.cleaned}: {t.table_size}" for t in trials)
        if a_max is None:
            head = "Mixed (seed 003 Alg. 4) without A_max: n = 0, the MinMig plan"
        elif out.table_size <= a_max:
            head = (f"Mixed (seed 003 Alg. 4) cleaned n={out.cleaned} of {ck.n_cleanable} "
                    f"table keys (smallest state first) so the table fits A_max = {a_max}; "
                    f"table size per trial: {sizes}")
        else:
            head = (f"Mixed (seed 003 Alg. 4): even n = |A| = {ck.n_cleanable} leaves the table "
                    f"above A_max = {a_max} (table size per trial: {sizes})")
            fallback = MinTablePlanner().propose(problem, params)
            table = int((fallback.assignment != problem.default).sum())
            if table < out.table_size:
                return Proposal(fallback.assignment, [
                    head + f"; the MinTable plan has the smaller table ({table}) and is "
                    "returned", *fallback.notes])
            head += f"; the MinTable plan's table ({table}) is not smaller"
        return Proposal(out.assignment, [
            head, *notes, *describe_outcome(out, ck, bound, params)])
