"""Fang et al.'s synthetic workload: Zipf loads that fluctuate between intervals, and state sizes.

Pure numpy, deterministic for a seed, fast at K = 10^6 keys. Keys ``k0 .. k{K-1}`` get
Zipf(z) frequencies; each interval swaps the frequencies of random key pairs on different
instances (:func:`fluctuate`) until some instance's load changed by ``f`` mean loads. A
key's load is its expected event count per interval (no sampling noise, so planners are
compared on the model itself); :class:`rebalance.streaming.generator.EventGenerator` uses
the same frequencies (same seeds), so the streaming job sees this very workload.

State is the paper's S(k, w): a fixed cost per key plus its events over its last ``w``
intervals (``SyntheticConfig.state_window``) times a per-key record-size factor. w = 1,
the default, is the current-interval model of the evaluation package;
:data:`SLIDING_STATE_WINDOW` (w = 10) is the planner benchmark's, under which a recently
hot key still holds a lot of state, as in the paper. The model in full:
``docs/planning.md``, "Synthetic workload".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from rebalance.core.model import Problem
from rebalance.core.placement import default_instances

CHUNK = 256  # pairs drawn per round; part of the random stream, so part of the behaviour
#: The w of the sliding state window S(k, w) that the planner benchmark uses (w = 10).
SLIDING_STATE_WINDOW = 10


def zipf_weights(n_keys: int, exponent: float) -> np.ndarray:
    """Normalised Zipf weights of ranks 1..n_keys."""
    weights = 1.0 / np.arange(1, n_keys + 1, dtype=np.float64) ** exponent
    return weights / weights.sum()


def fluctuate(freq: np.ndarray, instances: np.ndarray, n_instances: int, target: float,
              rng: np.random.Generator, max_swaps: int) -> tuple[np.ndarray, float]:
    """Swap frequencies of key pairs on different instances until the largest change of an
    instance's load reaches ``target`` times the mean load.

    Returns the new frequencies and the change reached (it can stay below ``target`` when
    ``max_swaps`` pairs are not enough, e.g. with z = 0).

    Pairs are drawn ``CHUNK`` at a time from the frequencies at the start of the round
    (first key by frequency, second uniformly) and applied in order; a pair is skipped when
    both keys are on the same instance or have equal frequencies; every pair drawn counts
    towards ``max_swaps``. The same model as drawing and swapping one pair at a time, made
    fast:

    * the draw by frequency costs O(CHUNK log K), not O(K): the cumulative sum of the
      frequencies is kept from an earlier round, and a draw that lands on a key changed
      since then is redrawn among the changed keys by their current frequencies. Swaps
      only permute values among the changed keys, so their total is the same and the draw
      is exactly by the current frequencies. The sum is rebuilt when min(K/8, 8192) keys
      changed.
    * the swaps of a round are applied in runs of pairs that share no key, vectorised,
      with the instance loads after each swap taken from one cumulative sum in order.
    """
    freq = np.array(freq, dtype=np.float64, copy=True)
    instances = np.asarray(instances, dtype=np.int64)
    k = len(freq)
    base = np.bincount(instances, weights=freq, minlength=n_instances)
    loads = base.copy()
    mean = freq.sum() / n_instances
    change, tried = 0.0, 0
    cdf = changed = None
    rebuild_at = max(256, min(k // 8, 8192))
    changed_keys = np.empty(0, dtype=np.int64)
    while change < target and tried < max_swaps:
        if cdf is None or len(changed_keys) > rebuild_at:
            cdf = np.cumsum(freq)
            changed = np.zeros(k, dtype=bool)
            changed_keys = np.empty(0, dtype=np.int64)
        firsts = np.minimum(np.searchsorted(cdf, rng.random(CHUNK) * cdf[-1], side="right"), k - 1)
        seconds = rng.integers(k, size=CHUNK)
        redraw = np.flatnonzero(changed[firsts])
        if len(redraw):
            cum = np.cumsum(freq[changed_keys])
            pick = np.searchsorted(cum, rng.random(len(redraw)) * cum[-1], side="right")
            firsts[redraw] = changed_keys[np.minimum(pick, len(changed_keys) - 1)]
        cand = np.flatnonzero(instances[firsts] != instances[seconds])
        stop = False
        while len(cand):
            # The longest run of candidate pairs (from cand[0]) whose keys are all new.
            a, b = firsts[cand], seconds[cand]
            flat = np.empty(2 * len(cand), dtype=np.int64)
            flat[0::2], flat[1::2] = a, b
            _, first_idx, inv = np.unique(flat, return_index=True, return_inverse=True)
            seen_before = (first_idx[inv] // 2) < (np.arange(len(flat)) // 2)
            rep = np.flatnonzero(seen_before[0::2] | seen_before[1::2])
            run = int(rep[0]) if len(rep) else len(cand)
            ra, rb, rpos = a[:run], b[:run], cand[:run]
            fa, fb = freq[ra], freq[rb]
            ok = fa != fb
            ra, rb, rpos, fa, fb = ra[ok], rb[ok], rpos[ok], fa[ok], fb[ok]
            if len(ra):
                delta = fb - fa
                steps = np.zeros((len(ra) + 1, n_instances))
                steps[0] = loads
                rows = np.arange(1, len(ra) + 1)
                steps[rows, instances[ra]] = delta
                steps[rows, instances[rb]] = -delta
                path = np.cumsum(steps, axis=0)[1:]
                changes = np.abs(path - base).max(axis=1) / mean
                tried_at = tried + rpos + 1
                done = np.flatnonzero((changes >= target) | (tried_at >= max_swaps))
                last = int(done[0]) if len(done) else len(ra) - 1
                sa, sb = ra[:last + 1], rb[:last + 1]
                freq[sa], freq[sb] = fb[:last + 1], fa[:last + 1]
                fresh = np.concatenate([sa, sb])
                fresh = fresh[~changed[fresh]]
                changed[fresh] = True
                changed_keys = np.concatenate([changed_keys, fresh])
                loads = path[last].copy()
                change = float(changes[last])
                if len(done):
                    tried = int(tried_at[last])
                    stop = True
                    break
            cand = cand[run:]
        if stop:
            break
        tried += CHUNK
    return freq, change


def rank_frequencies(n_keys: int, exponent: float, seed: int) -> np.ndarray:
    """Interval 0: Zipf weights through the seeded random rank order."""
    order = np.random.default_rng([seed, 0]).permutation(n_keys)
    freq = np.empty(n_keys)
    freq[order] = zipf_weights(n_keys, exponent)
    return freq


def interval_rng(seed: int, interval: int) -> np.random.Generator:
    """The random stream of the fluctuation that makes ``interval`` from ``interval - 1``."""
    return np.random.default_rng([seed, 1, interval])


def state_sizes(load: np.ndarray, size_factor: np.ndarray, bytes_per_event: float,
                key_overhead: float) -> np.ndarray:
    """State bytes of keys with ``load`` events: overhead + bytes_per_event * load * factor."""
    return key_overhead + bytes_per_event * np.asarray(load, dtype=np.float64) * size_factor


@dataclass(frozen=True)
class SyntheticConfig:
    """Fang et al.'s synthetic workload (defaults: the paper's, z = 0.85, f = 1, K = 10^4, N = 15).

    The state window defaults to 1 (current-interval state, what the evaluation package
    expects); the paper's S(k, w) with its sliding window is ``state_window=
    SLIDING_STATE_WINDOW`` (10), the default of the planner benchmark's scenarios.
    """

    n_keys: int = 10_000
    zipf: float = 0.85
    n_instances: int = 15
    fluctuation: float = 1.0
    events_per_interval: float = 1_000_000.0
    bytes_per_event: float = 64.0
    key_overhead: float = 512.0
    state_sigma: float = 0.5
    #: w of the paper's S(k, w): state = the key's events over its last w intervals
    #: (1 = the current interval only; the benchmark uses SLIDING_STATE_WINDOW = 10).
    state_window: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.n_keys >= 1, "n_keys must be >= 1"),
            (self.zipf >= 0, "zipf exponent must be >= 0"),
            (self.n_instances >= 1, "n_instances must be >= 1"),
            (self.fluctuation >= 0, "fluctuation f must be >= 0"),
            (self.events_per_interval > 0, "events_per_interval must be > 0"),
            (self.bytes_per_event >= 0 and self.key_overhead >= 0, "state sizes must be >= 0"),
            (self.state_sigma >= 0, "state_sigma must be >= 0"),
            (isinstance(self.state_window, (int, np.integer)) and self.state_window >= 1,
             "state_window must be an integer >= 1"),
            (self.seed >= 0, "seed must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{message}, got {self}")


class SyntheticWorkload:
    """Loads and state of every key, interval by interval, and planning problems of them."""

    def __init__(self, config: SyntheticConfig = SyntheticConfig()) -> None:
        self.config = config
        self._freq: list[np.ndarray] = []
        self._changes: list[float] = []

    @cached_property
    def keys(self) -> np.ndarray:
        return np.array([f"k{i}" for i in range(self.config.n_keys)], dtype=object)

    @cached_property
    def default(self) -> np.ndarray:
        """Default placement of every key (key groups over jump consistent hashing)."""
        return default_instances(self.keys, self.config.n_instances)

    @cached_property
    def size_factor(self) -> np.ndarray:
        c = self.config
        if c.state_sigma == 0:
            return np.ones(c.n_keys)
        return np.random.default_rng([c.seed, 3]).lognormal(-c.state_sigma ** 2 / 2,
                                                            c.state_sigma, c.n_keys)

    def frequencies(self, interval: int) -> np.ndarray:
        c = self.config
        if interval < 0:
            raise ValueError(f"interval must be >= 0, got {interval}")
        if not self._freq:
            self._freq.append(rank_frequencies(c.n_keys, c.zipf, c.seed))
            self._changes.append(0.0)
        while len(self._freq) <= interval:
            i = len(self._freq)
            freq, change = fluctuate(self._freq[-1], self.default, c.n_instances, c.fluctuation,
                                     interval_rng(c.seed, i), max_swaps=10 * c.n_keys)
            self._freq.append(freq)
            self._changes.append(change)
        return self._freq[interval]

    def fluctuation_change(self, interval: int) -> float:
        self.frequencies(interval)
        return self._changes[interval]

    def load(self, interval: int) -> np.ndarray:
        return self.frequencies(interval) * self.config.events_per_interval

    def window_events(self, interval: int) -> np.ndarray:
        """Events of every key over the state window ending at ``interval``: the loads of
        intervals max(0, interval - w + 1) .. interval, summed (oldest first)."""
        self.frequencies(interval)
        lo = max(0, interval - self.config.state_window + 1)
        total = self.load(lo).copy()
        for j in range(lo + 1, interval + 1):
            total += self.load(j)
        return total

    def state(self, interval: int) -> np.ndarray:
        """Fang et al.'s S(k, w) at the end of ``interval``, w = state_window: the key's fixed
        cost plus its events over the window times its record size."""
        c = self.config
        return state_sizes(self.window_events(interval), self.size_factor, c.bytes_per_event,
                           c.key_overhead)

    def problem(self, interval: int, current: np.ndarray | None = None) -> Problem:
        """Interval ``interval``'s loads and state, from ``current`` (default placement if None)."""
        cur = self.default if current is None else np.asarray(current, dtype=np.int64)
        return Problem(keys=self.keys, load=self.load(interval), state=self.state(interval),
                       current=cur, default=self.default, n_instances=self.config.n_instances)
