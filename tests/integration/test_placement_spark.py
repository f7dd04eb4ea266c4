"""The default placement computed in numpy equals Spark's own ``hash()`` on the same keys.

:func:`rebalance.core.placement.spark_hash_strings` reimplements Spark SQL's ``hash`` (Murmur3
x86_32, seed 42, over the UTF-8 bytes) so that ``rebalance plan`` knows where the job
routes a key without starting Spark. The streaming tests compare the job's
``default_instance`` with it on short ASCII keys; this test asks Spark directly, on keys
of every UTF-8 length class (1- to 4-byte characters, NUL, the largest code points),
every tail length (0-3 bytes after the last whole word), long keys (up to 4 KiB) and a
few thousand random ones, and also compares the key group and the default instance
(``pmod(hash, 4096)``, then jump consistent hash) with the Spark expression the job uses.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from rebalance.core.placement import (
    DEFAULT_KEY_GROUPS,
    default_instances,
    group_instances,
    key_groups,
    spark_hash_strings,
)

pytestmark = pytest.mark.slow


def _keys() -> list[str]:
    rng = random.Random(11)
    alphabet = ("abcXYZ019 _-:/.", "ßéüøñ", "€中文ह", "🙂𝄞🚀",
                "\u0000\u007f\u0080\u07ff\u0800\uffff\U00010000\U0010ffff")
    keys = ["", "a", "ab", "abc", "abcd", "abcde", "k0", "k9999999", "\u0000", "é", "€", "🙂",
            "\U0010ffff", "a\u0000", "\u0000a", "user:0000001234:session"]
    for n in range(0, 70):  # every length and tail length with every byte width
        for chars in alphabet:
            keys.append("".join(rng.choice(chars) for _ in range(n)))
    for n in (127, 128, 129, 255, 256, 1000, 1023, 1024, 4096):  # long keys
        keys.append("".join(rng.choice("".join(alphabet)) for _ in range(n)))
    for _ in range(3000):
        n = rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 55, 89])
        keys.append("".join(rng.choice("".join(alphabet)) for _ in range(n)))
    return list(dict.fromkeys(keys))


def test_spark_hash_of_unicode_and_long_keys_equals_spark(spark):
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    keys = _keys()
    frame = spark.createDataFrame([(i, k) for i, k in enumerate(keys)],
                                  StructType([StructField("i", IntegerType()),
                                              StructField("key", StringType())]))
    rows = (frame.select("i", F.hash("key").alias("h"),
                         F.pmod(F.hash("key"), F.lit(DEFAULT_KEY_GROUPS)).alias("g"))
            .orderBy("i").collect())
    assert [r["i"] for r in rows] == list(range(len(keys)))
    spark_hash = np.array([r["h"] for r in rows], dtype=np.int64)
    spark_group = np.array([r["g"] for r in rows], dtype=np.int64)
    ours = spark_hash_strings(keys).astype(np.int64)
    bad = np.flatnonzero(ours != spark_hash)
    assert len(bad) == 0, [(keys[i][:40], int(ours[i]), int(spark_hash[i])) for i in bad[:5]]
    assert np.array_equal(key_groups(keys), spark_group)
    # and the default instance the job uses (rebalance.streaming.routing) follows from it
    for n in (1, 7, 64, 1000):
        assert np.array_equal(default_instances(keys, n), group_instances(n)[spark_group])
    # every input form hashes the same (the CLI hands pyarrow arrays over)
    import pyarrow as pa

    for form in (np.array(keys, dtype=object), pa.array(keys, pa.string()),
                 pa.array(keys, pa.large_string()), pa.chunked_array([keys[:7], keys[7:]])):
        assert np.array_equal(spark_hash_strings(form).astype(np.int64), spark_hash)
