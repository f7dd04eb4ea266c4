"""Route events to instances in Spark, and pin instance i to shuffle partition i.

An event's instance is ``F(k) = routing[k]`` when the key is in the current
assignment's routing table, else its default instance
``h(k) = group_instances(N)[pmod(hash(key), 4096)]`` (:mod:`rebalance.core.placement`).
A split key (several rows with shares) sends each event to one of its instances by the
point ``pmod(hash(event_id), 2^20)`` of the event's id in the shares' ranges
(:func:`rebalance.core.placement.split_instances`): deterministic per event, so a
replay or a retried copy goes where the first went.

The stateful operator groups by a *label* rather than by the instance: Spark
puts a grouping value ``v`` in shuffle partition ``pmod(hash(v), N)``, so the
label of instance ``i`` is the smallest non-negative int with
``pmod(hash(label), N) == i``. With ``spark.sql.shuffle.partitions = N``,
instance ``i`` then runs in partition ``i``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from rebalance.core.placement import (
    DEFAULT_KEY_GROUPS,
    SPLIT_POINTS,
    group_instances,
    share_bounds,
    spark_hash_int,
)

if TYPE_CHECKING:
    from rebalance.spark.tables import Assignment

#: Labels are searched among the first ints; 64 * N is always enough in practice.
_LABEL_SEARCH_FACTOR = 64


@lru_cache(maxsize=32)
def instance_labels(n_instances: int) -> tuple[int, ...]:
    """Label of each instance: the smallest int ``l >= 0`` with ``pmod(hash(l), N) == i``."""
    if n_instances < 1:
        raise ValueError(f"number of instances must be >= 1, got {n_instances}")
    labels: dict[int, int] = {}
    for label in range(_LABEL_SEARCH_FACTOR * n_instances + 64):
        labels.setdefault(spark_hash_int(label) % n_instances, label)
        if len(labels) == n_instances:
            return tuple(labels[i] for i in range(n_instances))
    missing = sorted(set(range(n_instances)) - set(labels))
    raise ValueError(f"no int label found for instances {missing}")


def key_group_col(key: Column) -> Column:
    """``pmod(hash(key), 4096)`` as INT: the key's key group."""
    return F.pmod(F.hash(key), F.lit(DEFAULT_KEY_GROUPS)).cast("int")


def int_array(values) -> Column:
    """A literal ARRAY<INT> (one SQL expression: building 4096 ``F.lit`` columns takes seconds)."""
    return F.expr("array(" + ", ".join(str(int(v)) for v in values) + ")")


def default_instance_col(key_group: Column, n_instances: int) -> Column:
    """Default instance of a key group for ``n_instances`` (jump consistent hash table)."""
    return F.element_at(int_array(group_instances(n_instances)), key_group + 1).cast("int")


def label_col(instance: Column, n_instances: int) -> Column:
    """The partition-pinning label of an instance column."""
    return F.element_at(int_array(instance_labels(n_instances)), instance + 1).cast("int")


def routes(assignment_rows: DataFrame) -> DataFrame:
    """One row per routed key: ``_instances`` (increasing) and ``_bounds``, the upper
    bounds of their shares' point ranges (a whole key: its instance, bound
    ``SPLIT_POINTS``). A key with a whole row beside others, or an instance twice, fails
    the batch (:func:`~rebalance.spark.tables.publish_assignment` prevents both)."""
    rows = assignment_rows.where(F.col("key").isNotNull())
    running = Window.partitionBy("key").orderBy("instance").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    share = F.coalesce(F.col("share"), F.lit(1.0))
    bounded = rows.withColumn("_bound", F.floor(
        F.sum(share).over(running) * F.lit(float(SPLIT_POINTS)) + F.lit(0.5)).cast("int"))
    parts = F.array_sort(F.collect_list(F.struct("instance", "_bound")))
    valid = (F.count(F.lit(1)) == 1) | (
        (F.count("share") == F.count(F.lit(1)))
        & (F.count_distinct("instance") == F.count(F.lit(1))))
    return (bounded.groupBy("key")
            .agg(parts.alias("_parts"), valid.alias("_valid"))
            .select("key", F.when(F.col("_valid"), F.col("_parts.instance")).otherwise(
                F.raise_error(F.concat(F.lit("assignment has several instances for key "),
                                       F.col("key")))).alias("_instances"),
                    F.col("_parts._bound").alias("_bounds")))


def split_point(event_id: Column) -> Column:
    """The point of an event's id in ``[0, SPLIT_POINTS)`` (:data:`SPLIT_POINTS`)."""
    return F.pmod(F.hash(event_id), F.lit(SPLIT_POINTS))


def share_instance(instances: str, bounds: str, point: Column) -> Column:
    """The instance of the share whose point range holds ``point``: ``instances`` and
    ``bounds`` name an event's key's instances (increasing) and the upper bounds of their
    ranges (one instance: that instance whatever the point); NULL for a key without them."""
    index = F.least(F.size(F.filter(bounds, lambda b: b <= point)), F.size(instances) - 1)
    return F.when(F.size(instances) == 1, F.element_at(instances, 1)).otherwise(
        F.element_at(instances, index + 1))


def route(events: DataFrame, assignment_rows: DataFrame, n_instances: int) -> DataFrame:
    """Add ``key_group``, ``default_instance``, ``instance``, ``label``, ``assignment_version``.

    ``assignment_rows`` is :func:`rebalance.spark.tables.assignment_rows` (a
    Delta read). In a streaming query this is a stream-static join: Delta
    re-reads the table for every micro-batch and both references below see the
    same snapshot, so every event of a batch is routed by one assignment version
    and carries that version. A key with two different whole instances, or an
    instance outside ``[0, N)``, fails the batch (the table is written by
    :func:`~rebalance.spark.tables.publish_assignment`, which prevents both). An event
    of a split key goes to the instance whose share range holds its id's point.
    """
    version = assignment_rows.agg(
        F.coalesce(F.max("assignment_version"), F.lit(0)).cast("bigint")
        .alias("assignment_version"))
    routed = (events
              .withColumn("key_group", key_group_col(F.col("key")))
              .withColumn("default_instance", default_instance_col(F.col("key_group"), n_instances))
              .join(F.broadcast(routes(assignment_rows)), "key", "left")
              .crossJoin(F.broadcast(version)))
    chosen = share_instance("_instances", "_bounds", split_point(F.col("event_id")))
    instance = F.coalesce(chosen, F.col("default_instance"))
    checked = F.when(instance.between(0, n_instances - 1), instance).otherwise(F.raise_error(
        F.concat(F.lit("assignment routes key "), F.col("key"), F.lit(" to instance "),
                 instance.cast("string"), F.lit(f", outside [0, {n_instances})"))))
    return (routed.withColumn("instance", checked.cast("int"))
            .withColumn("label", label_col(F.col("instance"), n_instances))
            .drop("_instances", "_bounds"))


def follow_assignment_rows(latest: DataFrame, fallback: DataFrame, blocked: list[int],
                           n_instances: int, pending: DataFrame | None = None,
                           in_force: int | None = None) -> DataFrame:
    """Routing rows of the latest assignment version, or of ``fallback`` when it cannot be used.

    ``latest`` and ``fallback`` are :func:`rebalance.spark.tables.assignment_rows` reads
    (the latest snapshot, re-read by Delta every micro-batch, and one pinned version, the
    one in force: ``in_force``). The latest version is used unless it is one of
    ``blocked`` (versions a controlled restart must bring in: published for a restart, or
    for another N), or one of the ``assignment_version`` values of ``pending`` (a static
    read, re-read every micro-batch: versions named by restart requests not yet done),
    unless it is the one in force, or routes a key outside ``[0, N)`` (a version for
    another N); then the pinned ``fallback`` routes the batch. Decided per micro-batch:
    the result feeds :func:`route` like a plain read.
    """
    latest_version = F.coalesce(F.max("assignment_version"), F.lit(0)).cast("bigint")
    in_range = (F.coalesce(F.max("instance"), F.lit(0)) < n_instances) & (
        F.coalesce(F.min("instance"), F.lit(0)) >= 0)
    usable = in_range if not blocked else (
        in_range & ~latest_version.isin([int(v) for v in blocked]))
    flag = latest.agg(usable.alias("_use_latest"), latest_version.alias("_latest"))
    if pending is not None:
        waiting = pending.agg(F.collect_set(F.col("assignment_version").cast("bigint"))
                              .alias("_pending"))
        ok = ~F.array_contains(F.col("_pending"), F.col("_latest"))
        if in_force is not None:
            ok = ok | (F.col("_latest") == F.lit(int(in_force)))
        flag = flag.crossJoin(waiting).select(
            (F.col("_use_latest") & ok).alias("_use_latest"))
    else:
        flag = flag.select("_use_latest")
    chosen = latest.crossJoin(flag).where(F.col("_use_latest"))
    other = fallback.crossJoin(flag).where(~F.col("_use_latest"))
    return chosen.unionByName(other).drop("_use_latest")


def route_keys(df: DataFrame, key: str, assignment: Assignment,
               n_instances: int, split_by: tuple[str, ...] = ()) -> DataFrame:
    """Add ``rb_key`` (the key as a string), ``rb_group``, ``rb_default``, ``rb_label``
    and ``rb_version``: the instance of each event's key under ``assignment`` (its routing
    table, else the default placement). The routing table is a local relation built on the
    driver from the one snapshot the query runs with: no table scan per micro-batch.

    An event of a split key goes to the share whose point range holds the hash of its
    ``split_by`` columns (default: all of them), as the built-in job places a split key's
    events by their id (:func:`rebalance.core.placement.split_instances`)."""
    keyed = df.withColumn("rb_key", F.col(key).cast("string"))
    routed = (keyed.withColumn("rb_group", key_group_col(F.col("rb_key")))
              .withColumn("rb_default", default_instance_col(F.col("rb_group"), n_instances))
              .withColumn("rb_version", F.lit(int(assignment.version)).cast("bigint")))
    instance = F.col("rb_default")
    if assignment.routing and assignment.splits:
        rows = []
        for k, i in assignment.routing.items():
            parts = assignment.splits.get(k)
            if parts:
                shares = sorted(parts.items())
                rows.append((k, [int(p) for p, _ in shares],
                             [int(b) for b in share_bounds([s for _, s in shares])]))
            else:
                rows.append((k, [int(i)], [SPLIT_POINTS]))
        table = df.sparkSession.createDataFrame(
            rows, "rb_key STRING, rb_instances ARRAY<INT>, rb_bounds ARRAY<INT>")
        routed = routed.join(F.broadcast(table), "rb_key", "left")
        point = split_point(F.struct(*[F.col(c) for c in (split_by or df.columns)]))
        routed = (routed.withColumn("rb_routed", share_instance("rb_instances", "rb_bounds", point))
                  .drop("rb_instances", "rb_bounds"))
        instance = F.coalesce(F.col("rb_routed"), instance)
    elif assignment.routing:
        table = df.sparkSession.createDataFrame(
            [(k, int(i)) for k, i in assignment.routing.items()], "rb_key STRING, rb_routed INT")
        routed = routed.join(F.broadcast(table), "rb_key", "left")
        instance = F.coalesce(F.col("rb_routed"), instance)
    checked = F.when(instance.between(0, n_instances - 1), instance).otherwise(F.raise_error(
        F.concat(F.lit("assignment routes key "), F.col("rb_key"), F.lit(" outside the "),
                 F.lit(str(n_instances)), F.lit(" instances"))))
    return routed.withColumn("rb_label", label_col(checked, n_instances)).drop("rb_routed")
