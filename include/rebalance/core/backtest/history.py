"""Stored windows and policies of a backtest (:mod:`rebalance.core.backtest`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rebalance.core.forecast import LoadModel, history_needed
from rebalance.core.model import first_not_finite_or_negative

BASELINES = ("none", "stay", "oracle", "distribution-oracle")

#: theta_plan of the distribution oracle and of calibration, as fractions of theta.
HEADROOM_FRACTIONS = (1.0, 0.75, 0.5, 0.375, 0.25, 0.125)
#: Time limit of each plan of a backtest (fast planners ignore it).
BACKTEST_TIME_LIMIT = 1.0
#: Windows after the judged one the distribution oracle plans on by default.
ORACLE_WINDOWS = 3


class BacktestError(ValueError):
    """Backtest input that cannot be used, in one line."""


# --------------------------------------------------------------------------- history
@dataclass
class WindowHistory:
    """Per-window key loads and state of a stream, oldest window first.

    ``keys`` (K,), ``window_starts`` (T,), ``loads`` and ``state`` (T x K: cost and state
    bytes created per window, 0 where a key is absent), ``default`` (K,): the default
    instance of each key, ``n_instances``: N.
    """

    keys: np.ndarray
    window_starts: np.ndarray
    loads: np.ndarray
    state: np.ndarray
    default: np.ndarray
    n_instances: int

    def __post_init__(self) -> None:
        self.keys = np.asarray(self.keys, dtype=object)
        self.window_starts = np.asarray(self.window_starts)
        self.loads = np.asarray(self.loads, dtype=np.float64)
        self.state = np.asarray(self.state, dtype=np.float64)
        self.default = np.asarray(self.default, dtype=np.int64)
        k, t = len(self.keys), len(self.window_starts)
        for name in ("loads", "state"):
            arr = getattr(self, name)
            if arr.shape != (t, k):
                raise BacktestError(f"{name} must have shape (windows {t}, keys {k}), "
                                    f"got {arr.shape}")
            if (bad := first_not_finite_or_negative(arr)) is not None:
                w, j = bad
                raise BacktestError(f"{name} must be finite and >= 0: key {self.keys[j]!r} has "
                                    f"{float(arr[w, j])!r} in window {self.window_starts[w]}")
        n = self.n_instances
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise BacktestError(f"n_instances must be an integer >= 1, got {n!r}")
        self.n_instances = int(n)
        if self.default.shape != (k,) or (k and (self.default.min() < 0
                                                 or self.default.max() >= n)):
            raise BacktestError(f"default must hold one instance in [0, {n}) per key")

    @property
    def n_windows(self) -> int:
        return len(self.window_starts)

    @property
    def n_keys(self) -> int:
        return len(self.keys)

    def slice(self, start: int | None = None, stop: int | None = None) -> WindowHistory:
        """The windows [start, stop) (same keys)."""
        sl = slice(start, stop)
        return WindowHistory(self.keys, self.window_starts[sl], self.loads[sl], self.state[sl],
                             self.default, self.n_instances)

    @classmethod
    def from_histograms(cls, frame, n_instances: int) -> WindowHistory:
        """Histogram rows of ``rebalance plan`` (``window_start, key, count[, cost,
        state_bytes]``, a pandas frame or pyarrow table): every window at once."""
        from rebalance.core.histograms import window_matrices

        m = window_matrices(frame, n_instances)
        return cls(keys=m["keys"], window_starts=m["windows"].view("datetime64[ns]"),
                   loads=m["load"], state=m["state"], default=m["default"],
                   n_instances=n_instances)

    @classmethod
    def from_counts(cls, frame: pd.DataFrame, key: str = "key", window: str = "window",
                    count: str = "count", n_instances: int = 1,
                    state: str | None = None) -> WindowHistory:
        """A plain long table of (window, key, count[, state]) rows (real traces). Windows
        may be times, dates or integers (integers are read as ordinal window numbers);
        state defaults to the count."""
        missing = [c for c in (key, window, count, state) if c is not None and c not in frame]
        if missing:
            raise BacktestError(f"counts table lacks column(s) {missing}; it has "
                                f"{list(frame.columns)}")
        win = frame[window]
        if pd.api.types.is_integer_dtype(win.dtype):
            win = pd.to_datetime(win.astype("int64"), unit="D", origin="unix")
        rows = pd.DataFrame({"window_start": win, "key": frame[key].astype(str),
                             "count": frame[count]})
        if state is not None:
            rows["state_bytes"] = frame[state]
        return cls.from_histograms(rows, n_instances)


# --------------------------------------------------------------------------- policies
@dataclass(frozen=True)
class Policy:
    """How plans are made: planner ``method``, ``load_model`` over the last ``history``
    windows, planned at ``theta_plan`` (None: at theta)."""

    name: str = ""
    method: str = "mixed"
    load_model: LoadModel = field(default_factory=LoadModel)
    theta_plan: float | None = None
    history: int = 1

    def __post_init__(self) -> None:
        from rebalance.core.planner_names import METHODS

        if isinstance(self.load_model, str):
            object.__setattr__(self, "load_model", LoadModel.parse(self.load_model))
        if self.method not in METHODS:
            raise BacktestError(f"policy {self.name or self.load_model}: unknown method "
                                f"{self.method!r}; choose one of {', '.join(METHODS)}")
        h = self.history
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1:
            raise BacktestError(f"policy {self.name or self.load_model}: history must be an "
                                f"integer >= 1 windows, got {h!r}")
        if self.load_model.name != "auto" and h < history_needed(self.load_model):
            raise BacktestError(f"policy {self.name or self.load_model}: history {h} is shorter "
                                f"than load model {self.load_model} needs "
                                f"({history_needed(self.load_model)} windows)")
        tp = self.theta_plan
        if tp is not None and not (isinstance(tp, (int, float)) and math.isfinite(tp) and tp > 0):
            raise BacktestError(f"policy {self.name or self.load_model}: theta_plan must be a "
                                f"number > 0 or None, got {tp!r}")
        if not self.name:
            label = f"{self.load_model}/W={self.history}"
            if tp is not None:
                label += f"@{tp:g}"
            if self.method != "mixed":
                label += f"/{self.method}"
            object.__setattr__(self, "name", label)

    def describe(self) -> str:
        """The policy in words, for the reasons a user reads (``name`` is its label in
        tables): "plans on the mean of the last window, at theta_plan 0.05"."""
        text = f"plans on {self.load_model.describe()}"
        if self.theta_plan is not None:
            text += f", at theta_plan {self.theta_plan:g}"
        if self.method != "mixed":
            text += f", planner {self.method}"
        return text

    @classmethod
    def of(cls, model: str | LoadModel, theta_plan: float | None = None,
           method: str = "mixed", name: str = "") -> Policy:
        """A policy whose history is what the load model reads (all of its ``windows``)."""
        m = LoadModel.parse(model) if isinstance(model, str) else model
        return cls(name=name, method=method, load_model=m, theta_plan=theta_plan,
                   history=history_needed(m))
