"""Default placement of keys on instances: key groups over a consistent hash.

The single definition of where a key goes when no routing-table entry says otherwise, equal
to what the Spark side computes: ``key_group(key) = pmod(hash(key), G)`` with Spark SQL's
Murmur3 ``hash()`` (:func:`spark_hash_strings`, vectorised over the UTF-8 buffers of all
keys), and ``default_instance = group_instance(key_group, N)``, a jump consistent hash of
the key group, so a change of N moves few groups. G (``DEFAULT_KEY_GROUPS``) is fixed for
a job's lifetime. Why, and how it is tested against Spark: ``docs/planning.md``,
"Vocabulary and the default placement".
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


def _string_array(keys):
    """``keys`` as one pyarrow string or large_string array without nulls (see
    :func:`utf8_buffers`)."""
    import pyarrow as pa

    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    elif not isinstance(keys, (pa.Array, np.ndarray, list, tuple)):
        keys = list(keys)
    values = keys
    if isinstance(keys, np.ndarray) and keys.dtype.kind not in "OU":
        keys = None  # numbers, bytes, ...: str(key)
    elif not isinstance(keys, pa.Array):
        try:
            # numpy str arrays go through objects: pyarrow reads their items as C strings
            # (it stops at the first NUL character).
            keys = pa.array(keys if isinstance(keys, np.ndarray) and keys.dtype == object
                            else np.asarray(keys, dtype=object), type=pa.large_string())
        except (pa.ArrowException, TypeError, ValueError):
            keys = None
    if keys is None or not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)) \
            or keys.null_count:
        if isinstance(values, pa.Array):
            values = values.to_pylist()
        keys = pa.array([str(k) for k in values], type=pa.large_string())
    return keys


def _raw_buffers(keys) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, offsets as stored: int32 or int64) of a pyarrow string array, no copy."""
    import pyarrow as pa

    n = len(keys)
    _, off_buf, data_buf = keys.buffers()
    wide = pa.types.is_large_string(keys.type)
    dtype = np.int64 if wide else np.int32
    offsets = (np.frombuffer(off_buf, dtype=dtype, count=n + 1,
                             offset=keys.offset * np.dtype(dtype).itemsize)
               if off_buf is not None else np.zeros(n + 1, dtype=dtype))
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None \
        else np.zeros(0, dtype=np.uint8)
    return data, offsets


def utf8_buffers(keys) -> tuple[np.ndarray, np.ndarray]:
    """The UTF-8 bytes of ``keys`` as one uint8 array and int64 offsets (length K + 1).

    ``keys`` is a pyarrow string array (chunked or not: its own buffers are used, no
    copy of the bytes) or any sequence or numpy array of keys, converted by pyarrow in
    compiled code. Values that are not strings (or nulls) fall back to ``str(key)``, one
    by one.
    """
    data, offsets = _raw_buffers(_string_array(keys))
    return data, offsets.astype(np.int64, copy=False)


def padded_buffers(arrays, pad: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """The UTF-8 bytes of several key arrays one after the other, followed by ``pad`` zero
    bytes (what :func:`unaligned_view` needs), and int64 offsets into them: one copy of
    each array's bytes and offsets, written in place."""
    parts = [_raw_buffers(_string_array(a)) for a in arrays]
    n_bytes = sum(int(off[-1] - off[0]) for _, off in parts)
    data = np.empty(n_bytes + pad, dtype=np.uint8)
    data[n_bytes:] = 0
    offsets = np.empty(sum(len(off) - 1 for _, off in parts) + 1, dtype=np.int64)
    offsets[0] = 0
    at_byte, at_key = 0, 0
    for d, off in parts:
        lo, hi = int(off[0]), int(off[-1])
        data[at_byte:at_byte + hi - lo] = d[lo:hi]
        dst = offsets[at_key + 1:at_key + len(off)]
        dst[...] = off[1:]
        dst += at_byte - lo
        at_byte += hi - lo
        at_key += len(off) - 1
    return data, offsets


def unaligned_view(data: np.ndarray, dtype: str, pad: int = 0) -> np.ndarray:
    """A read-only view with one ``dtype`` value starting at every byte offset of ``data``:
    ``view[i]`` reads bytes i .. i + itemsize - 1. ``pad`` > 0 first copies ``data``
    followed by that many zero bytes (so that the last bytes can start a value too)."""
    if pad:
        padded = np.zeros(len(data) + pad, dtype=np.uint8)
        padded[:len(data)] = data
        data = padded
    size = np.dtype(dtype).itemsize
    view = np.ndarray(shape=(max(0, len(data) - size + 1),), dtype=dtype, buffer=data,
                      strides=(1,))
    view.flags.writeable = False
    return view


def spark_hash_strings(keys, seed: int = SPARK_HASH_SEED) -> np.ndarray:
    """Spark SQL ``hash(col)`` of string values, as int32, vectorised.

    Spark's ``Murmur3_x86_32.hashUnsafeBytes`` over the UTF-8 bytes: every aligned 4-byte
    little-endian word is mixed, then each tail byte as a sign-extended int, then ``fmix``
    with the byte length. All keys are hashed together in numpy: keys are ordered by
    decreasing number of whole words, so word j of every key that has one is a prefix of
    that order, read in one gather from an unaligned uint32 view of the bytes. The cost
    is one pass of uint32 arithmetic per word position over the keys that long, i.e.
    proportional to the total bytes, with no Python work per key (timings:
    ``docs/planning.md``, "Scale"). ``keys``: see :func:`utf8_buffers`.
    """
    data, offsets = utf8_buffers(keys)
    n = len(offsets) - 1
    out = np.empty(n, dtype=np.int32)
    if n == 0:
        return out
    lengths = np.diff(offsets)
    words = lengths // 4
    # a stable sort of 16-bit integers is a radix sort in numpy: O(K), not O(K log K)
    rank = -words.astype(np.int16) if int(words.max()) < 2 ** 15 else -words
    order = np.argsort(rank, kind="stable")
    start = offsets[:-1][order]
    nwords = words[order]
    # keys with more than j whole words: the first n - (keys with <= j words) of the order
    with_more = n - np.cumsum(np.bincount(nwords))
    u32 = unaligned_view(data, "<u4", 3)
    h1 = np.full(n, seed, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for j in range(int(nwords[0])):
            m = int(with_more[j])
            h1[:m] = _mix_h1(h1[:m], _mix_k1(u32[start[:m] + 4 * j]))
        tail_start = start + 4 * nwords
        tails = (lengths - 4 * words)[order]
        for t in range(3):
            sel = np.flatnonzero(tails > t)
            if not len(sel):
                break
            # Spark mixes each tail byte as a sign-extended int.
            byte = data[tail_start[sel] + t].astype(np.int8).astype(np.int32).view(np.uint32)
            h1[sel] = _mix_h1(h1[sel], _mix_k1(byte))
        h1 = _fmix(h1, lengths[order].astype(np.uint32))
    out[order] = h1.view(np.int32)
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


# --------------------------------------------------------------------------- split keys

#: A split key's events are spread over its instances by a point of each event's id in
#: ``[0, SPLIT_POINTS)``: ``pmod(hash(event_id), SPLIT_POINTS)`` (Spark SQL's ``hash``).
#: Every copy of an event (a producer's retry, a replay) gets the same point, so it goes
#: to the same instance, whose state drops the copy.
SPLIT_POINTS = 1 << 20


def split_points(event_ids) -> np.ndarray:
    """The point of each event id in ``[0, SPLIT_POINTS)``, as Spark computes it."""
    return np.mod(spark_hash_strings(event_ids).astype(np.int64), SPLIT_POINTS)


def share_bounds(shares) -> np.ndarray:
    """Upper bounds of the shares' point ranges, in the order given (by instance):
    ``floor(cumulative share * SPLIT_POINTS + 0.5)``. Spark computes the same doubles
    (a running sum in instance order) and the same rounding."""
    cumulative = np.cumsum(np.asarray(shares, dtype=np.float64))
    return np.floor(cumulative * SPLIT_POINTS + 0.5).astype(np.int64)


def split_instances(points, instances, shares) -> np.ndarray:
    """The instance of each point for one split key: ``instances`` (increasing) with their
    ``shares``; a point goes to the first instance whose upper bound is above it."""
    bounds = share_bounds(shares)
    index = np.searchsorted(bounds, np.asarray(points, dtype=np.int64), side="right")
    return np.asarray(instances, dtype=np.int64)[np.minimum(index, len(bounds) - 1)]
