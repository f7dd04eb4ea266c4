"""The operator that runs a user's StatefulProcessor, one instance per grouping value.

:class:`InstanceHost` is what Spark runs (``groupBy(label).transformWithStateInPandas``,
instance i in partition i): it hands the user's processor one key at a time, with that
key's rows, state and timers (:class:`~rebalance.streaming.keyed_state.KeyScope`), making
the calls Spark would make under ``groupBy(key)``. It also emits the histogram rows of
closed windows and, for a move (:mod:`rebalance.streaming.rebalanced`), the moved keys'
state as ``handoff`` rows. The calls, the outputs and the handoff: ``docs/processors.md``,
"Inside: routing, the host, the state layout, the merge".
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from rebalance.core.placement import default_instances
from rebalance.streaming.duplicates import collecting
from rebalance.streaming.keyed_state import KeyScope
from rebalance.streaming.routing import instance_labels

#: Output row kinds (column ``rb_kind``).
OUT, KEY_ROW, INSTANCE_ROW, HANDOFF, EXPORTED = "out", "key", "instance", "handoff", "exported"
#: Control row kinds (input column ``rb_control``).
EXPORT, IN = "export", "in"

#: Columns the host adds to the operator's input (besides the user's columns).
HOST_INPUT = StructType([
    StructField("rb_label", IntegerType()), StructField("rb_key", StringType()),
    StructField("rb_window", LongType()), StructField("rb_cost", DoubleType()),
    StructField("rb_version", LongType()), StructField("rb_default", IntegerType()),
    StructField("rb_group", IntegerType()), StructField("rb_control", StringType()),
    StructField("rb_payload", BinaryType()),
    StructField("rb_routing_keys", ArrayType(StringType())),
    StructField("rb_routing_instances", ArrayType(IntegerType()))])
#: Columns the host adds to the operator's output (besides the user's output columns).
HOST_OUTPUT = StructType([
    StructField("rb_kind", StringType()), StructField("rb_key", StringType()),
    StructField("rb_window", LongType()), StructField("rb_instance", IntegerType()),
    StructField("rb_partition", IntegerType()), StructField("rb_default", IntegerType()),
    StructField("rb_group", IntegerType()), StructField("rb_version", LongType()),
    StructField("rb_events", LongType()), StructField("rb_cost", DoubleType()),
    StructField("rb_bytes", LongType()), StructField("rb_keys", LongType()),
    StructField("rb_task_ms", DoubleType()), StructField("rb_cpu_ms", DoubleType()),
    StructField("rb_label", IntegerType()), StructField("rb_payload", BinaryType()),
    StructField("rb_duplicates", LongType())])
HOST_OUTPUT_NAMES = HOST_OUTPUT.fieldNames()

_WINDOW_VALUE = StructType([
    StructField("keys", ArrayType(StringType())), StructField("events", ArrayType(LongType())),
    StructField("costs", ArrayType(DoubleType())), StructField("bytes", ArrayType(LongType())),
    StructField("defaults", ArrayType(IntegerType())),
    StructField("groups", ArrayType(IntegerType())), StructField("version", LongType()),
    StructField("task_ns", LongType()), StructField("cpu_ns", LongType())])


@dataclass(frozen=True)
class HostSettings:
    """What the host needs besides the user's processor."""

    key_column: str
    key_type: DataType
    user_columns: tuple[str, ...]
    output_columns: tuple[str, ...]
    time_mode: str
    n_instances: int
    labels: tuple[int, ...]
    window_ms: int
    #: False for a processor whose partial results merge: a move hands no state over
    #: (each instance keeps its part of a key; :mod:`rebalance.streaming.merge`)
    moves_state: bool = True


def _native(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else -1


class InstanceHost(StatefulProcessor):
    """Runs ``processor`` per key inside the operator's per-instance groups."""

    def __init__(self, processor: StatefulProcessor, settings: HostSettings) -> None:
        self.processor = processor
        self.settings = settings
        self.instance_of = {label: i for i, label in enumerate(settings.labels)}

    # ------------------------------------------------------------------ Spark's calls

    def init(self, handle) -> None:
        self.handle = handle
        self.scope = KeyScope(handle, self.settings.key_type, self.settings.time_mode,
                              shared_timer=self._window_timer)
        self.windows = handle.getMapState("h:windows", "window_start BIGINT", _WINDOW_VALUE)
        # apart from h:windows, so that a checkpoint written before it was kept resumes
        self.duplicates = handle.getMapState("h:duplicates", "window_start BIGINT",
                                             "rows BIGINT")
        self.processor.init(self.scope)
        self.scope.seal()             # the processor's variables declared: their MapStates

    def close(self) -> None:
        self.processor.close()

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
        instance = self.instance_of[int(key[0])]
        frame = pd.concat(list(rows), ignore_index=True)
        control = frame["rb_control"].notna()
        exports = frame[frame["rb_control"] == EXPORT] if control.any() else None
        if control.any():
            for payload in frame.loc[frame["rb_control"] == IN, "rb_payload"]:
                yield from self._take_over(pickle.loads(payload), instance, timerValues)
            frame = frame[~control]
        now = self._now(timerValues)
        sizes: dict[str, int] = {}
        s = self.settings
        batch_ms = timerValues.getCurrentProcessingTimeInMs()
        outs: list[tuple[pd.DataFrame, Any]] = []
        # the rows ordered by key once (stable: a key's rows keep their order), each key's
        # rows then a slice (a take per key cost twice as much); keys in order of first
        # appearance; a null key's code is -1, outside every slice, as groupBy drops it
        codes, values = pd.factorize(frame[s.key_column], sort=False)
        order = np.argsort(codes, kind="stable")
        ordered = frame[list(s.user_columns)].take(order)
        names = frame["rb_key"].to_numpy()[order]
        codes = codes[order]
        bounds = np.searchsorted(codes, np.arange(len(values) + 1))  # key i: [b[i], b[i+1])
        duplicate = np.zeros(len(frame), dtype=bool)    # rows the processor counted as such
        for value, lo, hi in zip(values, bounds[:-1], bounds[1:]):
            value = _native(value)
            self.scope.enter(value, batch_ms)
            with collecting(hi - lo) as dropped:
                outs += [(out, value) for out in self.processor.handleInputRows(
                    (value,), iter([ordered.iloc[lo:hi].reset_index(drop=True)]), timerValues)]
            if dropped:
                duplicate[order[lo + dropped[0]]] = True
            sizes[names[lo]] = self.scope.state_bytes()
        if outs:
            yield self._user_rows(outs, instance)
        self._count(frame, duplicate, sizes, now, time.perf_counter_ns() - started,
                    time.thread_time_ns() - cpu_started)
        if exports is not None and len(exports):
            yield from self._give_away(exports.iloc[0], instance, timerValues)
        self.scope.flush_all()

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        ts = expiredTimerInfo.getExpiryTimeInMs()
        instance = self.instance_of[int(key[0])]
        outs: list[tuple[pd.DataFrame, Any]] = []
        for value in self.scope.keys_due(ts):
            self.scope.enter(value, timerValues.getCurrentProcessingTimeInMs())
            if self.scope.take_timer(ts):
                outs += [(out, value) for out in self.processor.handleExpiredTimer(
                    (value,), timerValues, ExpiredTimerInfo(ts))]
        self.scope.flush_all()
        if outs:
            yield self._user_rows(outs, instance)
        # a histogram window's own timer is its end: it closes that window alone
        window = ts - self.settings.window_ms
        held = self.windows.getValue((window,))
        if held is not None:
            yield from self._close_window(instance, window, held)

    def _window_timer(self, ts: int) -> bool:
        """Whether the instance timer at ``ts`` is also a histogram window's end."""
        window_ms = self.settings.window_ms
        return int(ts) % window_ms == 0 and self.windows.containsKey((int(ts) - window_ms,))

    # ------------------------------------------------------------------ outputs

    def _now(self, timerValues: TimerValues) -> int:
        if self.settings.time_mode.lower() == "eventtime":
            return timerValues.getCurrentWatermarkInMs()
        return timerValues.getCurrentProcessingTimeInMs()

    def _user_rows(self, outs: list[tuple[pd.DataFrame, Any]], instance: int) -> pd.DataFrame:
        """The user's rows of one call (frames with the key that emitted each), as one
        frame with the key (its string form) and the instance that emitted them (what a
        merge of a split key's partial results groups by)."""
        frame = pd.concat([out for out, _ in outs], ignore_index=True).reindex(
            columns=list(self.settings.output_columns))
        host = pd.DataFrame(None, index=frame.index, columns=HOST_OUTPUT_NAMES, dtype=object)
        host["rb_kind"] = OUT
        host["rb_key"] = np.repeat([str(value) for _, value in outs],
                                   [len(out) for out, _ in outs])
        host["rb_instance"] = instance
        return pd.concat([frame, host], axis=1)

    @staticmethod
    def _host_rows(rows: list[dict[str, Any]], output_columns) -> pd.DataFrame:
        frame = pd.DataFrame.from_records(rows, columns=HOST_OUTPUT_NAMES)
        frame = frame.astype(object).where(frame.notna(), None)
        for name in output_columns:
            frame[name] = None
        return frame[list(output_columns) + HOST_OUTPUT_NAMES]

    # ------------------------------------------------------------------ histograms

    def _count(self, frame: pd.DataFrame, duplicate: np.ndarray, sizes: dict[str, int],
               now: int, task_ns: int, cpu_ns: int) -> None:
        """Add the batch's events, cost and state bytes per (window, key) to the open
        windows, and the rows the processor counted as duplicates (``duplicate``) to their
        windows' ``duplicates`` instead.

        A window's assignment version is the oldest one its rows ran under on this
        instance: a window counts as run under version v (what ``verify`` measures) only
        when every event in it was routed by v."""
        if not len(frame):
            return
        s = self.settings
        windows = (frame["rb_window"] if s.time_mode.lower() == "eventtime"
                   else pd.Series(now - now % s.window_ms, index=frame.index)).astype("int64")
        dropped: dict[int, tuple[int, int]] = {}     # window -> (rows, oldest version)
        if duplicate.any():
            d = (frame[duplicate].assign(_w=windows[duplicate]).groupby("_w")
                 .agg(n=("rb_version", "size"), version=("rb_version", "min")))
            dropped = {int(w): (int(r.n), int(r.version))
                       for w, r in zip(d.index, d.itertuples(index=False))}
            frame, windows = frame[~duplicate], windows[~duplicate]
        per = (frame.assign(_w=windows)
               .groupby(["_w", "rb_key"], sort=False)
               .agg(events=("rb_cost", "size"), cost=("rb_cost", "sum"),
                    default=("rb_default", "first"), group=("rb_group", "first"),
                    version=("rb_version", "max")))
        total = len(frame) + sum(n for n, _ in dropped.values())
        added: dict[int, dict[str, list]] = {w: {} for w in dropped}
        for (window, name), r in zip(per.index, per.itertuples(index=False)):
            added.setdefault(int(window), {})[name] = [
                int(r.events), float(r.cost), sizes.get(name, 0), int(r.default), int(r.group),
                int(r.version)]
        for window, keys in sorted(added.items()):
            held = self.windows.getValue((window,))
            if held is None:
                self.handle.registerTimer(window + s.window_ms)
                merged: dict[str, list] = {}
                version, t_ns, c_ns = None, 0, 0
            else:
                merged = {k: [e, c, b, d, g, 0] for k, e, c, b, d, g in zip(*held[:6])}
                version, t_ns, c_ns = int(held[6]), int(held[7]), int(held[8])
            rows, v = dropped.get(window, (0, None))
            if rows:
                before = self.duplicates.getValue((window,))
                self.duplicates.updateValue((window,), ((before[0] if before else 0) + rows,))
                version = v if version is None else min(version, v)
            for k, (e, c, b, d, g, v) in keys.items():
                old = merged.get(k)
                merged[k] = ([e, c, b, d, g, v] if old is None
                             else [old[0] + e, old[1] + c, max(old[2], b), d, g, v])
                rows += e
                version = v if version is None else min(version, v)
            share = rows / total
            names = list(merged)
            self.windows.updateValue((window,), (
                names, [merged[k][0] for k in names], [merged[k][1] for k in names],
                [merged[k][2] for k in names], [merged[k][3] for k in names],
                [merged[k][4] for k in names], version, t_ns + round(task_ns * share),
                c_ns + round(cpu_ns * share)))

    def _close_window(self, instance: int, window: int, held: tuple) -> Iterator[pd.DataFrame]:
        """Histogram rows of ``window``, which ended (its timer fired): one per key, one
        for the instance."""
        keys, events, costs, sizes, defaults, groups, version, t_ns, c_ns = held
        dups = self.duplicates.getValue((window,))
        if dups is not None:
            self.duplicates.removeKey((window,))
        partition = _partition_id()
        rows: list[dict[str, Any]] = [
            {"rb_kind": KEY_ROW, "rb_key": k, "rb_window": window, "rb_instance": instance,
             "rb_partition": partition, "rb_default": int(d), "rb_group": int(g),
             "rb_version": int(version), "rb_events": int(e), "rb_cost": float(c),
             "rb_bytes": int(b)}
            for k, e, c, b, d, g in zip(keys, events, costs, sizes, defaults, groups)]
        rows.append({"rb_kind": INSTANCE_ROW, "rb_window": window, "rb_instance": instance,
                     "rb_partition": partition, "rb_version": int(version),
                     "rb_events": int(sum(events)), "rb_cost": float(sum(costs)),
                     "rb_keys": len(keys), "rb_task_ms": int(t_ns) / 1e6,
                     "rb_cpu_ms": int(c_ns) / 1e6, "rb_duplicates": int(dups[0]) if dups else 0})
        self.windows.removeKey((window,))
        yield self._host_rows(rows, self.settings.output_columns)

    # ------------------------------------------------------------------ moves

    def _give_away(self, marker: Any, instance: int,
                   timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        """Export every key the marker's routing places on another instance (none when
        the processor's partial results merge: each instance keeps its part).

        The marker's payload names the N of its version. For another N, a key stays when
        its new instance has this instance's label (Spark then repartitions the state by
        label), every instance closes its open histogram windows now, and an instance
        whose label has no instance under the new N gives every key away and drops its
        timers."""
        s = self.settings
        routing = dict(zip(marker["rb_routing_keys"], (int(i) for i in
                                                        marker["rb_routing_instances"])))
        version = int(marker["rb_version"])
        params = pickle.loads(marker["rb_payload"]) if marker["rb_payload"] is not None else {}
        n_target = int(params.get("n_instances", s.n_instances))
        labels = instance_labels(n_target)
        own = s.labels[instance]
        keys = self.scope.held_keys() if s.moves_state else []
        names = [str(k) for k in keys]
        defaults = default_instances(names, n_target) if names else []
        partition = _partition_id()
        rows: list[dict[str, Any]] = []
        for value, name, default in zip(keys, names, defaults):
            target = routing.get(name, int(default))
            if labels[target] == own:
                continue
            self.scope.enter(value, timerValues.getCurrentProcessingTimeInMs())
            state = self.scope.export_key()
            payload = {"key": value, **state,
                       "processing_ms": timerValues.getCurrentProcessingTimeInMs(),
                       "watermark_ms": timerValues.getCurrentWatermarkInMs()}
            rows.append({"rb_kind": HANDOFF, "rb_key": name, "rb_instance": target,
                         "rb_label": labels[target], "rb_partition": partition,
                         "rb_version": version, "rb_payload": pickle.dumps(payload)})
        rows.append({"rb_kind": EXPORTED, "rb_instance": instance, "rb_partition": partition,
                     "rb_version": version, "rb_keys": len(rows)})
        yield self._host_rows(rows, s.output_columns)
        if n_target != s.n_instances:
            # no histogram window spans a change of N: each instance's count ends here
            for (window,), held in list(self.windows.iterator()):
                yield from self._close_window(instance, int(window), held)
        if own not in labels:
            for ts in list(self.handle.listTimers()):
                self.handle.deleteTimer(ts)

    def _take_over(self, payload: dict[str, Any], instance: int,
                   timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        """Take a moved key's state; fire the timers its old instance would have fired at
        the end of the export batch, with that batch's timer values."""
        value = payload["key"]
        self.scope.enter(value, timerValues.getCurrentProcessingTimeInMs())
        self.scope.import_key(payload)
        then = TimerValues(payload["processing_ms"], payload["watermark_ms"])
        due_by = (payload["watermark_ms"] if self.settings.time_mode.lower() == "eventtime"
                  else payload["processing_ms"])
        outs: list[tuple[pd.DataFrame, Any]] = []
        for ts in sorted(t for t in payload["timers"] if t <= due_by):
            self.scope.enter(value, payload["processing_ms"])
            if self.scope.take_timer(ts):
                outs += [(out, value) for out in self.processor.handleExpiredTimer(
                    (value,), then, ExpiredTimerInfo(ts))]
        self.scope.flush_all()
        if outs:
            yield self._user_rows(outs, instance)
