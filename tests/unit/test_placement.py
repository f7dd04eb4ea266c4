"""Default placement: the vectorised Spark hash against a key-by-key reference, input forms.

The reference below is Spark's ``Murmur3_x86_32.hashUnsafeBytes`` written out one key at a
time in plain Python (``org.apache.spark.unsafe.hash.Murmur3_x86_32``): whole 4-byte
little-endian words, then every tail byte as a sign-extended int, then ``fmix`` with the
byte length. Equality with Spark itself is tested in
``tests/integration/test_placement_spark.py`` (slow).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalance.core.placement import (
    DEFAULT_KEY_GROUPS,
    default_instances,
    group_instances,
    key_groups,
    padded_buffers,
    spark_hash_int,
    spark_hash_strings,
    unaligned_view,
    utf8_buffers,
)

M = 0xFFFFFFFF


def _mix_k1(k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & M
    k1 = ((k1 << 15) | (k1 >> 17)) & M
    return (k1 * 0x1B873593) & M


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = ((h1 << 13) | (h1 >> 19)) & M
    return (h1 * 5 + 0xE6546B64) & M


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & M
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & M
    return h1 ^ (h1 >> 16)


def reference_hash(key: str, seed: int = 42) -> int:
    data = key.encode("utf-8")
    h1 = seed
    aligned = len(data) - len(data) % 4
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i:i + 4], "little")))
    for b in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1((b - 256 if b > 127 else b) & M))  # signed byte
    h = _fmix(h1, len(data))
    return h - (1 << 32) if h >= 1 << 31 else h


KEYS = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(KEYS, max_size=60))
def test_vectorised_hash_equals_the_key_by_key_reference(keys):
    assert spark_hash_strings(keys).tolist() == [reference_hash(k) for k in keys]


def test_long_keys_and_every_tail_length():
    keys = ["x" * n for n in range(0, 40)] + ["é" * 600, "🙂" * 1024, "ab\u0000cd" * 300]
    assert spark_hash_strings(keys).tolist() == [reference_hash(k) for k in keys]


@pytest.mark.parametrize("form", ["list", "object", "unicode", "string", "large_string",
                                  "chunked", "sliced", "tuple", "generator"])
def test_every_input_form_hashes_the_same(form):
    keys = ["k1", "k22", "", "é€", "a\u0000", "\u0000b", "🙂🙂🙂🙂🙂"]
    make = {
        "list": lambda: list(keys),
        "object": lambda: np.array(keys, dtype=object),
        # numpy's own str arrays drop trailing NULs, as Python does when reading them
        "unicode": lambda: np.array(keys),
        "string": lambda: pa.array(keys, pa.string()),
        "large_string": lambda: pa.array(keys, pa.large_string()),
        "chunked": lambda: pa.chunked_array([keys[:3], keys[3:]]),
        "sliced": lambda: pa.array(["pad", *keys, "pad"]).slice(1, len(keys)),
        "tuple": lambda: tuple(keys),
        "generator": lambda: (k for k in keys),
    }[form]
    expected = [reference_hash(str(k)) for k in (np.array(keys) if form == "unicode" else keys)]
    assert spark_hash_strings(make()).tolist() == expected


def test_non_string_keys_hash_as_their_str():
    assert spark_hash_strings([1, None, 2.5]).tolist() == [reference_hash(s) for s in
                                                           ("1", "None", "2.5")]
    assert spark_hash_strings(np.arange(3)).tolist() == [reference_hash(str(i)) for i in range(3)]
    assert spark_hash_strings(pa.array(["a", None])).tolist() == [reference_hash("a"),
                                                                  reference_hash("None")]
    assert spark_hash_strings([]).tolist() == []


def test_spark_hash_int_matches_the_reference_on_four_bytes():
    for v in (0, 1, -1, 7, 2 ** 31 - 1):
        h1 = _mix_h1(42, _mix_k1(v & M))
        h = _fmix(h1, 4)
        assert spark_hash_int(v) == (h - (1 << 32) if h >= 1 << 31 else h)


def test_groups_and_default_instances_follow_from_the_hash():
    keys = [f"key-{i}" for i in range(500)]
    groups = key_groups(keys)
    assert groups.tolist() == [reference_hash(k) % DEFAULT_KEY_GROUPS for k in keys]
    assert np.array_equal(default_instances(keys, 5), group_instances(5)[groups])
    assert np.array_equal(key_groups(pa.array(keys)), groups)


def test_buffers_and_unaligned_view():
    data, offsets = utf8_buffers(pa.array(["ab", "", "é"]).slice(0, 3))
    assert bytes(data[offsets[0]:offsets[-1]]) == "abé".encode()
    assert offsets.tolist() == [0, 2, 2, 4]
    joined, off = padded_buffers([pa.array(["ab", "c"]).slice(1), ["dé"]], pad=8)
    assert bytes(joined[:off[-1]]) == "cdé".encode() and off.tolist() == [0, 1, 4]
    assert joined[off[-1]:].tolist() == [0] * 8
    view = unaligned_view(np.frombuffer(b"\x01\x02\x03\x04\x05", dtype=np.uint8), "<u4")
    assert view.tolist() == [0x04030201, 0x05040302]
    assert not view.flags.writeable
