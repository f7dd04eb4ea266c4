"""Seed 003's synthetic workload: Zipf weights, fluctuation model, state sizes."""

from __future__ import annotations

import numpy as np
import pytest

from rebalance.core.model import Problem
from rebalance.core.synthetic import (
    SyntheticConfig,
    SyntheticWorkload,
    fluctuate,
    state_sizes,
    zipf_weights,
)


def test_zipf_weights_are_normalised_and_ranked():
    w = zipf_weights(1000, 0.85)
    assert w.sum() == pytest.approx(1.0)
    assert (np.diff(w) < 0).all()
    assert w[0] / w[9] == pytest.approx(10 ** 0.85)
    assert np.allclose(zipf_weights(10, 0.0), 0.1)


def _instances(k, n, seed=2):
    return np.random.default_rng(seed).integers(0, n, k)


def test_fluctuation_reaches_the_target_and_only_permutes_frequencies():
    freq = zipf_weights(5000, 0.85)[np.random.default_rng(1).permutation(5000)]
    inst = _instances(5000, 15)
    new, change = fluctuate(freq, inst, 15, 1.0, np.random.default_rng(0), max_swaps=50_000)
    before = np.bincount(inst, weights=freq, minlength=15)
    after = np.bincount(inst, weights=new, minlength=15)
    assert change >= 1.0
    assert np.abs(after - before).max() / (1 / 15) == pytest.approx(change)
    assert np.array_equal(np.sort(new), np.sort(freq))
    assert not np.shares_memory(new, freq)


def test_fluctuation_is_deterministic_for_a_seed():
    freq = zipf_weights(3000, 1.0)
    inst = _instances(3000, 8)
    a = fluctuate(freq, inst, 8, 0.7, np.random.default_rng(5), 30_000)
    b = fluctuate(freq, inst, 8, 0.7, np.random.default_rng(5), 30_000)
    c = fluctuate(freq, inst, 8, 0.7, np.random.default_rng(6), 30_000)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]
    assert not np.array_equal(a[0], c[0])


def test_fluctuation_stops_after_max_swaps_when_unreachable():
    freq = np.full(100, 0.01)  # uniform: no swap changes anything
    new, change = fluctuate(freq, _instances(100, 4), 4, 0.5, np.random.default_rng(0), 1000)
    assert change == 0.0 and np.array_equal(new, freq)
    # reachable only in part: the change reached is returned, below the target
    freq = zipf_weights(200, 0.2)
    new, change = fluctuate(freq, _instances(200, 4), 4, 50.0, np.random.default_rng(0), 2000)
    assert 0 < change < 50.0


def test_zero_target_changes_nothing():
    freq = zipf_weights(50, 1.0)
    new, change = fluctuate(freq, _instances(50, 3), 3, 0.0, np.random.default_rng(0), 100)
    assert change == 0.0 and np.array_equal(new, freq)


def test_hot_keys_move_more_often_than_cold_ones():
    """The first key of a pair is drawn by frequency: the hottest keys change most."""
    k = 2000
    freq = zipf_weights(k, 1.2)
    inst = _instances(k, 10)
    moved_hot = moved_cold = 0
    cur = freq
    for i in range(30):
        new, _ = fluctuate(cur, inst, 10, 0.5, np.random.default_rng(i), 10 * k)
        changed = new != cur
        moved_hot += changed[np.argsort(-cur)[:20]].sum()
        moved_cold += changed[np.argsort(-cur)[-20:]].sum()
        cur = new
    assert moved_hot > 3 * moved_cold


def test_fluctuation_reaches_its_target_at_a_million_keys():
    k, n = 1_000_000, 64
    freq = zipf_weights(k, 0.85)[np.random.default_rng(1).permutation(k)]
    inst = _instances(k, n)
    _, change = fluctuate(freq, inst, n, 1.0, np.random.default_rng(0), 10 * k)
    assert change >= 1.0


def test_workload_is_deterministic_and_feeds_problems():
    cfg = SyntheticConfig(n_keys=500, n_instances=4, fluctuation=0.2, seed=3)
    w1, w2 = SyntheticWorkload(cfg), SyntheticWorkload(cfg)
    assert np.array_equal(w1.load(3), w2.load(3))
    assert np.array_equal(w1.state(3), w2.state(3))
    assert w1.load(0).sum() == pytest.approx(cfg.events_per_interval)
    assert w1.fluctuation_change(2) >= cfg.fluctuation
    p = w1.problem(2)
    assert isinstance(p, Problem) and p.n_keys == 500 and p.n_instances == 4
    assert np.array_equal(p.current, w1.default)
    assert (p.state >= cfg.key_overhead).all()
    other = SyntheticWorkload(SyntheticConfig(n_keys=500, n_instances=4, seed=4))
    assert not np.array_equal(w1.load(0), other.load(0))


def test_state_model():
    load = np.array([0.0, 10.0, 100.0])
    s = state_sizes(load, np.ones(3), bytes_per_event=64, key_overhead=512)
    assert s.tolist() == [512.0, 512.0 + 640.0, 512.0 + 6400.0]
    w = SyntheticWorkload(SyntheticConfig(n_keys=20_000, state_sigma=0.5))
    assert w.size_factor.mean() == pytest.approx(1.0, rel=0.03)
    flat = SyntheticWorkload(SyntheticConfig(n_keys=10, state_sigma=0.0))
    assert (flat.size_factor == 1.0).all()


def test_state_window_is_the_papers_sliding_window():
    """S(k, w): overhead + bytes/event x factor x the key's events over its last w
    intervals (those that exist at the start); w = 1 is the current-interval state."""
    from rebalance.core.synthetic import SLIDING_STATE_WINDOW

    assert SLIDING_STATE_WINDOW == 10
    base = dict(n_keys=300, n_instances=4, fluctuation=0.5, seed=2)
    cur = SyntheticWorkload(SyntheticConfig(**base))
    assert cur.config.state_window == 1  # the library default: current interval
    win = SyntheticWorkload(SyntheticConfig(**base, state_window=3))
    c = win.config
    for i in range(6):
        assert np.array_equal(cur.load(i), win.load(i))  # loads do not depend on w
        events = sum(win.load(j) for j in range(max(0, i - 2), i + 1))
        expect = c.key_overhead + c.bytes_per_event * events * win.size_factor
        assert np.allclose(win.state(i), expect, rtol=1e-12)
        assert np.array_equal(cur.state(i), state_sizes(cur.load(i), cur.size_factor,
                                                         c.bytes_per_event, c.key_overhead))
        assert np.allclose(win.problem(i).state, win.state(i))
    # a key that was hot keeps its state after its load moves away
    assert (win.state(5) >= cur.state(5) - 1e-9).all()
    with pytest.raises(ValueError, match="state_window"):
        SyntheticConfig(state_window=0)


def test_config_is_validated():
    with pytest.raises(ValueError, match="zipf"):
        SyntheticConfig(zipf=-1)
    with pytest.raises(ValueError, match="n_keys"):
        SyntheticConfig(n_keys=0)


def test_generator_reexports_the_model():
    from rebalance.streaming import generator

    assert generator.fluctuate is fluctuate
    assert generator.zipf_weights is zipf_weights
