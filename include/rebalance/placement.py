"""Default placement of keys on instances: key groups over a consistent hash.

This module is the single definition of where a key goes when no routing-table
entry says otherwise. The Spark side computes exactly the same thing:

* ``key_group(key) = pmod(hash(key), G)`` where ``hash`` is Spark SQL's
  ``hash()`` (Murmur3 x86_32, seed 42, over the UTF-8 bytes, with Spark's own
  byte-at-a-time tail). :func:`spark_hash_strings` reproduces it with numpy
  and is tested against Spark on the same keys.
* ``default_instance = group_instance(key_group, N)``: jump consistent hash of
  the key group (Lamping & Veach), so changing N from n to n+1 moves only about
  1/(n+1) of the key groups instead of reshuffling every key.

G (``DEFAULT_KEY_GROUPS``) is fixed for the lifetime of a job, like Flink's max
parallelism: it bounds the useful parallelism and is the unit of the
substream planners (ELB/CLB of seed 001).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

DEFAULT_KEY_GROUPS = 4096
SPARK_HASH_SEED = 42

_M32 = np.uint32(0xFFFFFFFF)
_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    k1 = k1 * _C1
    k1 = _rotl(k1, 15)
    return k1 * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    h1 = h1 ^ k1
    h1 = _rotl(h1, 13)
    return h1 * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h1: np.ndarray, length: np.ndarray) -> np.ndarray:
    h1 = h1 ^ length
    h1 = h1 ^ (h1 >> np.uint32(16))
    h1 = h1 * np.uint32(0x85EBCA6B)
    h1 = h1 ^ (h1 >> np.uint32(13))
    h1 = h1 * np.uint32(0xC2B2AE35)
    return h1 ^ (h1 >> np.uint32(16))


def spark_hash_strings(keys, seed: int = SPARK_HASH_SEED) -> np.ndarray:
    """Spark SQL ``hash(col)`` of string values, as int32, vectorised.

    Keys are grouped by UTF-8 length; each group is hashed with uint32 numpy
    arithmetic, so a million keys take well under a second.
    """
    encoded = [str(k).encode("utf-8") for k in keys]
    n = len(encoded)
    out = np.empty(n, dtype=np.int32)
    if n == 0:
        return out
    lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=n)
    with np.errstate(over="ignore"):
        for length in np.unique(lengths):
            idx = np.flatnonzero(lengths == length)
            length = int(length)
            buf = np.frombuffer(b"".join(encoded[i] for i in idx), dtype=np.uint8)
            buf = buf.reshape(len(idx), length) if length else buf.reshape(len(idx), 0)
            h1 = np.full(len(idx), seed, dtype=np.uint32)
            aligned = length - length % 4
            if aligned:
                words = np.ascontiguousarray(buf[:, :aligned]).view("<u4")
                for j in range(words.shape[1]):
                    h1 = _mix_h1(h1, _mix_k1(words[:, j].astype(np.uint32)))
            for j in range(aligned, length):
                # Spark mixes each tail byte as a sign-extended int.
                tail = buf[:, j].astype(np.int8).astype(np.int32).view(np.uint32)
                h1 = _mix_h1(h1, _mix_k1(tail))
            h1 = _fmix(h1, np.uint32(length))
            out[idx] = h1.view(np.int32)
    return out


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark SQL ``hash(CAST(value AS INT))``, as a Python int."""
    with np.errstate(over="ignore"):
        v = np.array([value], dtype=np.int64).astype(np.int32).view(np.uint32)
        h1 = _mix_h1(np.full(1, seed, dtype=np.uint32), _mix_k1(v))
        return int(_fmix(h1, np.uint32(4)).view(np.int32)[0])


def key_groups(keys, n_groups: int = DEFAULT_KEY_GROUPS) -> np.ndarray:
    """``pmod(hash(key), n_groups)`` for each key, as int64."""
    if n_groups < 1:
        raise ValueError(f"n_groups must be >= 1, got {n_groups}")
    return np.mod(spark_hash_strings(keys).astype(np.int64), n_groups)


def jump_consistent_hash(key: int, n_buckets: int) -> int:
    """Lamping & Veach jump consistent hash of a non-negative int key."""
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be >= 1, got {n_buckets}")
    key &= 0xFFFFFFFFFFFFFFFF
    b, j = -1, 0
    while j < n_buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


@lru_cache(maxsize=64)
def _group_table(n_instances: int, n_groups: int) -> np.ndarray:
    table = np.fromiter(
        (jump_consistent_hash(g, n_instances) for g in range(n_groups)),
        dtype=np.int64,
        count=n_groups,
    )
    table.setflags(write=False)
    return table


def group_instances(n_instances: int, n_groups: int = DEFAULT_KEY_GROUPS) -> np.ndarray:
    """Default instance of every key group: array of length ``n_groups``."""
    if n_instances < 1:
        raise ValueError(f"number of instances must be >= 1, got {n_instances}")
    return _group_table(int(n_instances), int(n_groups))


def default_instances(keys, n_instances: int, n_groups: int = DEFAULT_KEY_GROUPS) -> np.ndarray:
    """Default instance h(k) of each key for ``n_instances`` instances."""
    return group_instances(n_instances, n_groups)[key_groups(keys, n_groups)]
