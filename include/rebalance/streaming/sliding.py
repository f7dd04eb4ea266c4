"""The built-in job's per-key computation as a StatefulProcessor: sliding count and sum.

:class:`SlidingWindows` runs unchanged under plain ``transformWithStateInPandas`` and
under :func:`~rebalance.streaming.rebalanced.rebalanced`.
Per key it keeps the count and sum of ``value`` of the tumbling windows a sliding aggregate
over the last ``n_windows`` may still need, drops a repeated ``event_id`` within
``dedup_ms`` of the watermark (counted by
:func:`~rebalance.streaming.duplicates.count_duplicates`), and emits running rows per
micro-batch (``final = false``) and one final row per window when the watermark passes its
end (:data:`SLIDING_SCHEMA`).
Its rows and timers: ``docs/processors.md``, "Inside: routing, the host, the state layout,
the merge".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor

from rebalance.streaming.duplicates import count_duplicates
from rebalance.streaming.key_state import dedup_horizon, windows_to_emit

#: Input columns the processor reads (the typed events of the built-in job).
SLIDING_INPUT = "event_id STRING, key STRING, value DOUBLE, cost DOUBLE, event_time TIMESTAMP"
SLIDING_SCHEMA = ("key STRING, window_start TIMESTAMP, events BIGINT, count BIGINT, sum DOUBLE, "
                  "sliding_count BIGINT, sliding_sum DOUBLE, final BOOLEAN")
SLIDING_COLUMNS = [c.split()[0] for c in SLIDING_SCHEMA.split(", ")]


#: numpy type of each Spark type :data:`SLIDING_SCHEMA` uses
_NUMPY_TYPES = {"STRING": object, "TIMESTAMP": "datetime64[ms]", "BIGINT": np.int64,
                "DOUBLE": np.float64, "BOOLEAN": bool}
#: numpy types of :data:`SLIDING_SCHEMA`'s columns, in order
_DTYPES = tuple(_NUMPY_TYPES[c.split()[1]] for c in SLIDING_SCHEMA.split(", "))


def _frame(rows: list[tuple]) -> pd.DataFrame:
    """Rows of :data:`SLIDING_SCHEMA` as a frame, each column built once with its type
    (a frame's ``astype`` per call costs more than the processor's own work)."""
    columns = list(zip(*rows)) if rows else [()] * len(SLIDING_COLUMNS)
    return pd.DataFrame({name: np.array(values, dtype=dtype)
                         for name, values, dtype in zip(SLIDING_COLUMNS, columns, _DTYPES)},
                        copy=False)


class SlidingWindows(StatefulProcessor):
    """Per key: count and sum of ``value`` per window, sliding over ``n_windows`` windows."""

    def __init__(self, window_ms: int, n_windows: int, dedup_ms: int | None = None) -> None:
        if window_ms <= 0 or n_windows < 1:
            raise ValueError(f"window_ms must be > 0 and n_windows >= 1, got {window_ms}, "
                             f"{n_windows}")
        self.window_ms, self.n_windows, self.dedup_ms = int(window_ms), int(n_windows), dedup_ms

    def init(self, handle) -> None:
        self.handle = handle
        self.windows = handle.getMapState("windows", "window_start_ms BIGINT",
                                          "count BIGINT, sum DOUBLE")
        self.seen = handle.getMapState("seen", "event_id STRING", "event_time_ms BIGINT")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues) -> Iterator[pd.DataFrame]:
        frames = list(rows)
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        times = frame["event_time"].to_numpy().astype("datetime64[ms]").astype(np.int64)
        keep = np.ones(len(frame), dtype=bool)
        if self.dedup_ms is not None:
            keep = self._first_copies(frame["event_id"].to_numpy(), times,
                                      timerValues.getCurrentWatermarkInMs())
            if not keep.all():
                count_duplicates(frame[~keep])
        starts = times[keep] - times[keep] % self.window_ms
        values = frame["value"].to_numpy(dtype=float)[keep]
        if not len(starts):
            return
        held = {int(w): (int(c), float(s)) for (w,), (c, s) in self.windows.iterator()}
        added: dict[int, int] = {}
        for start in np.unique(starts):
            start = int(start)
            mine = starts == start
            count, total = held.get(start, (0, 0.0))
            if start not in held:
                self.handle.registerTimer(start + self.window_ms)
                self.handle.registerTimer(start + self.n_windows * self.window_ms)
            held[start] = (count + int(mine.sum()), total + float(values[mine].sum()))
            self.windows.updateValue((start,), held[start])
            added[start] = int(mine.sum())
        yield _frame([self._row(key[0], start, added.get(start, 0), held, final=False)
                      for start in windows_to_emit(added, sorted(held), self.window_ms,
                                                   self.n_windows)])

    def handleExpiredTimer(self, key: Any, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        ts = expiredTimerInfo.getExpiryTimeInMs()
        held = {int(w): (int(c), float(s)) for (w,), (c, s) in self.windows.iterator()}
        out = []
        closing = ts - self.window_ms
        if closing in held:
            out.append(self._row(key[0], closing, 0, held, final=True))
        # the window the timer's time no longer needs (after the final row, which may need it)
        for start in [w for w in held if w + self.n_windows * self.window_ms <= ts]:
            self.windows.removeKey((start,))
            del held[start]
        if self.dedup_ms is not None:
            self._forget(dedup_horizon(timerValues.getCurrentWatermarkInMs(), self.dedup_ms),
                         last=not held)
        if out:
            yield _frame(out)

    def close(self) -> None:
        """Nothing to release: the state lives in the state store."""

    def _row(self, key: str, start: int, events: int, held: dict[int, tuple[int, float]],
             final: bool) -> tuple:
        count, total = held[start]
        low = start - (self.n_windows - 1) * self.window_ms
        inside = [v for w, v in held.items() if low <= w <= start]
        return (key, start, events, count, total, sum(c for c, _ in inside),
                sum(s for _, s in inside), final)

    def _first_copies(self, ids: np.ndarray, times: np.ndarray, watermark: int) -> np.ndarray:
        """True for each event whose id the key has not seen (in state or earlier in the
        batch); those ids are held from now on, the ids the watermark passed forgotten."""
        self._forget(dedup_horizon(watermark, self.dedup_ms), last=False)
        keep = np.ones(len(ids), dtype=bool)
        seen: set[str] = set()
        for i, event_id in enumerate(ids):
            if event_id in seen or self.seen.containsKey((event_id,)):
                keep[i] = False
                continue
            seen.add(event_id)
            self.seen.updateValue((event_id,), (int(times[i]),))
        return keep

    def _forget(self, horizon: int, last: bool) -> None:
        """Drop the ids of events before ``horizon``; ``last`` (the key holds no window any
        more): a timer at the moment the newest id left can be forgotten."""
        newest = None
        for (event_id,), (when,) in list(self.seen.iterator()):
            if int(when) < horizon:
                self.seen.removeKey((event_id,))
            else:
                newest = max(newest or int(when), int(when))
        if last and newest is not None:
            self.handle.registerTimer(newest + self.dedup_ms + 1)
