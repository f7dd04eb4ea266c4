"""Per-key state and timers for a user's StatefulProcessor run under the rebalancer.

Spark's handle is one per instance (the operator groups by instance). A key's state is an
entry, ``{"values": {name: field}, "timers": [ts]}``: in ``u:buckets`` the variables
declared without TTL and the key's timers, in ``u:buckets_ttl`` the variables declared with
a TTL (Spark's TTL there is the longest declared). The entries of an instance's keys are
kept in buckets by a hash of the key, one pickled value per bucket, split one at a time
(linear hashing, ``u:meta``) so that a bucket holds about :data:`KEYS_PER_BUCKET` keys:
each read or write of Spark's state is a round trip to the JVM, so a call that touches
many keys costs a round trip per bucket, not per key.
Timers are one real timer per timestamp, with the keys due at it in ``t:due``.
:class:`KeyScope` is the handle the user's processor sees: the methods of
``StatefulProcessorHandle``, acting on the key it is set to (:meth:`KeyScope.enter`). The
layout, TTL and timers: ``docs/processors.md``, "Inside: routing, the host, the state
layout, the merge".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import ArrayType, DataType, LongType, StructField, StructType

from rebalance.streaming.buckets import (
    BUCKET_SCHEMA,
    ENTRY_SCHEMA,
    META_SCHEMA,
    BucketStore,
    plain_value,
)

#: The instance handle's MapStates of buckets of user keys' entries: variables without
#: TTL and the key's timers; variables with a TTL. ``u:meta``: the buckets' split state.
STATE, TTL_STATE, META = "u:buckets", "u:buckets_ttl", "u:meta"
#: Prefix of the state variables that hold user keys' state (earlier layouts: a MapState
#: per variable, u:<name>; a MapState keyed by user key, u:state and u:ttl).
USER_PREFIX = "u:"
#: The state variables of user keys' state in this layout (a checkpoint with others is refused).
LAYOUT = frozenset({STATE, TTL_STATE, META})
TIMER_DUE = "t:due"
#: The staged write of the key in scope's timer list (user variables stage by their id).
_TIMERS = -1


class ContractError(ValueError):
    """A part of Spark's StatefulProcessor contract the rebalancer cannot honour."""


def as_struct(schema: StructType | str, what: str, parse=None) -> StructType:
    """A user schema (StructType or DDL) as a StructType; ``parse`` parses DDL (in a Python
    worker, the state server's parser: there is no JVM gateway there)."""
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        if parse is None:
            from pyspark.sql.types import _parse_datatype_string as parse
        parsed = parse(schema)
        if isinstance(parsed, StructType):
            return parsed
    raise ContractError(f"{what} must be a StructType or a DDL string of columns, got {schema!r}")


def value_bytes(value: Any) -> int:
    """Approximate bytes of a state value as stored (8 per fixed-width field, the
    encoded length of strings and binaries, recursively through rows and arrays)."""
    if value is None:
        return 1
    if isinstance(value, (bytes, bytearray)):
        return len(value) + 4
    if isinstance(value, str):
        return len(value.encode("utf-8")) + 4
    if isinstance(value, dict):
        return 4 + sum(value_bytes(k) + value_bytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 4 + sum(value_bytes(v) for v in value)
    return 8


def _expired(expires: Any, now_ms: int) -> bool:
    return expires is not None and int(expires) <= now_ms


@dataclass
class _Variable:
    """A declared state variable: its kind, the number of fields of its rows (and of its
    map keys), its TTL, and the entry that holds it (:data:`STATE` or :data:`TTL_STATE`)."""

    name: str
    kind: str
    width: int
    ttl_ms: int | None
    key_width: int = 0
    entry: str = STATE


def _row(var: _Variable, value: Any, width: int, what: str = "rows") -> tuple:
    """``value`` as a stored row of ``width`` fields, refused (as Spark refuses it) when
    it has another number of fields."""
    if not isinstance(value, (tuple, list)) or len(value) != width:
        raise ContractError(f"state variable {var.name!r} takes {what} of {width} field(s), "
                            f"got {value!r}")
    return tuple(plain_value(v) for v in value)


class KeyValueState:
    """A ValueState of the current key; with a TTL it is stored as ``(value, expires)``."""

    def __init__(self, scope: KeyScope, variable: _Variable) -> None:
        self._scope, self._var = scope, variable

    def _read(self) -> tuple | None:
        held = self._scope.field(self._var)
        if self._var.ttl_ms is None or held is None:
            return held
        return None if _expired(held[1], self._scope.now_ms) else held[0]

    def exists(self) -> bool:
        return self._read() is not None

    def get(self) -> tuple | None:
        value = self._read()
        self._scope.measure(id(self), value)
        return value

    def update(self, newValue: tuple) -> None:
        value, ttl = _row(self._var, newValue, self._var.width), self._var.ttl_ms
        self._scope.set_field(self._var, value if ttl is None
                              else (value, self._scope.now_ms + ttl))
        self._scope.measure(id(self), value)

    def clear(self) -> None:
        self._scope.set_field(self._var, None)
        self._scope.measure(id(self), None)


class KeyListState:
    """A ListState of the current key, stored as ``(items, expires)``: each element with
    its own TTL expiry (None without TTL)."""

    def __init__(self, scope: KeyScope, variable: _Variable) -> None:
        self._scope, self._var = scope, variable

    def _read(self) -> tuple[list, list]:
        cached = self._scope.cached(id(self))
        if cached is not None:
            return cached
        held = self._scope.field(self._var)
        if held is None:
            pairs: tuple[list, list] = ([], [])
        elif self._var.ttl_ms is None:
            pairs = (list(held[0]), list(held[1]))
        else:
            now = self._scope.now_ms
            kept = [i for i, exp in enumerate(held[1]) if not _expired(exp, now)]
            pairs = ([held[0][i] for i in kept], [held[1][i] for i in kept])
        return self._scope.keep(id(self), pairs)

    def _write(self, items: list, expires: list) -> None:
        var = self._var
        self._scope.stage(id(self), (items, expires), lambda: self._scope.set_field(
            var, (items, expires) if items else None))
        self._scope.measure(id(self), items or None)

    def _rows(self, values: list[tuple]) -> list[tuple]:
        return [_row(self._var, v, self._var.width) for v in values]

    def _expiry(self) -> int | None:
        ttl = self._var.ttl_ms
        return None if ttl is None else self._scope.now_ms + ttl

    def exists(self) -> bool:
        return bool(self._read()[0])

    def get(self) -> Iterator[tuple]:
        items, _ = self._read()
        self._scope.measure(id(self), items)
        return iter(list(items))

    def put(self, newState: list[tuple]) -> None:
        items = self._rows(list(newState))
        self._write(items, [self._expiry()] * len(items))

    def appendValue(self, newState: tuple) -> None:
        self.appendList([newState])

    def appendList(self, newState: list[tuple]) -> None:
        held, expires = self._read()
        added = self._rows(list(newState))
        self._write(held + added, expires + [self._expiry()] * len(added))

    def clear(self) -> None:
        self._write([], [])


class KeyMapState:
    """A MapState of the current key, stored as a dict of map key -> ``(value, expires)``:
    each entry with its own TTL expiry (None without TTL)."""

    def __init__(self, scope: KeyScope, variable: _Variable) -> None:
        self._scope, self._var = scope, variable

    def _read(self) -> dict[tuple, tuple[tuple, Any]]:
        cached = self._scope.cached(id(self))
        if cached is not None:
            return cached
        held = self._scope.field(self._var)
        if held is None:
            entries: dict[tuple, tuple[tuple, Any]] = {}
        elif self._var.ttl_ms is None:
            entries = held                  # no expiry to check: the stored dict itself
        else:
            now = self._scope.now_ms
            entries = {k: ve for k, ve in held.items() if not _expired(ve[1], now)}
        return self._scope.keep(id(self), entries)

    def _write(self, entries: dict[tuple, tuple[tuple, Any]]) -> None:
        var = self._var
        self._scope.stage(id(self), entries, lambda: self._scope.set_field(
            var, entries if entries else None))
        self._scope.measure(id(self), (lambda: [list(entries), [v for v, _ in entries.values()]])
                            if entries else None)

    def exists(self) -> bool:
        return bool(self._read())

    def getValue(self, key: tuple) -> tuple | None:
        held = self._read().get(tuple(key))
        return None if held is None else held[0]

    def containsKey(self, key: tuple) -> bool:
        return tuple(key) in self._read()

    def updateValue(self, key: tuple, value: tuple) -> None:
        entries = self._read()
        ttl = self._var.ttl_ms
        entries[_row(self._var, key, self._var.key_width, "keys")] = (
            _row(self._var, value, self._var.width),
            None if ttl is None else self._scope.now_ms + ttl)
        self._write(entries)

    def iterator(self) -> Iterator[tuple[tuple, tuple]]:
        return iter([(k, v) for k, (v, _) in self._read().items()])

    def keys(self) -> Iterator[tuple]:
        return iter(list(self._read()))

    def values(self) -> Iterator[tuple]:
        return iter([v for v, _ in self._read().values()])

    def removeKey(self, key: tuple) -> None:
        entries = self._read()
        if entries.pop(tuple(key), None) is not None:
            self._write(entries)

    def clear(self) -> None:
        self._write({})


class KeyScope:
    """The handle a user's processor gets: Spark's handle methods, for one key at a time.

    ``handle`` is the instance's real ``StatefulProcessorHandle``; ``key_type`` the Spark
    type of the key column; ``time_mode`` the user's (``None`` refuses timers, as Spark).
    The processor declares its variables in ``init``; :meth:`seal` then creates the
    handle's MapStates that hold them (the host calls it right after the processor's
    ``init``, while Spark still takes declarations).
    """

    def __init__(self, handle, key_type: DataType, time_mode: str,
                 shared_timer: Callable[[int], bool] = lambda ts: False) -> None:
        self.handle = handle
        #: whether the instance's timer at a timestamp serves the host too (kept when no
        #: key wants it any more)
        self._shared_timer = shared_timer
        self.time_mode = time_mode.lower()
        self.key: tuple = ()
        self.now_ms = 0
        #: user variable name -> its declaration, in declaration order
        self.variables: dict[str, _Variable] = {}
        #: names given to deleteIfExists: dropped from the entries of each bucket written
        self._deleted: set[str] = set()
        #: entry name -> the handle's MapState (after :meth:`seal`)
        self._entries: dict[str, Any] = {}
        #: entry name -> the key in scope's entry (``{"values": {name: field}, "timers":
        #: [ts]}``), once read
        self._rows: dict[str, dict] = {}
        #: the instance's buckets of entries (after :meth:`seal`)
        self._buckets: BucketStore | None = None
        self._sizes: dict[int, Any] = {}
        self._cached: dict[int, Any] = {}
        self._staged: dict[int, Callable[[], None]] = {}
        self._due_cache: dict[int, dict[Any, None]] = {}
        self._due_dirty: set[int] = set()
        self._due = handle.getMapState(
            TIMER_DUE, StructType([StructField("ts", LongType())]),
            StructType([StructField("keys", ArrayType(key_type))]))
        self._key_timers: list[int] | None = None
        client = getattr(handle, "_statefulProcessorApiClient", None)
        self._parse = getattr(client, "_parse_string_schema", None)

    def _struct(self, schema: StructType | str, what: str) -> StructType:
        return as_struct(schema, what, self._parse)

    def seal(self) -> None:
        """Create the MapStates that hold the key's entries: :data:`STATE` (variables
        without TTL and the key's timers) and, if a variable has a TTL, :data:`TTL_STATE`
        with Spark's TTL the longest declared (a field's own expiry hides it before that)."""
        if self._entries:
            return
        timed = [v for v in self.variables.values() if v.ttl_ms is not None]
        for var in timed:
            var.entry = TTL_STATE
        self._entries[STATE] = self.handle.getMapState(STATE, BUCKET_SCHEMA, ENTRY_SCHEMA)
        if timed:
            self._entries[TTL_STATE] = self.handle.getMapState(
                TTL_STATE, BUCKET_SCHEMA, ENTRY_SCHEMA, max(v.ttl_ms for v in timed))
        self._buckets = BucketStore(self._entries, self.handle.getValueState(META, META_SCHEMA))
        self._rows = {}

    # -------------------------------------------------------------- the key in scope

    def enter(self, key: Any, now_ms: int) -> None:
        """Act on ``key`` (a plain value) from now on; ``now_ms`` is the batch's time.
        The previous key's staged writes are stored first."""
        self.seal()
        self.flush()
        self.key, self.now_ms = (key,), now_ms
        self._sizes = {}
        self._cached = {}
        self._rows = {}
        self._key_timers = None

    def _entry(self, entry: str) -> dict:
        row = self._rows.get(entry)
        if row is None:
            row = self._rows[entry] = (self._buckets.get(entry, self.key[0])
                                       or {"values": {}})
        return row

    def field(self, var: _Variable) -> Any:
        """The stored value of ``var`` for the key in scope (its entry read once)."""
        return self._entry(var.entry)["values"].get(var.name)

    def set_field(self, var: _Variable, value: Any) -> None:
        values = self._entry(var.entry)["values"]
        if value is None:
            values.pop(var.name, None)
        else:
            values[var.name] = value
        self._changed(var.entry)

    def _changed(self, entry: str) -> None:
        """The key in scope's ``entry`` changed: its bucket is written at the call's end."""
        self._buckets.put(entry, self.key[0], self._entry(entry))

    def cached(self, variable: int) -> Any:
        return self._cached.get(variable)

    def keep(self, variable: int, value: Any) -> Any:
        self._cached[variable] = value
        return value

    def stage(self, variable: int, value: Any, store: Callable[[], None]) -> None:
        self._cached[variable] = value
        self._staged[variable] = store

    def flush(self) -> None:
        """Apply the key in scope's staged writes to its entries (:meth:`enter` calls it
        before the scope moves on to another key, :meth:`flush_all` at the end of Spark's
        call)."""
        staged, self._staged = self._staged, {}
        for store in staged.values():
            store()

    def _store(self) -> None:
        """Write the call's changed buckets (:class:`BucketStore`) and forget what the call
        read: the next call reads again."""
        self.flush()
        self._buckets.store(self._deleted)
        self._rows, self._cached, self._key_timers = {}, {}, None

    def measure(self, variable: int, value: Any) -> None:
        """Note what a variable of the key in scope holds (its bytes are counted by
        :meth:`state_bytes`, once per key); a callable gives the value when counted."""
        self._sizes[variable] = value

    def state_bytes(self) -> int:
        """Bytes of the values the current key's variables held when last touched in scope."""
        return sum(0 if v is None else value_bytes(v() if callable(v) else v)
                   for v in self._sizes.values())

    # -------------------------------------------------------------- state variables

    def _declare(self, name: str, kind: str, schema: StructType, ttl: int | None,
                 keys: StructType | None = None) -> _Variable:
        if not isinstance(name, str) or not name:
            raise ContractError(f"a state variable needs a non-empty name, got {name!r}")
        if self._entries:
            raise ContractError(f"state variable {name!r} is declared after init; declare "
                                "state variables in init, as Spark requires")
        if name in self.variables and self.variables[name].kind != kind:
            raise ContractError(f"state variable {name!r} is declared twice with different kinds")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0):
            raise ContractError(f"state variable {name!r}: ttlDurationMs must be a positive "
                                f"integer, got {ttl!r}")
        self._deleted.discard(name)
        var = self.variables[name] = _Variable(name, kind, len(schema.fields), ttl,
                                               len(keys.fields) if keys is not None else 0)
        return var

    def getValueState(self, stateName: str, schema: StructType | str,
                      ttlDurationMs: int | None = None) -> KeyValueState:
        value = self._struct(schema, f"schema of {stateName!r}")
        return KeyValueState(self, self._declare(stateName, "value", value, ttlDurationMs))

    def getListState(self, stateName: str, schema: StructType | str,
                     ttlDurationMs: int | None = None) -> KeyListState:
        items = self._struct(schema, f"schema of {stateName!r}")
        return KeyListState(self, self._declare(stateName, "list", items, ttlDurationMs))

    def getMapState(self, stateName: str, userKeySchema: StructType | str,
                    valueSchema: StructType | str,
                    ttlDurationMs: int | None = None) -> KeyMapState:
        keys = self._struct(userKeySchema, f"key schema of {stateName!r}")
        values = self._struct(valueSchema, f"value schema of {stateName!r}")
        return KeyMapState(self, self._declare(stateName, "map", values, ttlDurationMs, keys))

    def deleteIfExists(self, stateName: str) -> None:
        """Forget a variable: each key's entry drops it when its bucket is next written."""
        if self._entries:
            raise ContractError(f"deleteIfExists({stateName!r}) is called after init; call it "
                                "in init, as Spark requires")
        self.variables.pop(stateName, None)
        self._deleted.add(stateName)

    # -------------------------------------------------------------- timers

    def _check_timers(self) -> None:
        if self.time_mode not in ("eventtime", "processingtime"):
            raise ContractError("timers need time_mode 'EventTime' or 'ProcessingTime' "
                                f"(the processor runs with {self.time_mode!r})")

    def listTimers(self) -> Iterator[int]:
        self._check_timers()
        return iter(sorted(self._own_timers()))

    def _own_timers(self) -> list[int]:
        if self._key_timers is None:
            self._key_timers = list(self._entry(STATE).get("timers", ()))
        return self._key_timers

    def _save_timers(self) -> None:
        timers = self._key_timers

        def store() -> None:
            row = self._entry(STATE)
            if timers:
                row["timers"] = sorted(timers)
            else:
                row.pop("timers", None)
            self._changed(STATE)
        self._staged[_TIMERS] = store

    def _due_at(self, ts: int) -> dict[Any, None]:
        """The keys due at ``ts`` (read once per Spark call; :meth:`flush_all` stores them):
        timers are often aligned (a window's end), so thousands of keys share one."""
        if ts not in self._due_cache:
            held = self._due.getValue((ts,))
            self._due_cache[ts] = dict.fromkeys(held[0]) if held is not None else {}
        return self._due_cache[ts]

    def flush_all(self) -> None:
        """Store every staged write: the key in scope's, the changed buckets, and the keys
        due per timestamp (the host calls it at the end of each of Spark's calls)."""
        self._store()
        for ts in sorted(self._due_dirty):
            keys = self._due_cache[ts]
            if keys:
                self._due.updateValue((ts,), (list(keys),))
            else:
                self._due.removeKey((ts,))
        self._due_cache, self._due_dirty = {}, set()

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._check_timers()
        ts = int(expiryTimestampMs)
        own = self._own_timers()
        if ts in own:
            return
        own.append(ts)
        self._save_timers()
        due = self._due_at(ts)
        if not due:
            self.handle.registerTimer(ts)     # the first key due at ts
        if self.key[0] not in due:
            due[self.key[0]] = None
            self._due_dirty.add(ts)

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._check_timers()
        ts = int(expiryTimestampMs)
        own = self._own_timers()
        if ts in own:
            own.remove(ts)
            self._save_timers()
            self._forget_due(ts)

    def _forget_due(self, ts: int) -> None:
        """The current key no longer waits for ``ts``; the instance's timer at ``ts`` is
        deleted once no key (and not the host) waits for it."""
        due = self._due_at(ts)
        if due.pop(self.key[0], 0) is None:
            self._due_dirty.add(ts)
        if not due and not self._shared_timer(ts):
            self.handle.deleteTimer(ts)

    def keys_due(self, ts: int) -> list[Any]:
        """Keys whose timer ``ts`` is registered (for the instance's timer at ``ts``);
        forgets ``ts`` in ``t:due``."""
        due = self._due_at(int(ts))
        if not due:
            return []
        self._due_cache[int(ts)], keys = {}, list(due)
        self._due_dirty.add(int(ts))
        return keys

    def take_timer(self, ts: int) -> bool:
        """Whether the current key still has timer ``ts``; removes it (it fires now)."""
        own = self._own_timers()
        if int(ts) not in own:
            return False
        own.remove(int(ts))
        self._save_timers()
        return True

    # -------------------------------------------------------------- moving a key

    def held_keys(self) -> list[Any]:
        """Every key with a state variable or a timer on this instance (a scan of its
        buckets, after the call's changes are stored: for moves)."""
        self._store()
        return self._buckets.keys()

    def export_key(self) -> dict[str, Any]:
        """The current key's whole state (every declared variable's stored value and its
        timers), removed from this instance."""
        self.flush()
        values = {name: self.field(var) for name, var in self.variables.items()
                  if self.field(var) is not None}
        timers = sorted(self._own_timers())
        for ts in timers:
            self._forget_due(ts)
        for entry in self._entries:
            self._rows[entry] = {"values": {}}      # leaves its bucket when written
            self._changed(entry)
        self._cached, self._key_timers = {}, []
        return {"values": values, "timers": timers}

    def import_key(self, exported: dict[str, Any]) -> None:
        """Take over a key's state exported by :meth:`export_key` (current key)."""
        for name, value in exported["values"].items():
            if name not in self.variables:
                raise ContractError(f"moved state has variable {name!r}, which this processor "
                                    "does not declare")
            self.set_field(self.variables[name], value)
        self._cached = {}
        for ts in exported["timers"]:
            self.registerTimer(int(ts))
