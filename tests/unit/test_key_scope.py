"""KeyScope over an in-memory handle: a key's variables and timers are one entry, read once
and written back once per key in scope, the keys due at a timestamp once per call, and
nothing staged is lost when the scope moves on, exports a key or ends the call."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from rebalance.streaming.keyed_state import STATE, TTL_STATE, ContractError, KeyScope


class FakeMap:
    """A MapState of Spark's handle, counting reads and writes."""

    def __init__(self) -> None:
        self.data: dict[tuple, tuple] = {}
        self.reads = self.writes = 0

    def getValue(self, key):
        self.reads += 1
        return self.data.get(tuple(key))

    def containsKey(self, key):
        return tuple(key) in self.data

    def updateValue(self, key, value):
        self.writes += 1
        self.data[tuple(key)] = value

    def removeKey(self, key):
        self.writes += 1
        self.data.pop(tuple(key), None)

    def keys(self):
        return iter(list(self.data))


class FakeHandle:
    def __init__(self) -> None:
        self.maps: dict[str, FakeMap] = {}
        self.ttls: dict[str, int | None] = {}
        self.timers: set[int] = set()
        self.registered = 0

    def getMapState(self, name, key_schema, value_schema, ttl=None):
        self.ttls[name] = ttl
        return self.maps.setdefault(name, FakeMap())

    def registerTimer(self, ts):
        self.registered += 1
        self.timers.add(ts)

    def deleteTimer(self, ts):
        self.timers.discard(ts)


def struct(**fields) -> StructType:
    return StructType([StructField(name, kind()) for name, kind in fields.items()])


def stored(real: FakeMap, key: str) -> dict:
    """A key's entry as stored: one pickled value."""
    (entry,) = real.data[(key,)]
    return pickle.loads(entry)


def scope() -> tuple[KeyScope, FakeHandle]:
    handle = FakeHandle()
    return KeyScope(handle, StringType(), "EventTime"), handle


def test_a_keys_variables_and_timers_are_read_once_and_written_once_per_key():
    s, handle = scope()
    seen = s.getMapState("seen", StructType([StructField("id", StringType())]),
                         StructType([StructField("at", LongType())]))
    recent = s.getListState("recent", StructType([StructField("v", DoubleType())]))
    last = s.getValueState("last", struct(v=DoubleType))
    s.seal()
    real = handle.maps[STATE]
    assert TTL_STATE not in handle.maps and handle.ttls[STATE] is None
    s.enter("a", 0)
    for i in range(100):
        assert not seen.containsKey((f"e{i}",))
        seen.updateValue((f"e{i}",), (i,))
        recent.appendValue((float(i),))
        last.update((float(i),))
        s.registerTimer(1_000 + i)
    assert seen.getValue(("e7",)) == (7,) and last.get() == (99.0,)
    assert (real.reads, real.writes) == (1, 0)
    s.enter("b", 0)                       # the scope moves on: a's entry is stored once
    assert real.writes == 1
    a = stored(real, "a")
    assert len(a["values"]["seen"]) == 100 and len(a["values"]["recent"][0]) == 100
    assert a["values"]["last"] == (99.0,) and a["timers"] == [1_000 + i for i in range(100)]
    seen.updateValue(("x",), (np.int64(1),))
    s.flush_all()
    assert stored(real, "b") == {"values": {"seen": {("x",): ((1,), None)}}}
    assert type(stored(real, "b")["values"]["seen"][("x",)][0][0]) is int, "numpy as Python"
    s.enter("a", 0)
    seen.removeKey(("e3",))
    assert len(list(seen.keys())) == 99 and next(recent.get()) == (0.0,)
    s.flush()
    assert len(stored(real, "a")["values"]["seen"]) == 99 and real.reads == 3
    s.enter("b", 0)
    seen.clear()
    s.flush()
    assert ("b",) not in real.data, "an entry with nothing left is removed"


def test_variables_with_a_ttl_share_an_entry_whose_spark_ttl_is_the_longest():
    s, handle = scope()
    seen = s.getMapState("seen", struct(id=StringType), struct(at=LongType),
                         ttlDurationMs=1_000)
    last = s.getValueState("last", struct(v=DoubleType), ttlDurationMs=5_000)
    kept = s.getListState("kept", struct(v=DoubleType))
    s.seal()
    assert handle.ttls == {"t:due": None, STATE: None, TTL_STATE: 5_000}
    s.enter("a", 10_000)
    seen.updateValue(("e",), (1,))
    last.update((2.0,))
    kept.appendValue((3.0,))
    s.flush()
    assert handle.maps[TTL_STATE].writes == 1 and handle.maps[STATE].writes == 1
    s.enter("a", 11_000)                  # the map's entry expired, the value not yet
    assert not seen.exists() and last.get() == (2.0,) and next(kept.get()) == (3.0,)
    s.enter("a", 15_000)
    assert not last.exists() and last.get() is None
    assert handle.maps[TTL_STATE].reads == 3


def test_a_row_of_another_width_is_refused_as_spark_refuses_it():
    s, _ = scope()
    last = s.getValueState("last", struct(v=DoubleType, n=LongType))
    seen = s.getMapState("seen", struct(id=StringType), struct(at=LongType))
    s.enter("a", 0)
    for wrong in (lambda: last.update((1.0,)), lambda: seen.updateValue(("x", "y"), (1,)),
                  lambda: seen.updateValue(("x",), 5)):
        with pytest.raises(ContractError, match=r"takes (rows|keys) of \d field\(s\)"):
            wrong()


def test_a_deleted_variable_is_dropped_from_each_entry_when_read():
    s, handle = scope()
    old = s.getValueState("old", struct(v=LongType))
    kept = s.getValueState("kept", struct(v=LongType))
    s.enter("a", 0)
    old.update((1,))
    kept.update((2,))
    s.flush_all()
    again = KeyScope(handle, StringType(), "EventTime")      # the next run of the query
    again.deleteIfExists("old")
    kept = again.getValueState("kept", struct(v=LongType))
    again.enter("a", 0)
    assert kept.get() == (2,)
    kept.update((3,))
    again.flush_all()
    assert stored(handle.maps[STATE], "a") == {"values": {"kept": (3,)}}


def test_a_variable_declared_after_init_is_refused():
    s, _ = scope()
    s.getValueState("v", struct(x=LongType))
    s.seal()
    for late in (lambda: s.getValueState("w", struct(x=LongType)), lambda: s.deleteIfExists("v")):
        with pytest.raises(ContractError, match="after init"):
            late()


def test_aligned_timers_write_the_keys_due_once_per_call():
    s, handle = scope()
    for i in range(1000):
        s.enter(f"k{i}", 0)
        s.registerTimer(60_000)
    due = handle.maps["t:due"]
    assert handle.registered == 1 and due.writes == 0 and due.reads == 1
    s.flush_all()
    assert due.writes == 1 and len(due.data[(60_000,)][0]) == 1000
    assert len(handle.maps[STATE].data) == 1000
    for i in range(999):
        s.enter(f"k{i}", 0)
        s.deleteTimer(60_000)
    assert handle.timers == {60_000}, "one key still waits"
    s.enter("k999", 0)
    s.deleteTimer(60_000)
    assert handle.timers == set()
    s.flush_all()
    assert (60_000,) not in due.data and not handle.maps[STATE].data


def test_keys_due_are_taken_once_and_export_sees_staged_writes():
    s, handle = scope()
    recent = s.getListState("recent", StructType([StructField("v", DoubleType())]))
    s.seal()
    for key in ("a", "b"):
        s.enter(key, 0)
        recent.appendValue((1.0,))
        s.registerTimer(5)
    s.flush_all()
    assert sorted(s.keys_due(5)) == ["a", "b"]
    assert s.keys_due(5) == []
    s.enter("a", 0)
    assert s.take_timer(5) and not s.take_timer(5)
    recent.appendValue((2.0,))            # staged, not stored yet
    moved = s.export_key()
    assert moved["values"]["recent"][0] == [(1.0,), (2.0,)] and moved["timers"] == []
    assert pickle.loads(pickle.dumps(moved)) == moved
    s.flush_all()
    assert ("a",) not in handle.maps[STATE].data
    assert sorted(s.held_keys()) == ["b"]


def _operator_metadata(checkpoint, names: list[str]) -> None:
    """Spark's operator metadata of a transformWithState operator, as Spark writes it."""
    folder = checkpoint / "state" / "0" / "_metadata" / "v2"
    folder.mkdir(parents=True)
    properties = {"timeMode": "EventTime", "outputMode": "Append", "stateVariables": [
        {"stateName": n, "stateVariableType": "MapState", "ttlEnabled": False} for n in names]}
    (folder / "0").write_text("v2\n" + json.dumps({
        "operatorInfo": {"operatorId": 0, "operatorName": "transformWithStateInPandasExec"},
        "stateStoreInfo": [], "operatorPropertiesJson": json.dumps(properties)}))


def test_a_checkpoint_of_the_per_variable_layout_is_refused_at_start(tmp_path):
    from types import SimpleNamespace

    from rebalance.streaming.rebalanced import RebalancedQuery
    from rebalance.streaming.restart.checkpoint import state_variables

    assert state_variables(str(tmp_path)) == set()
    _operator_metadata(tmp_path, ["u:windows", "u:seen", "t:keys", "t:due", "h:windows"])
    assert state_variables(str(tmp_path)) == {"u:windows", "u:seen", "t:keys", "t:due",
                                              "h:windows"}
    stream = SimpleNamespace(df=SimpleNamespace(sparkSession=None), instances=2, job="clicks")
    query = RebalancedQuery(stream, "/out", str(tmp_path), None)
    with pytest.raises(ContractError, match="u:seen, u:windows.*new checkpoint"):
        query.start()
