"""KeyScope over an in-memory handle: a key's variables and timers are one entry, kept with
other keys' in buckets that split as keys come; a bucket is read once and written once per
call, the keys due at a timestamp once per call, and nothing staged is lost when the
scope moves on, exports a key or ends the call."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from rebalance.streaming.buckets import KEYS_PER_BUCKET, bucket_of, key_hash
from rebalance.streaming.keyed_state import META, STATE, TTL_STATE, ContractError, KeyScope


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

    def iterator(self):
        return iter(list(self.data.items()))


class FakeValue:
    def __init__(self) -> None:
        self.value = None

    def get(self):
        return self.value

    def update(self, value):
        self.value = tuple(value)


class FakeHandle:
    def __init__(self) -> None:
        self.maps: dict[str, FakeMap] = {}
        self.values: dict[str, FakeValue] = {}
        self.ttls: dict[str, int | None] = {}
        self.timers: set[int] = set()
        self.registered = 0

    def getMapState(self, name, key_schema, value_schema, ttl=None):
        self.ttls[name] = ttl
        return self.maps.setdefault(name, FakeMap())

    def getValueState(self, name, schema, ttl=None):
        return self.values.setdefault(name, FakeValue())

    def registerTimer(self, ts):
        self.registered += 1
        self.timers.add(ts)

    def deleteTimer(self, ts):
        self.timers.discard(ts)


def struct(**fields) -> StructType:
    return StructType([StructField(name, kind()) for name, kind in fields.items()])


def buckets(real: FakeMap) -> dict[int, dict]:
    """The buckets as stored: bucket -> {user key: entry}, each one pickled value."""
    return {index: pickle.loads(blob) for (index,), (blob,) in real.data.items()}


def stored(real: FakeMap, key: str) -> dict | None:
    """A key's entry as stored, from whichever bucket holds it."""
    found = [b[key] for b in buckets(real).values() if key in b]
    assert len(found) <= 1, f"{key!r} is in {len(found)} buckets"
    return found[0] if found else None


def scope() -> tuple[KeyScope, FakeHandle]:
    handle = FakeHandle()
    return KeyScope(handle, StringType(), "EventTime"), handle


def test_a_keys_variables_and_timers_are_read_once_and_written_once_per_call():
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
    s.enter("b", 0)                       # one bucket so far: a and b share it
    seen.updateValue(("x",), (np.int64(1),))
    assert (real.reads, real.writes) == (1, 0)
    s.flush_all()                         # the call ends: the bucket is written once
    assert (real.reads, real.writes) == (1, 1)
    a = stored(real, "a")
    assert len(a["values"]["seen"]) == 100 and len(a["values"]["recent"][0]) == 100
    assert a["values"]["last"] == (99.0,) and a["timers"] == [1_000 + i for i in range(100)]
    assert stored(real, "b") == {"values": {"seen": {("x",): ((1,), None)}}}
    assert type(stored(real, "b")["values"]["seen"][("x",)][0][0]) is int, "numpy as Python"
    assert handle.values[META].value == (0, 0, 2)
    s.enter("a", 0)                       # the next call reads the bucket again
    seen.removeKey(("e3",))
    assert len(list(seen.keys())) == 99 and next(recent.get()) == (0.0,)
    s.flush_all()
    assert len(stored(real, "a")["values"]["seen"]) == 99 and real.reads == 2
    s.enter("b", 0)
    seen.clear()
    s.flush_all()
    assert stored(real, "b") is None, "an entry with nothing left leaves its bucket"
    assert handle.values[META].value == (0, 0, 1)


def test_variables_with_a_ttl_share_an_entry_whose_spark_ttl_is_the_longest():
    s, handle = scope()
    seen = s.getMapState("seen", struct(id=StringType), struct(at=LongType),
                         ttlDurationMs=1_000)
    last = s.getValueState("last", struct(v=DoubleType), ttlDurationMs=5_000)
    kept = s.getListState("kept", struct(v=DoubleType))
    s.seal()
    assert handle.ttls == {"t:due": None, STATE: None, TTL_STATE: 5_000}
    assert set(handle.values) == {META}
    s.enter("a", 10_000)
    seen.updateValue(("e",), (1,))
    last.update((2.0,))
    kept.appendValue((3.0,))
    s.flush_all()
    assert handle.maps[TTL_STATE].writes == 1 and handle.maps[STATE].writes == 1
    s.enter("a", 11_000)                  # the map's entry expired, the value not yet
    assert not seen.exists() and last.get() == (2.0,) and next(kept.get()) == (3.0,)
    s.flush_all()
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


def test_a_deleted_variable_is_dropped_from_each_entry_when_its_bucket_is_written():
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
    held = buckets(handle.maps[STATE])
    assert sum(map(len, held.values())) == 1000 and len(held) == -(-1000 // KEYS_PER_BUCKET)
    for i in range(999):
        s.enter(f"k{i}", 0)
        s.deleteTimer(60_000)
    assert handle.timers == {60_000}, "one key still waits"
    s.enter("k999", 0)
    s.deleteTimer(60_000)
    assert handle.timers == set()
    s.flush_all()
    assert (60_000,) not in due.data and not handle.maps[STATE].data
    assert handle.values[META].value[2] == 0


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
    assert stored(handle.maps[STATE], "a") is None
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
    per_key = tmp_path / "per-key"             # the layout of one entry per key
    _operator_metadata(per_key, ["u:state", "u:ttl", "t:due", "h:windows"])
    with pytest.raises(ContractError, match=r"\(u:state, u:ttl\).*new checkpoint"):
        RebalancedQuery(stream, "/out", str(per_key), None).start()
    current = tmp_path / "current"
    _operator_metadata(current, ["u:buckets", "u:buckets_ttl", "u:meta", "t:due", "h:windows"])
    assert not {n for n in state_variables(str(current)) if n.startswith("u:")} - {
        STATE, TTL_STATE, META}


def test_buckets_split_as_keys_come_and_every_key_stays_reachable():
    s, handle = scope()
    total = s.getValueState("total", struct(v=LongType))
    s.seal()
    real = handle.maps[STATE]
    n = 5_000
    for start in range(0, n, 500):                # ten calls of 500 new keys each
        for i in range(start, start + 500):
            s.enter(f"k{i}", 0)
            total.update((i,))
        s.flush_all()
    level, split, entries = handle.values[META].value
    held = buckets(real)
    assert entries == n and len(held) == (1 << level) + split
    assert n / len(held) <= KEYS_PER_BUCKET < n / (len(held) - 1)
    for index, bucket in held.items():            # each key where linear hashing puts it
        assert all(bucket_of(key_hash(k), level, split) == index for k in bucket)
    reads = real.reads
    for i in range(0, n, 7):                      # one call: a read per bucket touched
        s.enter(f"k{i}", 0)
        assert total.get() == (i,)
    assert real.reads - reads == len({bucket_of(key_hash(f"k{i}"), level, split)
                                      for i in range(0, n, 7)})
    s.flush_all()
    assert sorted(s.held_keys()) == sorted(f"k{i}" for i in range(n))
    writes = real.writes
    for i in range(n):                            # every key leaves: nothing is left
        s.enter(f"k{i}", 0)
        total.clear()
    s.flush_all()
    assert not real.data and handle.values[META].value == (level, split, 0)
    assert real.writes - writes == len(held), "one removal per bucket"


def test_a_key_hashes_alike_as_pandas_and_as_spark_give_it():
    import datetime as dt

    import pandas as pd

    when = dt.datetime(2024, 1, 2, 3, 4, 5)
    assert key_hash(pd.Timestamp(when)) == key_hash(when)
    assert key_hash(np.int64(7)) == key_hash(7) and key_hash(np.str_("k")) == key_hash("k")
    assert key_hash("k") == 3_779_104_368        # crc32 of repr: the same in every process
