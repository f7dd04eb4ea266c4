"""Workloads for the evaluation harness, as dense traces.

A :class:`Trace` holds, for every key and every interval (window) t = 0..I-1, the load
``c_t(k)`` and the state bytes ``s_t(k)`` created in that window, together with the
default placement h(k) and the assignment in force at t = 0. The replay loop
(:mod:`rebalance.evaluation.runner`) plans interval t from window t-1 and every planner
sees exactly the same numbers. The workloads: :func:`zipf_trace` (Fang et al., Sec. V:
Zipf keys with the paper's fluctuation model, from :mod:`rebalance.core.synthetic`),
:func:`substream_trace` (the ELB/CLB paper, Sec. 5.1: p substreams with a Gaussian or
Zipf load shape), :func:`perturbation_trace` (Madsen et al., Sec. 5.1: G key groups, some
nodes perturbed every interval) and :func:`histogram_trace` (a histogram table of the
streaming job, so recorded traces can be replayed). Each in full: ``docs/evaluation.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rebalance.core.model import PlanningError


@dataclass(frozen=True, eq=False)
class Trace:
    """Per-interval load and state of every key, with default and initial placement."""

    name: str
    keys: np.ndarray            # K keys (str)
    load: np.ndarray            # I x K load per window
    state: np.ndarray           # I x K state bytes created per window
    n_instances: int
    default: np.ndarray         # K default instance h(k)
    initial: np.ndarray         # K assignment in force at interval 0
    key_group: np.ndarray | None = None   # K key group (substreams, MILP groups); None: hash groups
    info: dict[str, Any] = field(default_factory=dict)
    state_is_snapshot: bool = False   # state[t]: held at the close of t (else created in t)

    def __post_init__(self) -> None:
        k = len(self.keys)
        load = np.asarray(self.load, dtype=np.float64)
        state = np.asarray(self.state, dtype=np.float64)
        if load.ndim != 2 or load.shape[1] != k or state.shape != load.shape:
            raise PlanningError(f"trace {self.name!r}: load and state must be (I, {k}), got "
                                f"{load.shape} and {state.shape}")
        if load.shape[0] < 2:
            raise PlanningError(f"trace {self.name!r} needs at least 2 intervals to replay, "
                                f"got {load.shape[0]}")
        object.__setattr__(self, "keys", np.asarray(self.keys, dtype=object))
        object.__setattr__(self, "load", load)
        object.__setattr__(self, "state", state)
        for name in ("default", "initial"):
            arr = np.asarray(getattr(self, name), dtype=np.int64)
            if arr.shape != (k,):
                raise PlanningError(f"trace {self.name!r}: {name} must have {k} entries")
            object.__setattr__(self, name, arr)

    @property
    def n_intervals(self) -> int:
        return int(self.load.shape[0])

    @property
    def n_keys(self) -> int:
        return len(self.keys)


# ------------------------------------------------------------------- Zipf (Fang et al.)

def zipf_trace(n_keys: int = 10_000, n_instances: int = 15, intervals: int = 6,
               zipf: float = 0.85, fluctuation: float = 1.0, seed: int = 0,
               **config: Any) -> Trace:
    """Fang et al.'s synthetic workload from :class:`rebalance.core.synthetic.SyntheticWorkload`.

    Loads are the generator's expected event counts; state is what a key holds at the end
    of an interval (a snapshot, S(k, w) with w = one interval). Keys start on their
    default (hash) instance, so the routing table is empty. ``config`` passes further
    :class:`~rebalance.core.synthetic.SyntheticConfig` fields.
    """
    from rebalance.core.synthetic import SyntheticConfig, SyntheticWorkload

    cfg = SyntheticConfig(n_keys=n_keys, zipf=zipf, n_instances=n_instances,
                          fluctuation=fluctuation, seed=seed, **config)
    work = SyntheticWorkload(cfg)
    load = np.stack([work.load(t) for t in range(intervals)])
    state = np.stack([work.state(t) for t in range(intervals)])
    info = dict(workload="zipf", K=n_keys, N=n_instances, z=zipf, f=fluctuation,
                fluctuation_reached=[round(work.fluctuation_change(t), 4)
                                     for t in range(intervals)])
    return Trace(f"zipf(K={n_keys},N={n_instances},z={zipf},f={fluctuation})", work.keys,
                 load, state, n_instances, work.default, work.default.copy(), None, info,
                 state_is_snapshot=True)


# ------------------------------------------------------- substreams (the ELB/CLB paper)

def substream_trace(distribution: str = "zipf", n_substreams: int = 100,
                    n_instances: int = 10, intervals: int = 120, rate: float = 10_000.0,
                    window_seconds: float = 60.0, zipf: float = 1.0, sigma: float | None = None,
                    drift: float = 0.3, rho: float = 0.8, factors: int = 4,
                    state_per_tuple: float = 0.1, seed: int = 0) -> Trace:
    """The ELB/CLB paper's synthetic streams S1 (Gaussian) and S2 (Zipf) over ``p`` substreams.

    The partition key a1 in [1, p] is Gaussian (mean (p+1)/2, ``sigma`` = p/6 by default)
    or Zipf (exponent ``zipf`` over a random ranking of the values); both give the same
    mean histogram count. Tuples arrive by a Poisson process of ``rate`` per second, so a
    window of ``window_seconds`` holds Poisson(rate * window) tuples. The paper says the
    streams "simulate the fluctuation of data rate and the change of data distribution"
    without a model; ours: each substream's intensity is multiplied by exp(x_t), x an AR(1)
    process (``rho``) driven by one of ``factors`` shared latent factors (70 %) and its
    own noise (30 %), standard deviation ``drift``, so substreams of one factor are
    correlated (what CLB exploits). State is ``state_per_tuple`` per tuple (the paper's
    Fig. 1: state = one tenth of the data rate). Substreams are the key groups and start
    round-robin over the instances (their default).
    """
    rng = np.random.default_rng(seed)
    p = int(n_substreams)
    values = np.arange(1, p + 1, dtype=np.float64)
    if distribution == "gaussian":
        s = sigma if sigma is not None else p / 6.0
        base = np.exp(-0.5 * ((values - (p + 1) / 2.0) / s) ** 2)
    elif distribution == "zipf":
        base = np.empty(p)
        base[rng.permutation(p)] = 1.0 / values ** zipf
    else:
        raise PlanningError(f"distribution must be 'gaussian' or 'zipf', got {distribution!r}")
    base /= base.sum()
    group = rng.integers(0, max(1, factors), size=p)
    shared = np.zeros(max(1, factors))
    own = np.zeros(p)
    load = np.empty((intervals, p))
    innov = np.sqrt(1.0 - rho ** 2)
    for t in range(intervals):
        shared = rho * shared + innov * rng.standard_normal(len(shared))
        own = rho * own + innov * rng.standard_normal(p)
        x = drift * (np.sqrt(0.7) * shared[group] + np.sqrt(0.3) * own)
        share = base * np.exp(x)
        share /= share.sum()
        total = rng.poisson(rate * window_seconds)
        load[t] = rng.poisson(total * share)
    keys = np.array([f"s{i:03d}" for i in range(1, p + 1)], dtype=object)
    home = np.arange(p) % n_instances
    info = dict(workload=f"substreams-{distribution}", p=p, N=n_instances, rate=rate,
                window_seconds=window_seconds, drift=drift, rho=rho, factors=factors)
    return Trace(f"{distribution}(p={p},N={n_instances})", keys, load, state_per_tuple * load,
                 n_instances, home, home.copy(), np.arange(p), info)


# ---------------------------------------------------------- perturbations (Madsen et al.)

def perturbation_trace(n_instances: int = 20, n_groups: int = 400, intervals: int = 4,
                       varies: float = 0.4, share: float = 0.2, spread: float = 0.05,
                       seed: int = 0) -> Trace:
    """Madsen et al.'s synthetic setting (Sec. 5.1), one perturbation per interval.

    Groups are evenly allocated (group g on node g mod N) and each has load
    1 +/- U(``spread``). Each interval ``share`` of the nodes (of the initial allocation)
    are picked at random: half lose, half gain 0.5 * ``varies`` of their load, through a
    random half of their key groups (clipped at zero). Perturbations are drawn from the
    base loads each interval, so all planners see the same data. Every group has state
    1 (the paper's experiments budget the number of migrations, mc_k = 1).
    """
    if not 0 < share <= 1:
        raise PlanningError(f"share of perturbed nodes must be in (0, 1], got {share}")
    rng = np.random.default_rng(seed)
    g = int(n_groups)
    home = np.arange(g) % n_instances
    base = 1.0 + rng.uniform(-spread, spread, size=g)
    members = [np.flatnonzero(home == d) for d in range(n_instances)]
    n_pert = max(2, int(round(share * n_instances)))
    load = np.empty((intervals, g))
    for t in range(intervals):
        cur = base.copy()
        nodes = rng.choice(n_instances, size=min(n_pert, n_instances), replace=False)
        for j, d in enumerate(nodes):
            sign = -1.0 if j < len(nodes) // 2 else 1.0
            grp = members[d]
            if len(grp) == 0:
                continue
            pick = rng.choice(grp, size=max(1, len(grp) // 2), replace=False)
            delta = sign * 0.5 * varies * float(base[grp].sum())
            cur[pick] = np.maximum(0.0, cur[pick] + delta * base[pick] / base[pick].sum())
        load[t] = cur
    keys = np.array([f"g{i:05d}" for i in range(g)], dtype=object)
    info = dict(workload="perturbation", N=n_instances, G=g, varies=varies,
                share=share)
    return Trace(f"perturb(N={n_instances},G={g},varies={varies})", keys, load,
                 np.ones((intervals, g)), n_instances, home, home.copy(), np.arange(g), info)


# --------------------------------------------------------------------------- histograms

def histogram_trace(frame, n_instances: int, name: str = "histograms") -> Trace:
    """A trace from histogram rows (pandas frame or pyarrow table): one interval per
    distinct window_start.

    Every window is aggregated at once by :func:`rebalance.core.histograms.window_matrices`,
    the same aggregation as ``rebalance plan`` and the DAG (rows of a (window, key)
    merged: cost summed, state the maximum; keys in byte order), so window t gives the
    load and state that :func:`rebalance.core.histograms.problem_from_histograms` gives for
    that window's rows alone, and a key absent from a window has no load and no state
    there. The table reports the state a key holds at each window close, so the trace's
    state is a snapshot (``state_is_snapshot``): the replay takes the latest window's,
    never a sum. Keys start on their default instance.
    """
    from rebalance.core.histograms import _iso, window_matrices

    m = window_matrices(frame, n_instances)
    windows = m["windows"]
    if len(windows) < 2:
        raise PlanningError(f"histogram table has {len(windows)} window(s); replay needs >= 2")
    keys = m["keys"]
    info = dict(workload="replay", N=n_instances, windows=len(windows), K=len(keys),
                first_window=_iso(int(windows[0]), sep=" "),
                last_window=_iso(int(windows[-1]), sep=" "))
    return Trace(name, keys, m["load"], m["state"], n_instances, m["default"],
                 m["default"].copy(), None, info, state_is_snapshot=True)
