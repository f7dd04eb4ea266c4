"""End-to-end check that Spark, Delta and the project's configuration work here.

Used by the ``rebalance_healthcheck`` DAG on Airflow workers and by
``tests/integration/test_foundation.py``: a Delta table written twice with commit
metadata (``userMetadata``), read back with its history.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

from rebalance.spark.paths import data_dir


@dataclass(frozen=True)
class RoundTrip:
    path: str
    rows: int
    versions: list[int]
    user_metadata: list[dict]


def delta_round_trip(path: str | Path | None = None, spark=None) -> RoundTrip:
    """Write a small Delta table twice with commit metadata, read it and its history back."""
    from rebalance.spark import delta_rs
    from rebalance.spark.session import get_spark

    spark = spark or get_spark("rebalance-healthcheck")
    path = str(path or data_dir() / "healthcheck" / uuid.uuid4().hex)
    df = spark.createDataFrame([(f"k{i}", i) for i in range(10)], "key string, count long")
    for version, mode in enumerate(("overwrite", "append")):
        meta = json.dumps({"check": "delta_round_trip", "step": version})
        df.write.format("delta").mode(mode).option("userMetadata", meta).save(path)
    rows = spark.read.format("delta").load(path).count()
    history = sorted(delta_rs.history(path), key=lambda c: c.version)
    return RoundTrip(
        path=path,
        rows=rows,
        versions=[c.version for c in history],
        user_metadata=[c.metadata for c in history],
    )
