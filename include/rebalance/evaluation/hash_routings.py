"""Hash routings that are not planners: the ELB/CLB paper's baselines UHLB and PKG, and D-Choices.

None of these keeps one instance per key in a table; each routes every tuple by hash
functions of the key's integer id (:func:`key_ids`), so they live in the evaluation
harness as functions (replayed next to the planners by
:mod:`rebalance.evaluation.runner`), not in the planner registry of
:mod:`rebalance.core.planner_names` (``rebalance plan`` cannot apply a routing that splits
keys). :func:`route_by_choices` models their per-tuple greedy on histograms.

* **UHLB** (the ELB/CLB paper, Sec. 5): one hash drawn from a 2-universal family.
* **PKG** (partial key grouping, Nasir et al., arXiv 1504.00788): every key has two
  candidates h1(k), h2(k) and each tuple goes to the less-loaded one, so a key may hold a
  *partial* state on both, which a stateful operator must merge (the ELB/CLB paper, Sec. 2).
* **D-Choices / W-Choices** (Nasir et al., arXiv 1510.05714): the heavy hitters get
  d >= 2 choices (W-Choices: every instance), the other keys keep PKG's two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rebalance.core.model import PlanningError, imbalance

#: The Mersenne prime 2^31 - 1: ids below it and a, b below it keep a x + b below 2^62,
#: exact in uint64.
MERSENNE31 = (1 << 31) - 1
#: No quantum above 1/64 of the mean instance load.
DEFAULT_RESOLUTION = 64
#: Keys of up to 8 tuples are routed tuple by tuple.
DEFAULT_MIN_QUANTA = 8
#: The routings of this module, by the name the harness uses.
ROUTINGS = ("uhlb", "pkg", "dchoices", "wchoices")


@dataclass(frozen=True)
class UniversalHash:
    """h(x) = ((a x + b) mod p) mod n, one member of the Carter-Wegman family.

    p = 2^31 - 1 (a Mersenne prime), a in [1, p-1] and b in [0, p-1] drawn from a seed
    (:meth:`draw`). For x != y below p, Pr[h(x) = h(y)] <= 1/n over (a, b) (Carter and
    Wegman); ids are taken mod p. PKG's two candidates are two independent draws of the
    family; they may coincide, as in Storm's PartialKeyGrouping.
    """

    a: int
    b: int
    n: int
    p: int = MERSENNE31

    def __post_init__(self) -> None:
        if not (1 <= self.a < self.p and 0 <= self.b < self.p and self.n >= 1
                and 2 <= self.p <= MERSENNE31):
            raise PlanningError(f"universal hash needs 1 <= a < p, 0 <= b < p, n >= 1 and "
                                f"p <= 2^31 - 1, got a={self.a} b={self.b} n={self.n} "
                                f"p={self.p}")

    @classmethod
    def draw(cls, n: int, seed: int, stream: int = 0, p: int = MERSENNE31) -> UniversalHash:
        """The member for ``seed`` and ``stream`` (the j-th independent hash of a seed)."""
        rng = np.random.default_rng([int(seed), int(stream)])
        return cls(int(rng.integers(1, p)), int(rng.integers(0, p)), int(n), int(p))

    def __call__(self, ids) -> np.ndarray:
        x = np.asarray(ids).astype(np.int64) % self.p   # ids mod p (ids below p: unchanged)
        v = (np.uint64(self.a) * x.astype(np.uint64) + np.uint64(self.b)) % np.uint64(self.p)
        return (v % np.uint64(self.n)).astype(np.int64)


def key_ids(keys, key_group=None) -> np.ndarray:
    """The integer id of every key: its key group when given (the ELB/CLB paper's substream
    ids, what its UHLB hashes, h: [p] -> [n]), else Spark's Murmur3 of the key string
    (:func:`rebalance.core.placement.spark_hash_strings`) as an unsigned 32-bit integer."""
    if key_group is not None:
        ids = np.asarray(key_group).astype(np.int64)
        if len(ids) and ids.min() < 0:
            raise PlanningError("key groups must be >= 0 to serve as key ids")
        return ids
    from rebalance.core.placement import spark_hash_strings

    return spark_hash_strings(keys).view(np.uint32).astype(np.int64)


def hash_choices(ids, n_instances: int, d: int, seed: int) -> np.ndarray:
    """(K, d) candidates: column j is the j-th universal hash of ``seed`` (UHLB is column
    0, PKG columns 0 and 1); two columns of a key may coincide."""
    ids = np.asarray(ids)
    return np.stack([UniversalHash.draw(n_instances, seed, j)(ids) for j in range(d)], axis=1)


@dataclass(frozen=True, eq=False)
class ChoiceRouting:
    """Where one window's load went: per (key, instance) pair, and per instance."""

    n_keys: int
    n_instances: int
    pair_key: np.ndarray        # key index of each (key, instance) pair with load
    pair_instance: np.ndarray
    pair_load: np.ndarray

    @property
    def instance_loads(self) -> np.ndarray:
        return np.bincount(self.pair_instance, weights=self.pair_load,
                           minlength=self.n_instances)[:self.n_instances]

    @property
    def parts(self) -> np.ndarray:
        """Number of instances holding a part of each key (0: no load)."""
        return np.bincount(self.pair_key, minlength=self.n_keys)

    @property
    def split_keys(self) -> int:
        """Keys with load on two or more instances: the partial results to merge."""
        return int((self.parts >= 2).sum())

    @property
    def extra_partials(self) -> int:
        """Partial states beyond one per key."""
        return int(np.clip(self.parts - 1, 0, None).sum())

    def dense(self) -> np.ndarray:
        """(K, N) load of each key on each instance."""
        out = np.zeros((self.n_keys, self.n_instances))
        np.add.at(out, (self.pair_key, self.pair_instance), self.pair_load)
        return out

    def minor_share(self) -> np.ndarray:
        """Share of each key's load outside its largest part (0 for unsplit keys)."""
        total = np.bincount(self.pair_key, weights=self.pair_load, minlength=self.n_keys)
        major = np.zeros(self.n_keys)
        np.maximum.at(major, self.pair_key, self.pair_load)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(total > 0, 1.0 - major / total, 0.0)
        return np.clip(share, 0.0, 1.0)

    def consolidation_bytes(self, state) -> float:
        """State a consolidation step ships to merge every split key into its largest
        part, with the key's state split like its load (state grows with tuples, the ELB/CLB
        paper's Fig. 1)."""
        return float((np.asarray(state, dtype=np.float64) * self.minor_share()).sum())


def route_by_choices(load, candidates, n_instances: int,
                     resolution: int = DEFAULT_RESOLUTION,
                     min_quanta: int = DEFAULT_MIN_QUANTA) -> ChoiceRouting:
    """One window of the greedy "less-loaded candidate" routing, at histogram level.

    A histogram says how much load each key had in a window, not the order of its tuples,
    so the per-tuple greedy is modelled as follows: each key's window load is cut into q(k)
    equal quanta, spread evenly over the window (quantum j at time (j + 1/2) / q(k)); all
    quanta are taken in time order (ties: lower key index) and each goes to whichever of
    its key's candidates has the least load so far in the window (ties: the earlier
    choice, h1 before h2). q(k) is at most one per tuple (the load unit counts as one
    tuple) and otherwise at least ``min_quanta`` and at least enough that no quantum
    exceeds 1/``resolution`` of the mean instance load (heavy keys are routed in small
    pieces). A key of at most ``min_quanta`` tuples is thus routed exactly as the
    per-tuple greedy would route evenly spaced tuples; a heavier key is routed in batches
    of tuples. Loads count from the start of the window (the sources' load estimates
    restart every window) and one source sees every tuple: the best case for PKG, whose
    real sources each estimate loads locally.

    ``candidates`` is (K, d) (or (K,) for one choice); entries < 0 are unused slots.
    Deterministic: the same input gives the same routing.
    """
    load = np.asarray(load, dtype=np.float64)
    cand = np.asarray(candidates, dtype=np.int64)
    if cand.ndim == 1:
        cand = cand[:, None]
    k = len(load)
    if load.ndim != 1 or cand.ndim != 2 or cand.shape[0] != k or cand.shape[1] < 1:
        raise PlanningError(f"candidates must be (K, d) with K = {k}, got {cand.shape}")
    if not np.isfinite(load).all() or (load < 0).any():
        raise PlanningError("loads must be finite and >= 0")
    if (cand[:, 0] < 0).any() or (cand >= n_instances).any():
        raise PlanningError(f"candidates must be within [0, {n_instances}) (first choice "
                            f"always set)")
    if resolution < 1 or min_quanta < 1:
        raise PlanningError("resolution and min_quanta must be >= 1")
    active = np.flatnonzero(load > 0)
    empty = np.zeros(0, dtype=np.int64)
    if not len(active):
        return ChoiceRouting(k, n_instances, empty, empty, np.zeros(0))
    single = (cand[active] == cand[active, :1]) | (cand[active] < 0)
    if single.all():   # one choice per key (UHLB): nothing to decide
        return ChoiceRouting(k, n_instances, active, cand[active, 0], load[active])
    a_load = load[active]
    unit = float(a_load.sum()) / (n_instances * resolution)
    tuples = np.maximum(1, np.rint(a_load)).astype(np.int64)
    q = np.maximum(np.ceil(a_load / unit - 1e-9).astype(np.int64), min_quanta)
    q = np.clip(np.minimum(q, tuples), 1, None)
    local = np.repeat(np.arange(len(active)), q)
    first = np.cumsum(q) - q
    j = np.arange(len(local)) - np.repeat(first, q)
    order = np.lexsort((local, (j + 0.5) / q[local]))
    seq = local[order]
    sizes = (a_load / q)[seq].tolist()
    choices = [tuple(dict.fromkeys(int(c) for c in row if c >= 0)) for row in cand[active]]
    loads = [0.0] * n_instances
    chosen = []
    append = chosen.append
    for key, w in zip(seq.tolist(), sizes):
        c = choices[key]
        if len(c) == 1:
            b = c[0]
        elif len(c) == 2:
            b = c[1] if loads[c[1]] < loads[c[0]] else c[0]
        else:
            b = min(c, key=loads.__getitem__)   # the first of equal minima
        loads[b] += w
        append(b)
    pair = active[seq] * n_instances + np.asarray(chosen, dtype=np.int64)
    uniq, inverse = np.unique(pair, return_inverse=True)
    pair_load = np.bincount(inverse, weights=(a_load / q)[seq], minlength=len(uniq))
    return ChoiceRouting(k, n_instances, uniq // n_instances, uniq % n_instances, pair_load)


class ChoiceRouter:
    """One of :data:`ROUTINGS` over fixed key ids and N instances.

    ``route(load, reference)`` routes one window. D-Choices and W-Choices pick their heavy
    hitters (share of ``reference`` above ``head_share``, default 1/(5N)) on the previous
    window, as a planner plans on it. D-Choices tunes d on ``reference`` (our rule, after
    D-Choices' "d tuned automatically" to the least replication that balances): the
    smallest d >= max(2, ceil(p1 N)) (p1 the top key's share: below that its load cannot
    fit under the mean) whose routing of ``reference`` has max/mean <= 1 + ``theta``;
    N instances if none does (W-Choices). :attr:`last_d` is the d chosen for the last window.
    """

    def __init__(self, name: str, ids, n_instances: int, seed: int = 0,
                 theta: float = 0.1, head_share: float | None = None,
                 resolution: int = DEFAULT_RESOLUTION,
                 min_quanta: int = DEFAULT_MIN_QUANTA) -> None:
        if name not in ROUTINGS:
            raise PlanningError(f"unknown routing {name!r}; choose from {', '.join(ROUTINGS)}")
        self.name = name
        self.ids = np.asarray(ids)
        self.n = int(n_instances)
        self.seed = int(seed)
        self.theta = float(theta)
        self.head_share = 1.0 / (5 * self.n) if head_share is None else float(head_share)
        self.resolution, self.min_quanta = int(resolution), int(min_quanta)
        self.base = hash_choices(self.ids, self.n, 1 if name == "uhlb" else 2, self.seed)
        self.last_d = self.base.shape[1]

    def _route(self, load, cand) -> ChoiceRouting:
        return route_by_choices(load, cand, self.n, self.resolution, self.min_quanta)

    def candidates(self, reference=None) -> np.ndarray:
        """(K, d) candidates for the next window, given the previous one."""
        if self.name in ("uhlb", "pkg") or reference is None:
            self.last_d = self.base.shape[1]
            return self.base
        ref = np.asarray(reference, dtype=np.float64)
        total = float(ref.sum())
        head = np.flatnonzero(ref > self.head_share * total) if total > 0 else []
        if not len(head):
            self.last_d = 2
            return self.base
        if self.name == "wchoices":
            return self._with_head(head, self.n)
        p1 = float(ref.max()) / total
        for d in range(min(self.n, max(2, math.ceil(p1 * self.n - 1e-9))), self.n + 1):
            cand = self._with_head(head, d)
            if imbalance(self._route(ref, cand).instance_loads) <= 1 + self.theta:
                return cand
        return cand

    def _with_head(self, head: np.ndarray, d: int) -> np.ndarray:
        d = min(d, self.n)
        cand = np.full((len(self.ids), max(d, 2)), -1, dtype=np.int64)
        cand[:, :2] = self.base
        cand[head] = (np.arange(d) if d == self.n     # every instance (as W-Choices)
                      else hash_choices(self.ids[head], self.n, d, self.seed))
        self.last_d = d
        return cand

    def route(self, load, reference=None) -> ChoiceRouting:
        return self._route(load, self.candidates(reference))
