"""A user's own StatefulProcessor under plain Spark and under rebalanced(): the same rows.

Each example runs on the same events twice, fed in the same phases (each Delta commit
one micro-batch): once as ``groupBy(key).transformWithStateInPandas`` and once through
``rebalanced`` over N = 3 instances, where, between the phases, a new assignment version
moves the three busiest keys to other instances:

* examples/sessions.py: a ValueState per user and an event-time timer at the last
  click + 30 minutes (the moved users have open sessions and pending timers);
* (not yet here: examples/device_readings.py runs in ProcessingTime mode, where Spark
  runs a batch at every trigger, so "everything processed" needs another wait.)

The outputs are equal as multisets; each moved key's state arrived exactly once; the
histograms count every event under the instance that processed it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
N = 3
T0_MS = 1_704_067_200_000


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sessions = _example("sessions")


def _clicks(n_users: int = 24, n_phases: int = 2, batches: int = 4, seed: int = 3):
    """Per phase, per batch, a frame of clicks in increasing time (no click is late):
    Zipf-skewed users, gaps that both continue and end sessions."""
    rng = np.random.default_rng(seed)
    users = [f"u{i:02d}" for i in range(n_users)]
    weights = 1.0 / np.arange(1, n_users + 1)
    weights /= weights.sum()
    out, t = [], T0_MS
    for _ in range(n_phases):
        phase = []
        for _ in range(batches):
            n = 60
            times = t + np.sort(rng.integers(0, 20 * 60_000, n))
            who = rng.choice(users, size=n, p=weights)
            phase.append(pd.DataFrame({"user_id": who, "page": [f"p{i % 7}" for i in range(n)],
                                       "click_time": pd.to_datetime(times, unit="ms")}))
            t += 25 * 60_000
        out.append(phase)
    return out


def _write(spark, path: str, frame: pd.DataFrame, schema: str) -> None:
    spark.createDataFrame(frame, schema).coalesce(1).write.format("delta").mode("append").save(path)


def _stream(spark, path: str, watermark: str | None):
    df = spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(path)
    return df.withWatermark(watermark, "10 minutes") if watermark else df


def _run_both(spark, root: Path, phases, *, make, in_schema, out_schema, key, time_mode,
              event_time, watermark, job, window_seconds, available_now=False):
    """The processor on the same phases under plain Spark and under rebalanced() with a
    move of the three busiest keys between the phases; both outputs and what the move did."""
    from rebalance.spark import tables
    from rebalance.streaming.rebalanced import rebalanced, switches

    plain_in, reb_in = str(root / "plain_in"), str(root / "reb_in")
    plain_out, reb_out = str(root / "plain_out"), str(root / "reb_out")
    tables_root = str(root / "tables")
    for frame in phases[0]:
        _write(spark, plain_in, frame, in_schema)
    # ProcessingTime mode runs a batch at every trigger (processing-time timers and TTL),
    # so "all processed" is only known with availableNow: one query run per phase
    def plain_run():
        writer = (_stream(spark, plain_in, watermark).groupBy(key)
                  .transformWithStateInPandas(make(), out_schema, "Append", time_mode)
                  .writeStream.format("delta")
                  .option("checkpointLocation", str(root / "plain_chk")))
        return (writer.trigger(availableNow=True) if available_now
                else writer.trigger(processingTime="1 second")).start(plain_out)

    plain = plain_run()
    plain.awaitTermination() if available_now else plain.processAllAvailable()
    for frame in phases[1]:
        _write(spark, plain_in, frame, in_schema)
    if available_now:
        plain_run().awaitTermination()
    else:
        plain.processAllAvailable()
        plain.stop()

    for frame in phases[0]:
        _write(spark, reb_in, frame, in_schema)
    stream = rebalanced(_stream(spark, reb_in, watermark), key=key, processor=make(),
                        output_schema=out_schema, time_mode=time_mode, event_time=event_time,
                        job=job, instances=N, tables_root=tables_root,
                        window_seconds=window_seconds)
    query = stream.start(output=reb_out, checkpoint=str(root / "reb_chk"),
                         trigger_seconds=None if available_now else 1)
    query.process_all_available()
    busiest = list(pd.concat(phases[0])[key].value_counts().index[:3])
    hist = tables.read(spark, tables.KEY_HISTOGRAMS, tables_root).toPandas()
    where = hist.groupby("key")["instance"].first()
    moves = {k: (int(where.get(k, 0)) + 1) % N for k in busiest}
    version = tables.publish_assignment(spark, moves, N, root=tables_root)
    switched_to = query.switch()
    for frame in phases[1]:
        _write(spark, reb_in, frame, in_schema)
    query.resume()
    query.process_all_available()
    query.stop()
    columns = [c.split()[0] for c in out_schema.split(", ")]

    def rows(path):
        return sorted(tuple(r) for r in spark.read.format("delta").load(path)
                      .select(*columns).collect())

    return dict(plain=rows(plain_out), rebalanced=rows(reb_out), version=version,
                switched_to=switched_to, moves=moves,
                switches=switches(spark, str(root / "reb_chk")),
                control=spark.read.format("delta").load(
                    str(root / "reb_chk" / "_rebalance" / "control")).toPandas(),
                hist=tables.read(spark, tables.KEY_HISTOGRAMS, tables_root).toPandas(),
                inputs=pd.concat(phases[0] + phases[1]))


@pytest.fixture(scope="module")
def scenario(spark, tmp_path_factory):
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return _run_both(spark, tmp_path_factory.mktemp("sessions"), _clicks(),
                     make=sessions.Sessionize, in_schema=sessions.CLICKS_SCHEMA,
                     out_schema=sessions.SESSION_SCHEMA, key="user_id", time_mode="EventTime",
                     event_time="click_time", watermark="click_time", job="sessions",
                     window_seconds=600)


def test_sessions_equal_plain_spark(scenario):
    assert scenario["plain"], "the plain run closed no session"
    assert scenario["rebalanced"] == scenario["plain"]


def test_moved_users_state_moved_once(scenario):
    assert scenario["switched_to"] == scenario["version"]
    assert [v for _, v in scenario["switches"]] == [scenario["version"]]
    moved = scenario["control"][scenario["control"]["kind"] == "in"]
    from rebalance.streaming.rebalanced import payload_of

    keys = sorted(payload_of(r)["key"] for r in moved.itertuples())
    assert keys == sorted(scenario["moves"]), "each moved user's state is handed over once"


def test_histograms_count_every_click_on_its_instance(scenario):
    hist, moves = scenario["hist"], scenario["moves"]
    after = hist[hist["assignment_version"] == scenario["version"]]
    for user, instance in moves.items():
        assert set(after.loc[after["key"] == user, "instance"]) <= {instance}
    closed = hist.groupby("key")["count"].sum()
    clicks = scenario["inputs"]["user_id"].value_counts()
    assert (closed <= clicks.reindex(closed.index)).all()
    assert closed.sum() > 0.5 * len(scenario["inputs"])


def test_refusals_name_the_part(spark):
    from rebalance.streaming.keyed_state import ContractError
    from rebalance.streaming.rebalanced import rebalanced

    df = spark.createDataFrame([("a", 1.0)], "k STRING, v DOUBLE")
    ok = dict(key="k", processor=sessions.Sessionize(), output_schema="k STRING",
              job="j", instances=2)
    cases = [
        (dict(key="missing"), "key column 'missing' is not a column"),
        (dict(key="v"), "key column 'v' has type double"),
        (dict(processor=object()), "processor must be a pyspark StatefulProcessor"),
        (dict(time_mode="Event"), "time_mode must be one of"),
        (dict(time_mode="EventTime"), "time_mode EventTime needs event_time"),
        (dict(output_mode="Complete"), "output_mode must be Append or Update"),
        (dict(output_schema="rb_kind STRING"), "starting with 'rb_'"),
        (dict(instances=0), "instances must be an integer >= 1"),
    ]
    for change, message in cases:
        with pytest.raises(ContractError, match=message.replace("(", r"\(")):
            rebalanced(df, **{**ok, **change})
