"""Fang et al.'s compact representation (Sec. IV-A, IV-B) for the LLFD engine.

Keys are grouped into records that the LLFD engine
(:mod:`rebalance.core.planners.table_migration`) moves as contiguous slices, so planning
runs on records instead of millions of keys; psi (the key selection criterion) orders them.
A record holds the keys with equal (current instance or "must move", default instance, cost
level, state level). Unlike the paper's, levels are scale-free (the top ``bits`` bits of the
mantissa; the exact values up to :data:`EXACT_KEYS` keys) and every record keeps its keys'
exact loads as prefix sums, so every load LLFD compares with L_max is exact: discretisation
only coarsens the order. Details: ``docs/planning.md``, "MinTable, MinMig and Mixed: design".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from rebalance.core.model import PlanParams, Problem

EXACT_KEYS = 65_536
"""Up to this many keys, levels are exact distinct values (no discretisation)."""

RESOLUTION_BITS = 3
"""Default mantissa bits of the compact levels above EXACT_KEYS: R = 8 steps per octave."""



class Psi(Enum):
    """Fang et al.'s key selection criterion psi (Sec. III-B)."""

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
    """Mantissa bits of the compact levels: ``params.llfd_resolution_bits`` when given
    (None = exact), else (``"auto"``) exact up to EXACT_KEYS keys and RESOLUTION_BITS above."""
    bits = params.llfd_resolution_bits
    if bits != "auto":
        return None if bits is None else int(bits)
    return None if problem.n_keys <= EXACT_KEYS else RESOLUTION_BITS


# --------------------------------------------------------------- compact representation


@dataclass(frozen=True)
class CompactKeys:
    """Keys grouped into records (Fang et al., Sec. IV-A), each a slice ``order[start:stop]``.

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
