"""The keyed stateful operator: per-key sliding windows and per-window histograms.

It runs as ``groupBy("label").transformWithStateInPandas(...)`` in event-time mode, one
grouping value per instance. Per instance it keeps ``perkey`` (each key's aggregates of the
windows it still needs, and with ``dedup`` the ids of its events within the watermark),
``perwindow`` (each open window's events, load, operator time and duplicates) and a timer
at each open window's end. It emits ``result`` rows (per key and window updated, with the
sliding count and sum over the last ``w`` windows) and, once the watermark closes a window,
its final ``key_histogram`` / ``instance_histogram`` rows. A duplicate ``event_id`` is
dropped before anything counts it and counted in its window's ``duplicates``. In full:
``docs/streaming.md``, "The operator's state and outputs" and "Duplicates"; the pure
helpers are :mod:`rebalance.streaming.key_state`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from rebalance.core.placement import default_instances
from rebalance.streaming.key_state import (
    KeyWindows,
    closes_or_expires,
    dedup_horizon,
    ints,
    retention_floor,
    strs,
    windows_to_emit,
)
from rebalance.streaming.routing import instance_labels

#: Estimated state bytes of a key besides its name: key group and default instance (INT),
#: assignment version (BIGINT).
STATE_KEY_BYTES = 16
#: Estimated state bytes per window a key holds: start, count, sum, cost (8 bytes each).
STATE_WINDOW_BYTES = 32

PERKEY_VALUE_DDL = ("key_group INT, default_instance INT, version BIGINT, windows ARRAY<BIGINT>, "
                    "counts ARRAY<BIGINT>, sums ARRAY<DOUBLE>, costs ARRAY<DOUBLE>, "
                    "seen_ids ARRAY<STRING>, seen_times ARRAY<BIGINT>")
PERWINDOW_VALUE_DDL = ("events BIGINT, load DOUBLE, task_ns BIGINT, cpu_ns BIGINT, version BIGINT, "
                       "duplicates BIGINT")

#: Output of the operator: column -> pandas dtype (nullable, so unused columns stay NULL).
OUTPUT_COLUMNS: dict[str, str] = {
    "kind": "object", "key": "object", "window_start_ms": "Int64", "instance": "Int32",
    "partition_id": "Int32", "default_instance": "Int32", "key_group": "Int32",
    "assignment_version": "Int64", "events": "Int64", "count": "Int64", "sum": "float64",
    "sliding_count": "Int64", "sliding_sum": "float64", "cost": "float64",
    "state_bytes": "Int64", "load": "float64", "task_ms": "float64", "cpu_ms": "float64",
    "keys": "Int64", "duplicates": "Int64",
    # A key's state handed over by a restart (kind HANDOFF), for its new label.
    "label": "Int32", "state_version": "Int64", "merge": "boolean", "windows": "object",
    "counts": "object", "sums": "object", "costs": "object", "seen_ids": "object",
    "seen_times": "object", "export_watermark_ms": "Int64",
}
_SPARK_TYPES = {"object": "STRING", "Int64": "BIGINT", "Int32": "INT", "float64": "DOUBLE",
                "boolean": "BOOLEAN"}
_ARRAY_TYPES = {"windows": "ARRAY<BIGINT>", "counts": "ARRAY<BIGINT>", "sums": "ARRAY<DOUBLE>",
                "costs": "ARRAY<DOUBLE>", "seen_ids": "ARRAY<STRING>",
                "seen_times": "ARRAY<BIGINT>"}
OUTPUT_DDL = ", ".join(f"{name} {_ARRAY_TYPES.get(name) or _SPARK_TYPES[dtype]}"
                       for name, dtype in OUTPUT_COLUMNS.items())

RESULT, KEY_HISTOGRAM, INSTANCE_HISTOGRAM = "result", "key_histogram", "instance_histogram"
#: Output of a restart's export (see :data:`HANDOFF_COLUMNS_DDL`): a key's state for its new
#: label, and one row per label that processed the export.
HANDOFF, EXPORTED = "handoff", "exported"

#: Rows that seed the operator's state in the first batch of a new checkpoint (a restart
#: generation, :mod:`rebalance.streaming.restart`): ``kind`` ``perkey`` (a key's
#: ``PERKEY_VALUE_DDL`` columns) or ``perwindow`` (an open window of the label's instance,
#: ``PERWINDOW_VALUE_DDL`` columns, with its timer).
INITIAL_STATE_DDL = (
    "label INT, kind STRING, key STRING, key_group INT, default_instance INT, version BIGINT, "
    "windows ARRAY<BIGINT>, counts ARRAY<BIGINT>, sums ARRAY<DOUBLE>, costs ARRAY<DOUBLE>, "
    "seen_ids ARRAY<STRING>, seen_times ARRAY<BIGINT>, "
    "window_start_ms BIGINT, events BIGINT, load DOUBLE, task_ns BIGINT, cpu_ns BIGINT, "
    "duplicates BIGINT")
PERKEY, PERWINDOW = "perkey", "perwindow"

#: State handed over inside the stream by a controlled restart that keeps its checkpoint
#: (:mod:`rebalance.streaming.restart.state`): rows of the operator's input with
#: ``handoff`` set. ``export`` (one per label, in the old generation's last batch, after
#: its events and after emitting the windows its watermark closes): the label gives away
#: every key whose instance under ``routing_keys`` / ``routing_instances`` (else the key's
#: default instance) is another one, with its events and load in the windows still open,
#: as :data:`HANDOFF` output rows (``merge``: the checkpoint followed a live switch since,
#: a key may be split; ``export_watermark_ms``: that watermark). ``in`` (the new
#: generation's first batch, before its events): the label takes the key's state,
#: merged with what it holds when ``merge`` (or the key comes twice), and adds its
#: events and load to the windows open at the export's watermark (those closed since
#: are emitted by this batch). Event rows have these columns NULL.
HANDOFF_COLUMNS_DDL = ("handoff STRING, merge BOOLEAN, state_version BIGINT, "
                       "windows ARRAY<BIGINT>, counts ARRAY<BIGINT>, sums ARRAY<DOUBLE>, "
                       "costs ARRAY<DOUBLE>, seen_ids ARRAY<STRING>, seen_times ARRAY<BIGINT>, "
                       "routing_keys ARRAY<STRING>, "
                       "routing_instances ARRAY<INT>, export_watermark_ms BIGINT")
HANDOFF_EXPORT, HANDOFF_IN = "export", "in"


def state_bytes(key: str, n_windows: int) -> int:
    """Estimated bytes key ``key`` holds in state while it keeps ``n_windows`` windows."""
    return len(key.encode("utf-8")) + STATE_KEY_BYTES + STATE_WINDOW_BYTES * n_windows


@dataclass(frozen=True)
class ProcessorSettings:
    """What the operator needs to know; validated by the job's configuration."""

    n_instances: int
    window_ms: int
    n_windows: int
    emit_histograms: bool = True
    #: Called with the cost of each group of events the operator processes (None: nothing);
    #: the benchmarks give it simulated CPU work, so an instance's time follows its load.
    work: Callable[[float], None] | None = None
    #: Drop events whose id the key saw within the watermark of ``dedup_ms`` (the delay).
    dedup: bool = False
    dedup_ms: int = 0


def output_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows as a frame with exactly :data:`OUTPUT_COLUMNS` (absent values NULL)."""
    frame = pd.DataFrame.from_records(rows, columns=list(OUTPUT_COLUMNS)).astype(OUTPUT_COLUMNS)
    arrays = list(_ARRAY_TYPES)
    if any(kind == HANDOFF for kind in frame["kind"]):
        frame[arrays] = frame[arrays].astype(object).where(frame[arrays].notna(), None)
    else:
        frame[arrays] = None        # absent, not NaN: Arrow converts None to a NULL array
    return frame


def _partition_id() -> int:
    from pyspark import TaskContext

    return TaskContext.get().partitionId()


class KeyedWindowProcessor(StatefulProcessor):
    """Sliding per-key window aggregates plus per-window key and instance histograms."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings
        labels = instance_labels(settings.n_instances)
        self.instance_of = {label: instance for instance, label in enumerate(labels)}

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.perkey = handle.getMapState("perkey", "key STRING", PERKEY_VALUE_DDL)
        self.perwindow = handle.getMapState("perwindow", "window_start_ms BIGINT",
                                            PERWINDOW_VALUE_DDL)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
        instance = self.instance_of[int(key[0])]
        frame = pd.concat(list(rows), ignore_index=True)
        watermark = timerValues.getCurrentWatermarkInMs()
        exports = None
        if "handoff" in frame.columns:
            handoff = frame["handoff"].notna()
            if handoff.any():
                rows = frame[handoff]
                self._take_over(rows[rows["handoff"] == HANDOFF_IN], watermark)
                exports = rows[rows["handoff"] == HANDOFF_EXPORT]
                frame = frame[~handoff]
        states = self._load_keys(frame)
        duplicates: dict[int, int] = {}
        if self.settings.dedup and len(frame):
            frame, duplicates = self._drop_duplicates(frame, states, watermark)
        if self.settings.work is not None:
            self.settings.work(float(frame["cost"].sum()))
        results = self._update_keys(frame, instance, states)
        self._update_windows(frame, time.perf_counter_ns() - started,
                             time.thread_time_ns() - cpu_started, duplicates)
        # windows the watermark closes are emitted before any key is given away, so that
        # their histograms still hold the moved keys
        closed = list(self._close_windows(instance, watermark))
        if exports is not None and len(exports):
            results += self._give_away(exports.iloc[0], instance, watermark)
        yield output_frame(results)
        yield from closed

    def handleInitialState(self, key: Any, initialState: pd.DataFrame,
                           timerValues: TimerValues) -> None:
        """Seed the label's state from :data:`INITIAL_STATE_DDL` rows (first batch only)."""
        for row in initialState.itertuples(index=False):
            if row.kind == PERKEY:
                self.perkey.updateValue((row.key,), (
                    int(row.key_group), int(row.default_instance), int(row.version),
                    [int(v) for v in row.windows], [int(v) for v in row.counts],
                    [float(v) for v in row.sums], [float(v) for v in row.costs],
                    strs(row.seen_ids), ints(row.seen_times)))
            elif row.kind == PERWINDOW:
                window = int(row.window_start_ms)
                dups = row.duplicates
                self.perwindow.updateValue((window,), (
                    int(row.events), float(row.load), int(row.task_ns), int(row.cpu_ns),
                    int(row.version), 0 if pd.isna(dups) else int(dups)))
                self.handle.registerTimer(window + self.settings.window_ms)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        yield from self._close_windows(self.instance_of[int(key[0])],
                                       timerValues.getCurrentWatermarkInMs())

    def close(self) -> None:
        """Nothing to release: all state lives in the state store."""

    # ------------------------------------------------------------------ handoff

    def _give_away(self, marker: Any, instance: int, watermark: int) -> list[dict[str, Any]]:
        """Export every key this label holds that the marker's routing places elsewhere."""
        routing = dict(zip(marker["routing_keys"], (int(i) for i in marker["routing_instances"])))
        version, merge = int(marker["assignment_version"]), bool(marker["merge"])
        labels = instance_labels(self.settings.n_instances)
        partition = _partition_id()
        out: list[dict[str, Any]] = []
        moved: dict[int, list] = {}
        # Only the keys are read (most stay: reading every value took 2-3 s per label at
        # 2.5 x 10^4 keys); a key's stored default instance is default_instances(key, N)
        # of the checkpoint's N, so the new routing places it without reading its value.
        keys = [key for (key,) in self.perkey.keys()]
        defaults = default_instances(keys, self.settings.n_instances) if keys else []
        for key, default in zip(keys, defaults):
            target = routing.get(key, int(default))
            if target == instance:
                continue
            state = KeyWindows.from_state(self.perkey.getValue((key,)), 0, 0, 0)
            self.perkey.removeKey((key,))
            self._shift(moved, state, -1, 0, watermark)
            out.append({"kind": HANDOFF, "key": key, "instance": target,
                        "label": labels[target], "partition_id": partition,
                        "key_group": state.key_group, "default_instance": state.default_instance,
                        "assignment_version": version, "state_version": state.version,
                        "merge": merge, "windows": state.windows, "counts": state.counts,
                        "sums": state.sums, "costs": state.costs, "seen_ids": state.seen_ids,
                        "seen_times": state.seen_times, "export_watermark_ms": watermark})
        self._apply_shift(moved)
        return out + [{"kind": EXPORTED, "instance": instance, "partition_id": partition,
                       "keys": len(out), "assignment_version": version}]

    def _take_over(self, rows: pd.DataFrame, watermark: int) -> None:
        """Take the state handed over to this label (``in`` rows)."""
        if not len(rows):
            return
        moved: dict[int, list] = {}
        repeated = (rows["key"].duplicated(keep=False).to_numpy()
                    | rows["merge"].eq(True).to_numpy())
        for row, merge in zip(rows.itertuples(index=False), repeated):
            state = KeyWindows(int(row.key_group), int(row.default_instance),
                               int(row.state_version), [int(v) for v in row.windows],
                               [int(v) for v in row.counts], [float(v) for v in row.sums],
                               [float(v) for v in row.costs], strs(row.seen_ids),
                               ints(row.seen_times))
            # the windows the exporting label took the events out of (open at ITS watermark:
            # the ones closed since then are emitted here, with the events, in this batch)
            given = getattr(row, "export_watermark_ms", None)
            self._shift(moved, state, 1, int(row.assignment_version),
                        watermark if given is None or pd.isna(given) else min(int(given), watermark))
            held = self.perkey.getValue((row.key,)) if merge else None
            if held is not None:     # the key also has state here (split by a live switch)
                mine = KeyWindows.from_state(held, 0, 0, 0)
                mine.version = max(mine.version, state.version)
                for w, c, t, k in zip(state.windows, state.counts, state.sums, state.costs):
                    mine.add(w, c, t, k)
                mine.merge_seen(state.seen_ids, state.seen_times)
                state = mine
            self.perkey.updateValue((row.key,), state.to_state())
        self._apply_shift(moved)

    def _shift(self, moved: dict[int, list], state: KeyWindows, sign: int, version: int,
               watermark: int) -> None:
        """Add (``sign`` 1) or remove (-1) a key's events and load in the open windows."""
        for w, count, cost in zip(state.windows, state.counts, state.costs):
            if w + self.settings.window_ms > watermark:
                change = moved.setdefault(int(w), [0, 0.0, 0])
                change[0] += sign * int(count)
                change[1] += sign * float(cost)
                change[2] = max(change[2], version)

    def _apply_shift(self, moved: dict[int, list]) -> None:
        """One read and write per open window whose events and load moved."""
        for w, (events, load, version) in sorted(moved.items()):
            old = self.perwindow.getValue((w,))
            if old is None:
                if events <= 0:
                    continue
                self.handle.registerTimer(w + self.settings.window_ms)
                old = (0, 0.0, 0, 0, 0, 0)
            total = int(old[0]) + events
            if total > 0 or int(old[5]):     # duplicates stay with the instance that dropped them
                self.perwindow.updateValue((w,), (max(total, 0), float(old[1]) + load,
                                                  int(old[2]), int(old[3]),
                                                  max(int(old[4]), version), int(old[5])))
            else:
                self.perwindow.removeKey((w,))

    # ------------------------------------------------------------------ per key

    def _load_keys(self, frame: pd.DataFrame) -> dict[str, KeyWindows]:
        """The state of every key of the batch (one read each)."""
        firsts = frame.drop_duplicates("key")
        return {key: KeyWindows.from_state(self.perkey.getValue((key,)), int(kg), int(default),
                                           int(version))
                for key, kg, default, version in zip(
                    firsts["key"], firsts["key_group"], firsts["default_instance"],
                    firsts["assignment_version"])}

    def _drop_duplicates(self, frame: pd.DataFrame, states: dict[str, KeyWindows],
                         watermark: int) -> tuple[pd.DataFrame, dict[int, int]]:
        """The batch without events whose id its key saw within the watermark, and the
        number dropped per window."""
        horizon = dedup_horizon(watermark, self.settings.dedup_ms)
        ids, times = frame["event_id"].to_numpy(), frame["event_time_ms"].to_numpy()
        duplicate = np.zeros(len(frame), dtype=bool)
        for key, index in frame.groupby("key", sort=False).indices.items():
            state = states[key]
            state.forget(horizon)
            duplicate[index] = state.remember(ids[index], times[index])
        if not duplicate.any():
            return frame, {}
        counts = frame.loc[duplicate, "window_start_ms"].value_counts()
        return frame[~duplicate], {int(w): int(c) for w, c in counts.items()}

    def _update_keys(self, frame: pd.DataFrame, instance: int,
                     states: dict[str, KeyWindows]) -> list[dict[str, Any]]:
        s = self.settings
        per = (frame.groupby(["key", "window_start_ms"], sort=True)
               .agg(events=("value", "size"), total=("value", "sum"), cost=("cost", "sum"),
                    key_group=("key_group", "first"),
                    default_instance=("default_instance", "first"),
                    version=("assignment_version", "max"))
               .reset_index())
        partition = _partition_id()
        out: list[dict[str, Any]] = []
        for key, group in itertools.groupby(per.itertuples(index=False), key=lambda r: r.key):
            group = list(group)
            state = states[key]
            routed_by = max(int(r.version) for r in group)   # this batch's assignment version
            state.version = max(state.version, routed_by)
            added = {int(r.window_start_ms): int(r.events) for r in group}
            for r in group:
                state.add(int(r.window_start_ms), int(r.events), float(r.total), float(r.cost))
            self.perkey.updateValue((key,), state.to_state())
            for window in windows_to_emit(added, state.windows, s.window_ms, s.n_windows):
                count, total, _ = state.window(window)
                sliding_count, sliding_sum = state.sliding(window, s.window_ms, s.n_windows)
                out.append({"kind": RESULT, "key": key, "window_start_ms": window,
                            "instance": instance, "partition_id": partition,
                            "assignment_version": routed_by,
                            "events": added.get(window, 0), "count": count, "sum": total,
                            "sliding_count": sliding_count, "sliding_sum": sliding_sum})
        return out

    # ------------------------------------------------------------------ per window

    def _update_windows(self, frame: pd.DataFrame, elapsed_ns: int, cpu_ns: int,
                        duplicates: dict[int, int]) -> None:
        """Add the batch's events, load, operator time (wall and CPU, split by events) and
        duplicates dropped to each window."""
        per = frame.groupby("window_start_ms").agg(
            events=("value", "size"), load=("cost", "sum"), version=("assignment_version", "max"))
        added = {int(w): (int(r.events), float(r.load), int(r.version))
                 for w, r in zip(per.index, per.itertuples(index=False))}
        total_events = sum(events for events, _, _ in added.values())
        for window in sorted(added.keys() | duplicates.keys()):
            events, load, version = added.get(window, (0, 0.0, 0))
            share = events / total_events if total_events else 0.0
            old = self.perwindow.getValue((window,))
            if old is None:
                self.handle.registerTimer(window + self.settings.window_ms)
                old = (0, 0.0, 0, 0, 0, 0)
            self.perwindow.updateValue((window,), (
                int(old[0]) + events, float(old[1]) + load,
                int(old[2]) + round(elapsed_ns * share), int(old[3]) + round(cpu_ns * share),
                max(int(old[4]), version), int(old[5] or 0) + duplicates.get(window, 0)))

    def _close_windows(self, instance: int, watermark: int) -> Iterator[pd.DataFrame]:
        """Emit histograms of the windows the watermark closed, then drop unneeded state."""
        s = self.settings
        closing = {int(w[0]): v for w, v in self.perwindow.iterator()
                   if int(w[0]) + s.window_ms <= watermark}
        if not closing:
            return
        partition = _partition_id()
        key_rows: list[dict[str, Any]] = []
        keys_in = dict.fromkeys(closing, 0)
        horizon = dedup_horizon(watermark, s.dedup_ms)
        for (key,), value in list(self.perkey.iterator()):
            if not closes_or_expires(value, closing,
                                     retention_floor(watermark, s.window_ms, s.n_windows),
                                     horizon):
                continue
            state = KeyWindows.from_state(value, 0, 0, 0)
            for window in sorted(closing.keys() & set(state.windows)):
                keys_in[window] += 1
                if s.emit_histograms:
                    key_rows.append(self._key_histogram(key, state, window, instance, partition))
            changed = state.prune(watermark, s.window_ms, s.n_windows)
            if state.forget(horizon):
                changed = True
            if changed:
                if not state.empty:
                    self.perkey.updateValue((key,), state.to_state())
                else:
                    self.perkey.removeKey((key,))
        instance_rows = [
            {"kind": INSTANCE_HISTOGRAM, "window_start_ms": window, "instance": instance,
             "load": float(load), "events": int(events), "keys": keys_in[window],
             "task_ms": int(task_ns) / 1e6, "cpu_ms": int(cpu_ns) / 1e6,
             "partition_id": partition, "assignment_version": int(version),
             "duplicates": int(dups or 0)}
            for window, (events, load, task_ns, cpu_ns, version, dups) in sorted(closing.items())]
        for window in closing:
            self.perwindow.removeKey((window,))
        if s.emit_histograms:
            yield output_frame(key_rows + instance_rows)

    @staticmethod
    def _key_histogram(key: str, state: KeyWindows, window: int, instance: int,
                       partition: int) -> dict[str, Any]:
        count, total, cost = state.window(window)
        return {"kind": KEY_HISTOGRAM, "key": key, "window_start_ms": window, "count": count,
                "sum": total, "cost": cost, "state_bytes": state_bytes(key, len(state.windows)),
                "instance": instance, "default_instance": state.default_instance,
                "key_group": state.key_group, "partition_id": partition,
                "assignment_version": state.version}
