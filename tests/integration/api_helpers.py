"""What the equality tests of a processor under plain Spark and under rebalanced() share:
the events written a micro-batch per Delta commit, both runs, their rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

N = 3
T0_MS = 1_704_067_200_000


def write(spark, path: str, frame: pd.DataFrame, schema: str) -> None:
    spark.createDataFrame(frame, schema).coalesce(1).write.format("delta").mode("append").save(path)


def stream_of(spark, path: str, watermark: str | None):
    df = spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(path)
    return df.withWatermark(watermark, "10 minutes") if watermark else df


def rows_of(spark, path: str, out_schema: str) -> list[tuple]:
    columns = [c.split()[0] for c in out_schema.split(", ")]
    return sorted(tuple(r) for r in spark.read.format("delta").load(path)
                  .select(*columns).collect())


def run_plain(spark, root: Path, phases, *, make, in_schema, out_schema, key, time_mode,
              watermark) -> list[tuple]:
    """The processor on the phases under plain ``groupBy(key).transformWithStateInPandas``
    (one query; it waits until a batch read no row after each phase): its output rows."""
    from rebalance.streaming.rebalanced import wait_caught_up

    plain_in, plain_out = str(root / "plain_in"), str(root / "plain_out")
    query = None
    for phase in phases:
        for frame in phase:
            write(spark, plain_in, frame, in_schema)
        if query is None:
            query = (stream_of(spark, plain_in, watermark).groupBy(key)
                     .transformWithStateInPandas(make(), out_schema, "Append", time_mode)
                     .writeStream.format("delta")
                     .option("checkpointLocation", str(root / "plain_chk"))
                     .trigger(processingTime="1 second").start(plain_out))
        wait_caught_up(query)
    query.stop()
    return rows_of(spark, plain_out, out_schema)


def run_both(spark, root: Path, phases, *, make, in_schema, out_schema, key, time_mode,
             event_time, watermark, job, window_seconds, then_instances: int | None = None):
    """The processor on the same phases under plain Spark and under rebalanced() (in this
    process) with a move of the three busiest keys between the first two phases and, with
    ``then_instances``, a change of N to it (every key on its default instance) before the
    third; both outputs and what the moves did."""
    from rebalance.spark import tables
    from rebalance.streaming.rebalanced import rebalanced, switches

    plain = run_plain(spark, root, phases, make=make, in_schema=in_schema, out_schema=out_schema,
                      key=key, time_mode=time_mode, watermark=watermark)
    reb_in, reb_out, tables_root = str(root / "reb_in"), str(root / "reb_out"), str(root / "tables")
    for frame in phases[0]:
        write(spark, reb_in, frame, in_schema)
    stream = rebalanced(stream_of(spark, reb_in, watermark), key=key, processor=make(),
                        output_schema=out_schema, time_mode=time_mode, event_time=event_time,
                        job=job, instances=N, tables_root=tables_root,
                        window_seconds=window_seconds)
    query = stream.start(output=reb_out, checkpoint=str(root / "reb_chk"), trigger_seconds=1)
    query.process_all_available()
    busiest = list(pd.concat(phases[0])[key].value_counts().index[:3])
    hist = tables.read(spark, tables.KEY_HISTOGRAMS, tables_root).toPandas()
    where = hist.groupby("key")["instance"].first()
    moves = {k: (int(where.get(k, 0)) + 1) % N for k in busiest}
    version = tables.publish_assignment(spark, moves, N, root=tables_root)
    switched_to = query.switch()
    for frame in phases[1]:
        write(spark, reb_in, frame, in_schema)
    query.resume()
    query.process_all_available()
    resized = None
    if then_instances is not None:
        tables.resize_assignments(spark, then_instances, tables_root)
        resized = tables.publish_assignment(spark, {}, then_instances, root=tables_root)
        assert query.switch() == resized and query.instances == then_instances
        for phase in phases[2:]:
            for frame in phase:
                write(spark, reb_in, frame, in_schema)
            query.resume()
            query.process_all_available()
    query.stop()
    return dict(plain=plain, rebalanced=rows_of(spark, reb_out, out_schema), version=version,
                switched_to=switched_to, moves=moves, resized=resized,
                switches=switches(spark, str(root / "reb_chk")),
                control=spark.read.format("delta").load(
                    str(root / "reb_chk" / "_rebalance" / "control")).toPandas(),
                hist=tables.read(spark, tables.KEY_HISTOGRAMS, tables_root).toPandas(),
                instances=tables.read(spark, tables.INSTANCE_HISTOGRAMS, tables_root).toPandas(),
                inputs=pd.concat([frame for phase in phases for frame in phase]))
