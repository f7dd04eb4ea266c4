"""KeyScope over an in-memory handle: a key's list and map variables are read once and
written back once, the keys due at a timestamp once per call, and nothing staged is lost
when the scope moves on, exports a key or ends the call."""

from __future__ import annotations

from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from rebalance.streaming.keyed_state import KeyScope


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
        self.timers: set[int] = set()
        self.registered = 0

    def getMapState(self, name, key_schema, value_schema, ttl=None):
        return self.maps.setdefault(name, FakeMap())

    def registerTimer(self, ts):
        self.registered += 1
        self.timers.add(ts)

    def deleteTimer(self, ts):
        self.timers.discard(ts)


def scope() -> tuple[KeyScope, FakeHandle]:
    handle = FakeHandle()
    return KeyScope(handle, StringType(), "EventTime"), handle


def test_a_map_is_read_once_and_written_once_per_key():
    s, handle = scope()
    seen = s.getMapState("seen", StructType([StructField("id", StringType())]),
                         StructType([StructField("at", LongType())]))
    real = handle.maps["u:seen"]
    s.enter("a", 0)
    for i in range(100):
        assert not seen.containsKey((f"e{i}",))
        seen.updateValue((f"e{i}",), (i,))
    assert seen.getValue(("e7",)) == (7,)
    assert (real.reads, real.writes) == (1, 0)
    s.enter("b", 0)                       # the scope moves on: a's map is stored
    assert real.writes == 1 and len(real.data[("a",)][0]) == 100
    seen.updateValue(("x",), (1,))
    s.flush_all()
    assert real.data[("b",)][0] == [("x",)]
    s.enter("a", 0)
    seen.removeKey(("e3",))
    assert len(list(seen.keys())) == 99
    s.flush()
    assert len(real.data[("a",)][0]) == 99


def test_aligned_timers_write_the_keys_due_once_per_call():
    s, handle = scope()
    for i in range(1000):
        s.enter(f"k{i}", 0)
        s.registerTimer(60_000)
    due = handle.maps["t:due"]
    assert handle.registered == 1 and due.writes == 0 and due.reads == 1
    s.flush_all()
    assert due.writes == 1 and len(due.data[(60_000,)][0]) == 1000
    assert len(handle.maps["t:keys"].data) == 1000
    for i in range(999):
        s.enter(f"k{i}", 0)
        s.deleteTimer(60_000)
    assert handle.timers == {60_000}, "one key still waits"
    s.enter("k999", 0)
    s.deleteTimer(60_000)
    assert handle.timers == set()
    s.flush_all()
    assert (60_000,) not in due.data and not handle.maps["t:keys"].data


def test_keys_due_are_taken_once_and_export_sees_staged_writes():
    s, handle = scope()
    recent = s.getListState("recent", StructType([StructField("v", DoubleType())]))
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
    s.flush_all()
    assert ("a",) not in handle.maps["u:recent"].data
    assert sorted(s.held_keys()) == ["b"]
