"""Key order without a hash table: the sort that finds distinct keys and their positions.

Histogram and assignment keys are sorted together by their UTF-8 bytes (code point
order) with :func:`string_order`, a radix-like sort on 8-byte big-endian prefixes;
:func:`sorted_keys` gives the distinct keys and where every row's key is. Pure
pyarrow/numpy; used by :mod:`rebalance.core.histograms`.
"""

from __future__ import annotations

import numpy as np

from rebalance.core.histogram_files import InputError
from rebalance.core.placement import padded_buffers, unaligned_view


def arrow_array(values: np.ndarray):
    """A numpy int64, float64 or bool array as a pyarrow array, without importing pandas
    (``pyarrow.array`` does: see :func:`_numpy`)."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    if values.dtype == bool:
        bits = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])
    types = {np.dtype(np.int64): pa.int64(), np.dtype(np.float64): pa.float64()}
    return pa.Array.from_buffers(types[values.dtype], len(values),
                                 [None, pa.py_buffer(values)])


def python_strings(keys) -> np.ndarray:
    """A pyarrow string array as a numpy object array of Python strings (no pandas)."""
    out = np.empty(len(keys), dtype=object)
    out[:] = keys.to_pylist()
    return out


def string_order(keys, distinct: bool = False):
    """The permutation that sorts ``keys`` by their UTF-8 bytes (= code point order).

    A radix-like sort in numpy: keys are ordered by their first 8 bytes read as one
    big-endian uint64 (zero past the end of a key), then only the keys still tied are
    ordered by their next 8 bytes within their tie, and so on; keys equal on every byte
    they have are ordered by length (a key before its extensions with NUL bytes). For keys
    of up to 8 bytes one ``argsort`` of uint64 does all the work, far faster than sorting
    them as Python strings (``sorted``, ``np.sort`` of objects; figures:
    ``docs/planning.md``, "Scale"). With ``distinct`` also returns a boolean array over the
    sorted positions: True where a key differs from the one before (equal keys end up
    next to each other).
    """
    return _string_order(*padded_buffers([keys]), distinct=distinct)


def _string_order(data: np.ndarray, offsets: np.ndarray, distinct: bool = False):
    """:func:`string_order` of keys given as bytes (followed by 8 zero bytes) and offsets."""
    n = len(offsets) - 1
    first = np.ones(n, dtype=bool)
    if n < 2:
        order = np.arange(n, dtype=np.int64)
        return (order, first) if distinct else order
    lengths = np.diff(offsets)
    starts = offsets[:-1]
    words = unaligned_view(data, "<u8")
    # Without NUL bytes, zero padding cannot be confused with key bytes: keys with equal
    # chunks up to their length are equal, and no length step is needed.
    nul = bool((data[:offsets[-1]] == 0).any())
    longest = int(lengths.max())
    # masks[b] keeps the first b bytes of a big-endian chunk (the rest are other keys')
    masks = np.array([0] + [((1 << (8 * b)) - 1) << (8 * (8 - b)) for b in range(1, 9)],
                     dtype=np.uint64)

    def chunk(idx: np.ndarray | None, j: int) -> np.ndarray:
        st = starts if idx is None else starts[idx]
        size = lengths if idx is None else lengths[idx]
        value = words[np.minimum(st + 8 * j, len(words) - 1) if j else st]
        value.byteswap(inplace=True)
        short = np.flatnonzero(size < 8 * (j + 1))  # chunks that end inside 8 bytes
        value[short] &= masks[np.clip(size[short] - 8 * j, 0, 8)]
        return value

    value = chunk(None, 0)
    order = np.argsort(value)
    value = value[order]
    np.not_equal(value[1:], value[:-1], out=first[1:])  # a new group of equal prefixes
    del value
    j = 1
    while not first.all() and (nul or 8 * j < longest):
        # Only the positions in groups of >= 2 (ties) are looked at again.
        tied = np.flatnonzero(~first | np.append(~first[1:], False))
        starts_group = first[tied]
        g = np.cumsum(starts_group)
        ids = order[tied]
        size = lengths[ids]
        if 8 * j >= int(size.max()):
            # Every byte compared: equal keys, or keys that differ by trailing NUL bytes.
            differ = size[1:] != size[:-1]
            if (differ & ~starts_group[1:]).any():
                sub = np.lexsort((size, g))
                order[tied], size = ids[sub], size[sub]
                differ = size[1:] != size[:-1]
            first[tied[1:]] |= differ
            break
        c = chunk(ids, j)
        sub = np.lexsort((c, g))  # g is sorted already: this orders within each group
        order[tied], c = ids[sub], c[sub]
        first[tied[1:]] |= c[1:] != c[:-1]
        j += 1
    return (order, first) if distinct else order


def sorted_keys(*arrays):
    """The distinct keys of the string ``arrays`` in byte order, and where each item is.

    Returns (the distinct keys, sorted, as a pyarrow large_string array; for each input
    array an int64 array of the positions of its items in those keys). All items are
    sorted together by :func:`string_order`, which also tells equal neighbours apart, so
    no hash table is built (the sort costs less than ``pyarrow.compute.dictionary_encode``
    alone).
    """
    import pyarrow as pa

    data, offsets = padded_buffers(arrays)
    order, first = _string_order(data, offsets, distinct=True)
    rank = np.cumsum(first, dtype=np.int64)
    rank -= 1
    codes = np.empty(len(order), dtype=np.int64)
    codes[order] = rank
    del rank
    positions, at = [], 0
    for a in arrays:
        positions.append(codes[at:at + len(a)])
        at += len(a)
    del codes
    both = pa.Array.from_buffers(pa.large_string(), len(order),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return both.take(arrow_array(order[first])), positions


def refuse_duplicates(positions: np.ndarray, keys) -> None:
    """Refuse an assignment whose items (``positions`` into the sorted ``keys``) repeat a key."""
    counts = np.bincount(positions, minlength=len(keys))
    dup = np.flatnonzero(counts > 1)
    if len(dup):
        names = [keys[int(i)].as_py() for i in dup[:3]]
        raise InputError(f"assignment lists {len(dup)} key(s) more than once, e.g. "
                         f"{', '.join(repr(k) for k in names)}")
