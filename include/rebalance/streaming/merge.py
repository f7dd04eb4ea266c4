"""How the partial results of a split key merge: the user's declaration, and the merge.

A split key's events go to several instances, each running the user's processor on its
part with a state of its own; that is exact only for decomposable results. The user
declares them with :class:`Merge` (the columns ``on`` that identify a result, and how each
other column combines: sum, min or max); without it ``rebalanced()`` refuses assignments
that split keys. The sink merges, per micro-batch, the rows of one result that came from
more than one instance (:func:`merged`). Why and when this is exact: ``docs/processors.md``,
"Split keys" and "Inside: routing, the host, the state layout, the merge".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    MapType,
    NumericType,
    StructType,
)

from rebalance.streaming.keyed_state import ContractError


def _names(value: str | Iterable[str] | None, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    names = tuple(value)
    if not all(isinstance(n, str) and n for n in names):
        raise ContractError(f"Merge {what} must be column names, got {value!r}")
    return names


@dataclass(frozen=True, init=False)
class Merge:
    """The declaration that a processor's partial results merge (:mod:`this module
    <rebalance.streaming.merge>`).

    ``on``: the output columns that identify one result of a key (its key column, a
    window start, ...). ``sum``, ``min``, ``max``: how every other output column of the
    rows of one result combines. ``split_by``: the input columns whose hash sends each
    event of a split key to one of its instances (default: every column of the stream;
    the choice is deterministic, so a replayed event goes where it went first).

    The processor must emit each result of a key at most once per instance, in the
    micro-batch in which the result is complete there: for example, when the watermark
    passes the end of its window (every instance sees the same watermark, so the parts of
    one result are emitted, and merged, in the same micro-batch)."""

    on: tuple[str, ...]
    sum: tuple[str, ...]
    min: tuple[str, ...]
    max: tuple[str, ...]
    split_by: tuple[str, ...]

    def __init__(self, on: str | Iterable[str], *, sum: str | Iterable[str] | None = None,  # noqa: A002
                 min: str | Iterable[str] | None = None,  # noqa: A002
                 max: str | Iterable[str] | None = None,  # noqa: A002
                 split_by: str | Iterable[str] | None = None) -> None:
        for name, value in (("on", _names(on, "on")), ("sum", _names(sum, "sum")),
                            ("min", _names(min, "min")), ("max", _names(max, "max")),
                            ("split_by", _names(split_by, "split_by"))):
            object.__setattr__(self, name, value)
        if not self.on:
            raise ContractError("Merge needs on: the output columns that identify one result")

    def check(self, output_schema: StructType, input_columns: list[str]) -> None:
        """Refuse, in one line, a declaration that does not fit the output schema (every
        output column named exactly once: in ``on`` or by one combination) or the input
        (``split_by``)."""
        named: dict[str, str] = {}
        for part in ("on", "sum", "min", "max"):
            for column in getattr(self, part):
                if column in named:
                    raise ContractError(f"Merge names output column {column!r} twice "
                                        f"({named[column]} and {part})")
                named[column] = part
        columns = output_schema.fieldNames()
        unknown = [c for c in named if c not in columns]
        if unknown:
            raise ContractError(f"Merge names {unknown}, not columns of the output schema "
                                f"({', '.join(columns)})")
        missing = [c for c in columns if c not in named]
        if missing:
            raise ContractError(f"Merge does not say how output column(s) {missing} combine: "
                                "name each in on, sum, min or max")
        for column in self.sum:
            kind = output_schema[column].dataType
            if not isinstance(kind, NumericType):
                raise ContractError(f"Merge sums {column!r}, of type {kind.simpleString()}; "
                                    "sum takes numeric columns")
        for column in self.min + self.max:
            kind = output_schema[column].dataType
            if isinstance(kind, (ArrayType, MapType, StructType, BinaryType)):
                raise ContractError(f"Merge takes the min or max of {column!r}, of type "
                                    f"{kind.simpleString()}; min and max take ordered "
                                    "scalar columns")
        absent = [c for c in self.split_by if c not in input_columns]
        if absent:
            raise ContractError(f"Merge split_by {absent} are not columns of the stream "
                                f"({', '.join(input_columns)})")


def merged(rows: DataFrame, merge: Merge, output_schema: StructType) -> DataFrame:
    """The user's output rows of a micro-batch (with ``rb_key`` and ``rb_instance``, the
    key and the instance of each row), each result that came from several instances
    merged into one row; the output schema's columns."""
    columns = output_schema.fieldNames()
    result = Window.partitionBy("rb_key", *merge.on)
    parts = rows.withColumn("rb_parts", F.min("rb_instance").over(result)
                            != F.max("rb_instance").over(result))
    whole = parts.where(~F.col("rb_parts")).select(*columns)
    combine = {**{c: F.sum for c in merge.sum}, **{c: F.min for c in merge.min},
               **{c: F.max for c in merge.max}}
    combined = (parts.where(F.col("rb_parts")).groupBy("rb_key", *merge.on)
                .agg(*[combine[c](c).cast(output_schema[c].dataType).alias(c) for c in combine])
                if combine else parts.where(F.col("rb_parts")).select("rb_key", *merge.on)
                .dropDuplicates())
    return whole.unionByName(combined.select(*columns))
