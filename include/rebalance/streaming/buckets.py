"""An instance's user-key entries, kept in buckets of Spark state by a hash of the key.

Each read or write of Spark's state from a Python worker is a round trip to the JVM, so
:class:`~rebalance.streaming.keyed_state.KeyScope` keeps the entries of many keys in one
value: a *bucket*, the entries of the keys that hash to it, pickled together. Buckets split
one at a time (linear hashing: ``2 ** level + split`` buckets, ``u:meta``) so that a bucket
holds about :data:`KEYS_PER_BUCKET` keys however many keys an instance holds. A bucket is
read once per call and written once, at the call's end (:meth:`BucketStore.store`). The
layout: ``docs/processors.md``, "Inside: routing, the host, the state layout, the merge".
"""

from __future__ import annotations

import pickle
import zlib
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

#: The buckets' key and value: a bucket's number; its keys' entries, pickled.
BUCKET_SCHEMA = StructType([StructField("bucket", LongType())])
ENTRY_SCHEMA = StructType([StructField("entry", BinaryType())])
#: ``u:meta``: linear hashing's level and split pointer, and how many (key, entry) pairs
#: the buckets hold.
META_SCHEMA = StructType([StructField("level", LongType()), StructField("split", LongType()),
                          StructField("entries", LongType())])
#: Keys a bucket holds on average before the next bucket is split in two.
KEYS_PER_BUCKET = 32


def plain_value(value: Any) -> Any:
    """A value as Spark's state client would store it: numpy scalars as Python values,
    pandas timestamps as datetimes, rows and lists field by field."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):                # a Row too: stored as a plain tuple
        return tuple(plain_value(v) for v in value)
    if isinstance(value, list):
        return [plain_value(v) for v in value]
    if isinstance(value, pd.Timestamp):
        return value.to_pydatetime()
    return value


def key_hash(key: Any) -> int:
    """A hash of a user key that is the same in every process (Python's own is salted),
    and for a key as pandas gives it and as Spark's state gives it back (a numpy scalar
    or a pandas timestamp hashes as its Python value)."""
    return zlib.crc32(repr(plain_value(key)).encode("utf-8"))


def bucket_of(hashed: int, level: int, split: int) -> int:
    """Linear hashing: the bucket of a key hashed ``hashed`` among ``2 ** level + split``."""
    bucket = hashed & ((1 << level) - 1)
    return hashed & ((1 << (level + 1)) - 1) if bucket < split else bucket


def _holds(entry: dict) -> bool:
    return bool(entry["values"] or entry.get("timers"))


class BucketStore:
    """The buckets of one instance: ``maps`` (entry name -> the handle's MapState of
    buckets) and ``meta`` (the handle's ValueState ``u:meta``), both on Spark's implicit
    key, the instance. What a call reads is kept until :meth:`store`."""

    def __init__(self, maps: dict[str, Any], meta) -> None:
        self.maps, self.meta = maps, meta
        #: read in this call: (entry name, bucket) -> {user key: entry}; its size when read
        self._buckets: dict[tuple[str, int], dict] = {}
        self._read_sizes: dict[tuple[str, int], int] = {}
        self._dirty: set[tuple[str, int]] = set()
        self._meta_row: list[int] | None = None

    def _meta_now(self) -> list[int]:
        if self._meta_row is None:
            held = self.meta.get()
            self._meta_row = [int(v) for v in held] if held is not None else [0, 0, 0]
        return self._meta_row

    def _index(self, key: Any) -> int:
        level, split, _ = self._meta_now()
        return bucket_of(key_hash(key), level, split)

    def _bucket(self, entry: str, index: int) -> dict:
        where = (entry, index)
        bucket = self._buckets.get(where)
        if bucket is None:
            held = self.maps[entry].getValue((index,))
            bucket = self._buckets[where] = pickle.loads(held[0]) if held is not None else {}
            self._read_sizes[where] = len(bucket)
        return bucket

    def get(self, entry: str, key: Any) -> dict | None:
        """``key``'s ``entry`` as stored (its bucket read once per call), or None."""
        return self._bucket(entry, self._index(key)).get(key)

    def put(self, entry: str, key: Any, value: dict) -> None:
        """``key``'s ``entry`` changed (an entry holding nothing leaves its bucket)."""
        index = self._index(key)
        self._bucket(entry, index)[key] = value
        self._dirty.add((entry, index))

    def store(self, deleted: set[str]) -> None:
        """Write the changed buckets (dropping the variables named in ``deleted``), split
        buckets while they hold more than :data:`KEYS_PER_BUCKET` keys on average, and
        forget what was read."""
        dirty, self._dirty = self._dirty, set()
        if dirty:
            meta = self._meta_now()
            for where in sorted(dirty):
                meta[2] += self._write(where, deleted)
            level, split, entries = meta
            while entries > KEYS_PER_BUCKET * ((1 << level) + split):
                self._split(level, split, deleted)
                split += 1
                if split == 1 << level:
                    level, split = level + 1, 0
            meta[:2] = level, split
            self.meta.update(tuple(meta))
        self._buckets, self._read_sizes, self._meta_row = {}, {}, None

    def keys(self) -> list[Any]:
        """Every key with an entry (a scan of the stored buckets: :meth:`store` first)."""
        seen: dict[Any, None] = {}
        for real in self.maps.values():
            for _, (blob,) in real.iterator():
                seen.update(dict.fromkeys(pickle.loads(blob)))
        return list(seen)

    def _write(self, where: tuple[str, int], deleted: set[str]) -> int:
        """Write one bucket; returns how many entries it gained since read."""
        bucket = self._buckets[where]
        for value in bucket.values() if deleted else ():
            for name in deleted & value["values"].keys():
                del value["values"][name]
        for key in [k for k, value in bucket.items() if not _holds(value)]:
            del bucket[key]
        entry, index = where
        if bucket:
            self.maps[entry].updateValue((index,), (pickle.dumps(bucket, protocol=5),))
        elif self._read_sizes[where]:
            self.maps[entry].removeKey((index,))
        gained = len(bucket) - self._read_sizes[where]
        self._read_sizes[where] = len(bucket)
        return gained

    def _split(self, level: int, split: int, deleted: set[str]) -> None:
        """Move the keys of bucket ``split`` whose hash's next bit is set to bucket
        ``split + 2 ** level`` (empty until now, as linear hashing makes it)."""
        target, mask = split + (1 << level), (1 << (level + 1)) - 1
        for entry in self.maps:
            bucket = self._bucket(entry, split)
            moved = {k: v for k, v in bucket.items() if key_hash(k) & mask == target}
            if not moved:
                continue
            for key in moved:
                del bucket[key]
            self._buckets[(entry, target)], self._read_sizes[(entry, target)] = moved, 0
            self._write((entry, split), deleted)
            self._write((entry, target), deleted)
