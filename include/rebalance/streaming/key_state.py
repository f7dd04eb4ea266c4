"""One key's state in the keyed operator (:class:`KeyWindows`) and the window and
duplicate arithmetic around it: pure Python, unit-tested without Spark.

A key's ``perkey`` state value (``processor.PERKEY_VALUE_DDL``) is the tuple
:meth:`KeyWindows.to_state` gives: key group, default instance, assignment version,
windows (sorted starts) with their counts, sums and costs, and the ids and event times
of its events still within the watermark.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


def retention_floor(watermark: int, window_ms: int, n_windows: int) -> int:
    """The latest window start no open window's sliding aggregate needs any more.

    Window ``t`` is open while ``t + window_ms > watermark``; its sliding
    aggregate covers ``t - (n_windows - 1) * window_ms .. t``.
    """
    return watermark - n_windows * window_ms


def retained(window_start: int, watermark: int, window_ms: int, n_windows: int) -> bool:
    """Whether a window may still count in the sliding aggregate of a window that is open."""
    return window_start > retention_floor(watermark, window_ms, n_windows)


def windows_to_emit(updated: Iterable[int], held: Sequence[int], window_ms: int,
                    n_windows: int) -> list[int]:
    """Held windows whose sliding aggregate includes an updated window, sorted."""
    span = n_windows * window_ms
    marks = sorted(set(updated))
    return [t for t in held if any(u <= t < u + span for u in marks)]


def dedup_horizon(watermark: int, delay_ms: int) -> int:
    """Event time below which a key forgets event ids: an id is kept while its event time
    plus the watermark delay is at or above the watermark (``dropDuplicatesWithinWatermark``)."""
    return watermark - delay_ms


def closes_or_expires(value: tuple, closing: Collection[int], expired_up_to: int,
                      horizon: int) -> bool:
    """Whether closing windows concern a key, read from its raw ``perkey`` value without
    decoding it: it holds a closing window (a histogram row), or a window at or before
    ``expired_up_to`` (:func:`retention_floor`: pruned), or the id of
    an event before ``horizon`` (forgotten). A key for which this is False is left as it is."""
    windows = value[3] if value[3] is not None else ()
    if any(w in closing or w <= expired_up_to for w in windows):
        return True
    times = value[8] if len(value) > 8 else None
    return times is not None and not isinstance(times, float) and any(t < horizon for t in times)


def ints(values: Any) -> list[int]:
    """A state array as ints (NULL, as read from an older layout, is empty)."""
    return [] if values is None or (isinstance(values, float) and values != values) \
        else [int(v) for v in values]


def strs(values: Any) -> list[str]:
    return [] if values is None or (isinstance(values, float) and values != values) \
        else [str(v) for v in values]


@dataclass
class KeyWindows:
    """One key's state: its key group, default instance, last assignment version, and
    count / sum of value / sum of cost per window, windows sorted by start; and the ids of
    its events still within the watermark, with their event times (``dedup``)."""

    key_group: int
    default_instance: int
    version: int
    windows: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    sums: list[float] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    seen_ids: list[str] = field(default_factory=list)
    seen_times: list[int] = field(default_factory=list)

    @classmethod
    def from_state(cls, value: tuple | None, key_group: int, default_instance: int,
                   version: int) -> KeyWindows:
        """From a ``perkey`` state value, or empty when the key has no state yet."""
        if value is None:
            return cls(key_group, default_instance, version)
        kg, default, ver, windows, counts, sums, costs, *seen = value
        ids, times = (seen + [None, None])[:2]
        return cls(int(kg), int(default), int(ver), [int(w) for w in windows],
                   [int(c) for c in counts], [float(s) for s in sums], [float(c) for c in costs],
                   strs(ids), ints(times))

    def to_state(self) -> tuple:
        return (self.key_group, self.default_instance, self.version, list(self.windows),
                list(self.counts), list(self.sums), list(self.costs), list(self.seen_ids),
                list(self.seen_times))

    def remember(self, ids: Iterable[str], times: Iterable[int]) -> list[bool]:
        """For each event (id, event time ms): True when it is a duplicate (its id is held,
        or came earlier in ``ids``); the ids of the others are held from now on."""
        seen = set(self.seen_ids)
        out = []
        for event_id, when in zip(ids, times):
            duplicate = event_id in seen
            if not duplicate:
                seen.add(event_id)
                self.seen_ids.append(event_id)
                self.seen_times.append(int(when))
            out.append(duplicate)
        return out

    def forget(self, horizon: int) -> bool:
        """Drop the ids of events before ``horizon`` (:func:`dedup_horizon`); True if any."""
        keep = [i for i, t in enumerate(self.seen_times) if t >= horizon]
        if len(keep) == len(self.seen_times):
            return False
        self.seen_ids = [self.seen_ids[i] for i in keep]
        self.seen_times = [self.seen_times[i] for i in keep]
        return True

    def merge_seen(self, ids: Iterable[str], times: Iterable[int]) -> None:
        """Hold the ids of another part of the key's state too (a key split by a live switch)."""
        self.remember(ids, times)

    @property
    def empty(self) -> bool:
        """Nothing left to hold: no window and no id."""
        return not self.windows and not self.seen_ids

    def add(self, window: int, count: int, total: float, cost: float) -> None:
        """Add events of one window (inserted in start order if new)."""
        if window in self.windows:
            i = self.windows.index(window)
            self.counts[i] += count
            self.sums[i] += total
            self.costs[i] += cost
            return
        i = sum(1 for w in self.windows if w < window)
        self.windows.insert(i, window)
        self.counts.insert(i, count)
        self.sums.insert(i, total)
        self.costs.insert(i, cost)

    def window(self, window: int) -> tuple[int, float, float]:
        """(count, sum, cost) of a held window."""
        i = self.windows.index(window)
        return self.counts[i], self.sums[i], self.costs[i]

    def sliding(self, window: int, window_ms: int, n_windows: int) -> tuple[int, float]:
        """Count and sum over the ``n_windows`` windows ending at ``window``."""
        low = window - (n_windows - 1) * window_ms
        picked = [i for i, w in enumerate(self.windows) if low <= w <= window]
        return sum(self.counts[i] for i in picked), sum(self.sums[i] for i in picked)

    def prune(self, watermark: int, window_ms: int, n_windows: int) -> bool:
        """Drop windows no open window needs any more; True if something was dropped."""
        keep = [i for i, w in enumerate(self.windows)
                if retained(w, watermark, window_ms, n_windows)]
        if len(keep) == len(self.windows):
            return False
        self.windows = [self.windows[i] for i in keep]
        self.counts = [self.counts[i] for i in keep]
        self.sums = [self.sums[i] for i in keep]
        self.costs = [self.costs[i] for i in keep]
        return True
