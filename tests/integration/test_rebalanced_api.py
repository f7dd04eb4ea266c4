"""A user's own StatefulProcessor under plain Spark and under rebalanced(): the same rows.

The sessionization example (examples/sessions.py: a ValueState per user and an
event-time timer at the last click + 30 minutes) runs on the same clicks twice, fed in
the same phases (each Delta commit one micro-batch): once as
``groupBy("user_id").transformWithStateInPandas`` and once through ``rebalanced`` over
N = 3 instances, where, between the phases, a new assignment version moves the three
busiest users (with open sessions and pending timers) to other instances. The sessions
emitted are equal as a multiset; the moved users' state arrived exactly once; the
histograms count every click under the instance that processed it.
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


def _write(spark, path: str, frame: pd.DataFrame) -> None:
    (spark.createDataFrame(frame, sessions.CLICKS_SCHEMA).coalesce(1).write.format("delta")
     .mode("append").save(path))


def _stream(spark, path: str):
    return (spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(path)
            .withWatermark("click_time", "10 minutes"))


def _rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.select("user_id", "session_start", "session_end",
                                              "clicks").collect())


@pytest.fixture(scope="module")
def scenario(spark, tmp_path_factory):
    from rebalance.spark import tables
    from rebalance.streaming.rebalanced import rebalanced, switches

    spark.conf.set("spark.sql.session.timeZone", "UTC")
    root = tmp_path_factory.mktemp("rebalanced")
    phases = _clicks()
    plain_in, reb_in = str(root / "plain_clicks"), str(root / "reb_clicks")
    plain_out, reb_out = str(root / "plain_sessions"), str(root / "reb_sessions")
    tables_root = str(root / "tables")

    # plain Spark, fed phase by phase
    for frame in phases[0]:
        _write(spark, plain_in, frame)
    plain = (_stream(spark, plain_in).groupBy("user_id")
             .transformWithStateInPandas(sessions.Sessionize(), sessions.SESSION_SCHEMA,
                                         "Append", "EventTime")
             .writeStream.format("delta").option("checkpointLocation", str(root / "plain_chk"))
             .trigger(processingTime="1 second").start(plain_out))
    plain.processAllAvailable()
    for frame in phases[1]:
        _write(spark, plain_in, frame)
    plain.processAllAvailable()
    plain.stop()

    # rebalanced, the same phases, a move between them
    for frame in phases[0]:
        _write(spark, reb_in, frame)
    job = rebalanced(_stream(spark, reb_in), key="user_id", processor=sessions.Sessionize(),
                     output_schema=sessions.SESSION_SCHEMA, time_mode="EventTime",
                     event_time="click_time", job="sessions", instances=N,
                     tables_root=tables_root, window_seconds=600)
    query = job.start(output=reb_out, checkpoint=str(root / "reb_chk"), trigger_seconds=1)
    query.process_all_available()
    first = pd.concat(phases[0])
    busiest = list(first["user_id"].value_counts().index[:3])
    hist = tables.read(spark, tables.KEY_HISTOGRAMS, tables_root).toPandas()
    where = hist.groupby("key")["instance"].first()
    moves = {u: (int(where.get(u, 0)) + 1) % N for u in busiest}
    version = tables.publish_assignment(spark, moves, N, root=tables_root)
    switched_to = query.switch()
    for frame in phases[1]:
        _write(spark, reb_in, frame)
    query.process_all_available()
    query.stop()
    return dict(plain=_rows(spark.read.format("delta").load(plain_out)),
                rebalanced=_rows(spark.read.format("delta").load(reb_out)),
                version=version, switched_to=switched_to, moves=moves,
                switches=switches(spark, str(root / "reb_chk")),
                control=spark.read.format("delta").load(str(root / "reb_chk" / "_rebalance" /
                                                            "control")).toPandas(),
                hist=tables.read(spark, tables.KEY_HISTOGRAMS, tables_root).toPandas(),
                clicks=pd.concat(phases[0] + phases[1]))


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
    clicks = scenario["clicks"]["user_id"].value_counts()
    assert (closed <= clicks.reindex(closed.index)).all()
    assert closed.sum() > 0.5 * len(scenario["clicks"])
