"""A user's own StatefulProcessor under plain Spark and under rebalanced(): the same rows.

Each example runs on the same events twice, fed in the same phases (each Delta commit
one micro-batch): once as ``groupBy(key).transformWithStateInPandas`` and once through
``rebalanced`` over N = 3 instances, where, between the phases, a new assignment version
moves the three busiest keys to other instances:

* examples/sessions.py: a ValueState per user and an event-time timer at the last
  click + 30 minutes (the moved users have open sessions and pending timers);
* examples/device_readings.py: a MapState of the ids seen with a one-hour TTL and a
  ListState of the last readings per device, in ProcessingTime mode (retries of a
  reading arrive in the same and in later micro-batches, across the move).

The sessions job runs rebalanced in a process of its own, killed (SIGKILL of its group)
during the move and restarted on the same checkpoint; the devices job in this process.
The outputs are equal as multisets; each moved key's state arrived exactly once; the
histograms count every event under the instance that processed it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from api_helpers import T0_MS, N, rows_of, run_both, run_plain, stream_of, write
from pyspark.sql.streaming.query import StreamingCheckpointManager

from rebalance.streaming.restart.checkpoint import log_ids

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
#: Histogram windows of the sessions run: an hour, so the window of minutes 60-120 holds
#: clicks of both phases (the move comes between them).
WINDOW_SECONDS = 3600


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sessions = _example("sessions")
devices = _example("device_readings")


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


#: The sessions job in a process of its own (argv: repo, root, step, moves as JSON):
#: ``move`` catches up on the input, publishes the moves and switches to them (the test
#: kills it meanwhile); ``resume`` restarts from the checkpoint and processes everything.
DRIVER_CHILD = r'''
import importlib.util, json, sys
from pathlib import Path
repo, root, step, moves = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
WINDOW_SECONDS = int(sys.argv[5])
spec = importlib.util.spec_from_file_location("example_sessions", repo / "examples" / "sessions.py")
sessions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sessions)
from rebalance.spark import tables
from rebalance.spark.session import get_spark
from rebalance.streaming.rebalanced import rebalanced
spark = get_spark("kill-during-a-move", master="local[2]")
spark.conf.set("spark.sql.session.timeZone", "UTC")
# a phase per micro-batch (the sessions do not depend on how the clicks are batched)
clicks = (spark.readStream.format("delta").option("maxFilesPerTrigger", 4)
          .load(str(root / "in")).withWatermark("click_time", "10 minutes"))
job = rebalanced(clicks, key="user_id", processor=sessions.Sessionize(),
                 output_schema=sessions.SESSION_SCHEMA, time_mode="EventTime",
                 event_time="click_time", job="sessions", instances=3,
                 tables_root=str(root / "tables"), window_seconds=WINDOW_SECONDS)
query = job.start(output=str(root / "out"), checkpoint=str(root / "chk"), trigger_seconds=None)
query.process_all_available()
if step == "move":
    version = tables.publish_assignment(spark, moves, 3, root=str(root / "tables"))
    print("SWITCHING", version, flush=True)
    query.switch(version)
print("VERSION", query.version, flush=True)
query.stop()
'''


def _killed_during_the_move(spark, root: Path, phases, moves: dict) -> dict:
    """The rebalanced sessions job in a process of its own: the first phase, then a move
    of ``moves``; the process is killed (SIGKILL of its group) once the move's export rows
    are in its control table and Spark has planned the batch after them; restarted on the
    same checkpoint with the second phase's events. What it wrote, and the versions."""
    import json
    import os
    import re
    import sys
    import time

    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from service_helpers import Proc, delta_commits

    from rebalance.spark import tables
    from rebalance.streaming.rebalanced import switches

    for frame in phases[0]:
        write(spark, str(root / "in"), frame, sessions.CLICKS_SCHEMA)
    argv = json.dumps({str(k): int(v) for k, v in moves.items()})

    def driver(step: str) -> Proc:
        return Proc([sys.executable, "-c", DRIVER_CHILD, str(REPO), str(root), step, argv,
                     str(WINDOW_SECONDS)],
                    dict(os.environ), root / f"{step}.log")

    moving = driver("move")
    control, offsets = root / "chk" / "_rebalance" / "control", root / "chk" / "offsets"
    deadline, planned_before = time.monotonic() + 600, None
    while moving.alive() and time.monotonic() < deadline:
        if planned_before is None and len(delta_commits(control)) >= 2:   # export rows in
            planned_before = len(list(offsets.glob("[0-9]*")))
        if planned_before is not None and len(list(offsets.glob("[0-9]*"))) > planned_before:
            break                                     # the batch after them is planned
        time.sleep(0.05)
    assert moving.alive(), "the driver ended before the move: " + moving.log.read_text()[-3000:]
    moving.kill9()
    for frame in phases[1]:
        write(spark, str(root / "in"), frame, sessions.CLICKS_SCHEMA)
    resumed = driver("resume")
    resumed.popen.wait(timeout=900)
    log = resumed.log.read_text()
    assert resumed.popen.returncode == 0, log[-3000:]
    switching = re.search(r"SWITCHING (\d+)", moving.log.read_text())
    running = re.search(r"VERSION (\d+)", log)
    assert switching and running, (moving.log.read_text()[-2000:], log[-2000:])
    return dict(rebalanced=rows_of(spark, str(root / "out"), sessions.SESSION_SCHEMA),
                version=int(switching.group(1)), switched_to=int(running.group(1)),
                switches=switches(spark, str(root / "chk")),
                control=spark.read.format("delta").load(str(control)).toPandas(),
                hist=tables.read(spark, tables.KEY_HISTOGRAMS, str(root / "tables")).toPandas())


@pytest.fixture(scope="module")
def scenario(spark, tmp_path_factory):
    """Sessions under plain Spark (in this process) and rebalanced (a process of its own,
    killed during the move of the three busiest users, which version 0 places by
    default)."""
    from rebalance.core.placement import default_instances

    spark.conf.set("spark.sql.session.timeZone", "UTC")
    root, phases = tmp_path_factory.mktemp("sessions"), _clicks()
    plain = run_plain(spark, root, phases, make=sessions.Sessionize,
                      in_schema=sessions.CLICKS_SCHEMA, out_schema=sessions.SESSION_SCHEMA,
                      key="user_id", time_mode="EventTime", watermark="click_time")
    busiest = list(pd.concat(phases[0])["user_id"].value_counts().index[:3])
    moves = {k: (int(d) + 1) % N for k, d in zip(busiest, default_instances(busiest, N))}
    (root / "reb").mkdir()
    return dict(plain=plain, moves=moves, inputs=pd.concat(phases[0] + phases[1]),
                before_move=pd.concat(phases[0]),
                **_killed_during_the_move(spark, root / "reb", phases, moves))


def test_sessions_equal_plain_spark_across_a_move_killed_midway(scenario):
    assert scenario["plain"], "the plain run closed no session"
    assert scenario["rebalanced"] == scenario["plain"]


def test_moved_users_state_moved_once(scenario):
    assert scenario["switched_to"] == scenario["version"]
    assert [v for _, v in scenario["switches"]] == [scenario["version"]]
    moved = scenario["control"][scenario["control"]["kind"] == "in"]
    from rebalance.streaming.rebalanced import payload_of

    keys = sorted(payload_of(r)["key"] for r in moved.itertuples())
    assert keys == sorted(scenario["moves"]), "each moved user's state is handed over once"


def test_a_window_counts_under_the_new_version_only_where_no_click_came_before_the_move(
        scenario):
    """The window of minutes 60-120 has clicks of both phases: on every instance that had
    a click of it before the move, its rows carry the old version (``verify`` measures only
    windows run wholly under the new one)."""
    from rebalance.core.placement import default_instances

    window_ms = WINDOW_SECONDS * 1000
    before = scenario["before_move"]
    ms = before["click_time"].to_numpy().astype("datetime64[ms]").astype("int64")
    early = set(zip((ms - ms % window_ms).tolist(),
                    default_instances(list(before["user_id"]), N).tolist()))
    hist = scenario["hist"]
    starts = hist["window_start"].to_numpy().astype("datetime64[ms]").astype("int64")
    rows = set(zip(starts.tolist(), hist["instance"].tolist(), hist["assignment_version"].tolist()))
    straddling = T0_MS + window_ms
    assert any(w == straddling and (w, i) in early for w, i, _ in rows), \
        "the scenario has no window with clicks of both phases"
    labelled_new = {(w, i) for w, i, v in rows if v == scenario["version"]}
    assert not labelled_new & early, sorted(labelled_new & early)


def test_histograms_count_every_click_on_its_instance(scenario):
    hist, moves = scenario["hist"], scenario["moves"]
    after = hist[hist["assignment_version"] == scenario["version"]]
    for user, instance in moves.items():
        assert set(after.loc[after["key"] == user, "instance"]) <= {instance}
    closed = hist.groupby("key")["count"].sum()
    clicks = scenario["inputs"]["user_id"].value_counts()
    assert (closed <= clicks.reindex(closed.index)).all()
    assert closed.sum() > 0.5 * len(scenario["inputs"])


def _readings(n_devices: int = 20, n_phases: int = 3, batches: int = 3, seed: int = 5):
    """Per phase, per batch, readings of Zipf-skewed devices; about one in six is a retry
    of an earlier reading of its device (same id and value), in this batch or an earlier
    one (of either phase)."""
    rng = np.random.default_rng(seed)
    devices = [f"d{i:02d}" for i in range(n_devices)]
    weights = 1.0 / np.arange(1, n_devices + 1)
    weights /= weights.sum()
    sent: list[tuple] = []
    out, t, serial = [], T0_MS, 0
    for _ in range(n_phases):
        phase = []
        for _ in range(batches):
            rows = []
            for _ in range(50):
                t += int(rng.integers(1_000, 20_000))
                if sent and rng.random() < 1 / 6:
                    device, reading_id, value = sent[int(rng.integers(len(sent)))]
                else:
                    device, reading_id = str(rng.choice(devices, p=weights)), f"r{serial:04d}"
                    value, serial = float(rng.integers(0, 1000)) / 10, serial + 1
                    sent.append((device, reading_id, value))
                rows.append((device, reading_id, value, pd.Timestamp(t, unit="ms")))
            phase.append(pd.DataFrame(rows, columns=["device_id", "reading_id", "value",
                                                     "reading_time"]))
        out.append(phase)
    return out


@pytest.fixture(scope="module")
def devices_scenario(spark, tmp_path_factory):
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return run_both(spark, tmp_path_factory.mktemp("devices"), _readings(),
                     make=devices.DedupAverage, in_schema=devices.READINGS_SCHEMA,
                     out_schema=devices.AVERAGE_SCHEMA, key="device_id",
                     time_mode="ProcessingTime", event_time="reading_time", watermark=None,
                     job="devices", window_seconds=5, then_instances=2)


def test_device_averages_equal_plain_spark(devices_scenario):
    plain = devices_scenario["plain"]
    ids = {(d, r) for d, r, *_ in plain}
    sent = devices_scenario["inputs"][["device_id", "reading_id"]]
    assert len(ids) == len(plain) < len(sent), "each reading once, its retries dropped"
    assert devices_scenario["rebalanced"] == plain


def test_moved_devices_state_moved_once(devices_scenario):
    control = devices_scenario["control"]
    moved = control[(control["kind"] == "in") & (control["version"] == devices_scenario["version"])]
    from rebalance.streaming.rebalanced import payload_of

    keys = sorted(payload_of(r)["key"] for r in moved.itertuples())
    assert keys == sorted(devices_scenario["moves"])


def test_a_scale_in_keeps_the_ids_seen_under_their_ttl(devices_scenario):
    """The change of N to 2 before the third phase: the devices whose instance label
    changes are handed over with their MapState (TTL) and ListState, Spark repartitions
    the rest; retries in the third phase of readings sent before it are still dropped
    (the equality with plain Spark above fails otherwise)."""
    from rebalance.core.placement import default_instances
    from rebalance.streaming.rebalanced import payload_of
    from rebalance.streaming.routing import instance_labels

    control, resized = devices_scenario["control"], devices_scenario["resized"]
    moved = [payload_of(r)["key"] for r in control.itertuples()
             if r.kind == "in" and r.version == resized]
    inputs = devices_scenario["inputs"].reset_index(drop=True)
    first_two, third = inputs.iloc[:len(inputs) - 3 * 50], inputs.iloc[len(inputs) - 3 * 50:]
    before = {k: devices_scenario["moves"].get(k, int(default_instances([k], N)[0]))
              for k in set(first_two["device_id"])}          # the devices with state
    changes = sorted(k for k, i in before.items()
                     if instance_labels(N)[i] != instance_labels(2)[int(default_instances([k], 2)[0])])
    assert changes and sorted(moved) == changes
    earlier = set(zip(first_two["device_id"], first_two["reading_id"]))
    retried = {(d, r) for d, r in zip(third["device_id"], third["reading_id"]) if (d, r) in earlier}
    assert {d for d, _ in retried} & set(changes), "no retry of a handed-over device to drop"
    hist = devices_scenario["hist"]
    assert set(hist.loc[hist["assignment_version"] == resized, "instance"]) <= {0, 1}


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


views = _example("page_views")


def _feed(spark, query, path: str, phase, schema: str) -> None:
    """Write a phase of input, then let the rebalanced ``query`` process all of it."""
    for frame in phase:
        write(spark, path, frame, schema)
    query.resume()
    query.process_all_available()


def _outcome(spark, root: Path, out_schema: str) -> dict:
    """What a rebalanced run under ``root`` (reb_out, reb_chk, tables) left: its output
    rows, its key histograms and its control table."""
    from rebalance.spark import tables

    return dict(rebalanced=rows_of(spark, str(root / "reb_out"), out_schema),
                hist=tables.read(spark, tables.KEY_HISTOGRAMS, str(root / "tables")).toPandas(),
                control=spark.read.format("delta").load(
                    str(root / "reb_chk" / "_rebalance" / "control")).toPandas())


@pytest.fixture(scope="module")
def views_scenario(spark, tmp_path_factory):
    """examples/page_views.py (a MapState of open windows per user, a timer at each
    window's end, a Merge) on three phases of clicks, under plain Spark and under
    rebalanced(): after the first phase the busiest user is split over the three
    instances and the second busiest moved; after the second the busiest is whole again,
    on an instance other than its default, and the second busiest split over two."""
    from rebalance.core.placement import default_instances
    from rebalance.spark import jobs, tables
    from rebalance.streaming.rebalanced import rebalanced

    spark.conf.set("spark.sql.session.timeZone", "UTC")
    root, phases = tmp_path_factory.mktemp("views"), _clicks(n_phases=3, batches=3, seed=11)
    plain = run_plain(spark, root, phases, make=views.PageViews, in_schema=views.CLICKS_SCHEMA,
                      out_schema=views.VIEWS_SCHEMA, key="user_id", time_mode="EventTime",
                      watermark="click_time")
    hot, second = list(pd.concat(phases[0])["user_id"].value_counts().index[:2])
    hot_default, second_default = (int(d) for d in default_instances([hot, second], N))
    versions = [
        dict(routing={second: (second_default + 1) % N},
             splits={hot: {0: 0.4, 1: 0.3, 2: 0.3}}),
        dict(routing={hot: (hot_default + 1) % N},
             splits={second: {second_default: 0.5, (second_default + 2) % N: 0.5}}),
    ]
    reb_in, reb_out, tables_root = str(root / "reb_in"), str(root / "reb_out"), str(root / "tables")
    for frame in phases[0]:
        write(spark, reb_in, frame, views.CLICKS_SCHEMA)
    stream = rebalanced(stream_of(spark, reb_in, "click_time"), key="user_id",
                        processor=views.PageViews(), output_schema=views.VIEWS_SCHEMA,
                        time_mode="EventTime", event_time="click_time", job="views",
                        instances=N, tables_root=tables_root, window_seconds=600,
                        merge=views.MERGE)
    query = stream.start(output=reb_out, checkpoint=str(root / "reb_chk"), trigger_seconds=1)
    query.process_all_available()
    published = []
    for phase, version in zip(phases[1:], versions):
        published.append(tables.publish_assignment(spark, version["routing"], N,
                                                   root=tables_root, splits=version["splits"]))
        assert query.switch() == published[-1]
        _feed(spark, query, reb_in, phase, views.CLICKS_SCHEMA)
    query.stop()
    return dict(plain=plain, **_outcome(spark, root, views.VIEWS_SCHEMA),
                hot=hot, second=second, published=published,
                start=jobs.latest_start(spark, "views", tables_root))


def test_page_views_with_split_users_equal_plain_spark(views_scenario):
    plain = views_scenario["plain"]
    assert len(plain) > 40, "the plain run closed few windows"
    assert views_scenario["rebalanced"] == plain


def test_a_split_users_windows_were_counted_on_several_instances_and_merged(views_scenario):
    hist = views_scenario["hist"]
    for user, version in ((views_scenario["hot"], views_scenario["published"][0]),
                          (views_scenario["second"], views_scenario["published"][1])):
        parts = hist[(hist["key"] == user) & (hist["assignment_version"] == version)]
        per_window = parts.groupby("window_start")["instance"].nunique()
        assert (per_window >= 2).sum() >= 2, (user, parts)


def test_with_a_merge_a_move_hands_no_state_over_and_the_job_says_it_splits(views_scenario):
    control = views_scenario["control"]
    assert (control["kind"] == "switched").sum() == 2
    assert not (control["kind"] == "in").any()
    assert views_scenario["start"].splits is True


def test_a_merge_that_does_not_fit_is_refused_at_start(spark):
    from rebalance import Merge
    from rebalance.streaming.keyed_state import ContractError
    from rebalance.streaming.rebalanced import rebalanced

    df = spark.createDataFrame([], views.CLICKS_SCHEMA)
    ok = dict(key="user_id", processor=views.PageViews(), output_schema=views.VIEWS_SCHEMA,
              time_mode="EventTime", event_time="click_time", job="views", instances=2)
    cases = [
        (Merge(on="user_id", sum="clicks"), r"does not say how output column\(s\) "
                                            r"\['window_start', 'first_click', 'last_click'\]"),
        (Merge(on=["user_id", "window_start"], sum=["clicks", "first_click"], min="first_click",
               max="last_click"), "names output column 'first_click' twice"),
        (Merge(on=["user_id", "window_start"], sum="clicks", min="first_click",
               max="last_click", split_by="session"), r"split_by \['session'\]"),
        ({"on": "user_id"}, "merge must be a rebalance Merge"),
    ]
    for merge, message in cases:
        with pytest.raises(ContractError, match=message):
            rebalanced(df, merge=merge, **ok)


_spark_repartition = StreamingCheckpointManager.repartition


def _dies_before_its_commit(self, checkpoint: str, n_instances: int, *args, **kwargs):
    """Spark's state repartition, then its batch's commit removed and the driver gone."""
    _spark_repartition(self, checkpoint, n_instances, *args, **kwargs)
    last = max(log_ids(Path(checkpoint) / "commits"))
    for name in (str(last), f".{last}.crc"):
        (Path(checkpoint) / "commits" / name).unlink(missing_ok=True)
    raise RuntimeError("driver died during the repartition")


@pytest.fixture(scope="module")
def resize_scenario(spark, tmp_path_factory):
    """Sessions under plain Spark and under rebalanced() started at N = 3, scaled out to
    4 instances after the first phase of clicks (the busiest user routed to the new
    instance) and in to 2 after the second, whose driver dies during Spark's repartition
    of the state: each change of N moves the users whose instance label changes with
    their open sessions and timers, and Spark repartitions the rest of the state."""
    from rebalance.spark import tables
    from rebalance.streaming.rebalanced import rebalanced
    from rebalance.streaming.restart.checkpoint import checkpoint_partitions

    spark.conf.set("spark.sql.session.timeZone", "UTC")
    root, phases = tmp_path_factory.mktemp("resize"), _clicks(n_phases=3, batches=3, seed=7)
    plain = run_plain(spark, root, phases, make=sessions.Sessionize,
                      in_schema=sessions.CLICKS_SCHEMA, out_schema=sessions.SESSION_SCHEMA,
                      key="user_id", time_mode="EventTime", watermark="click_time")
    busiest = str(pd.concat(phases[0])["user_id"].value_counts().index[0])
    reb_in, reb_out, tables_root = str(root / "reb_in"), str(root / "reb_out"), str(root / "tables")
    checkpoint = str(root / "reb_chk")
    for frame in phases[0]:
        write(spark, reb_in, frame, sessions.CLICKS_SCHEMA)
    stream = rebalanced(stream_of(spark, reb_in, "click_time"), key="user_id",
                        processor=sessions.Sessionize(), output_schema=sessions.SESSION_SCHEMA,
                        time_mode="EventTime", event_time="click_time", job="resize",
                        instances=N, tables_root=tables_root, window_seconds=600)
    query = stream.start(output=reb_out, checkpoint=checkpoint, trigger_seconds=1)
    query.process_all_available()
    partitions, published = [checkpoint_partitions(checkpoint)], []
    for phase, (n, routing) in zip(phases[1:], ((4, {busiest: 3}), (2, {}))):
        tables.resize_assignments(spark, n, tables_root)
        published.append(tables.publish_assignment(spark, routing, n, root=tables_root))
        if n == 2:
            # the driver dies during Spark's repartition, after it wrote the new partitions'
            # state and its batch's offsets, before the batch's commit (what a kill -9 at
            # that point leaves): a new query on the checkpoint finishes the change of N
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(StreamingCheckpointManager, "repartition", _dies_before_its_commit)
                with pytest.raises(RuntimeError, match="during the repartition"):
                    query.switch()
            assert checkpoint_partitions(checkpoint) == 4
            assert max(log_ids(Path(checkpoint) / "offsets")) > max(log_ids(
                Path(checkpoint) / "commits")), "the repartition's batch is not left unfinished"
            query = stream.start(output=reb_out, checkpoint=checkpoint, trigger_seconds=1)
        else:
            assert query.switch() == published[-1]
        assert (query.version, query.instances) == (published[-1], n)
        partitions.append(checkpoint_partitions(checkpoint))
        _feed(spark, query, reb_in, phase, sessions.CLICKS_SCHEMA)
    query.stop()
    return dict(plain=plain, **_outcome(spark, root, sessions.SESSION_SCHEMA),
                busiest=busiest, published=published, partitions=partitions)


def test_sessions_equal_plain_spark_across_a_scale_out_and_a_scale_in(resize_scenario):
    assert len(resize_scenario["plain"]) > 30, "the plain run closed few sessions"
    assert resize_scenario["rebalanced"] == resize_scenario["plain"]


def test_each_change_of_n_repartitions_the_state_and_routes_by_the_new_n(resize_scenario):
    from rebalance.core.placement import default_instances
    from rebalance.streaming.rebalanced import payload_of
    from rebalance.streaming.routing import instance_labels

    assert resize_scenario["partitions"] == [N, 4, 2]
    hist, (out, back_in) = resize_scenario["hist"], resize_scenario["published"]
    assert set(hist.loc[hist["assignment_version"] == back_in, "instance"]) <= {0, 1}
    assert 3 in set(hist.loc[hist["assignment_version"] == out, "instance"])
    busiest = hist[(hist["key"] == resize_scenario["busiest"])
                   & (hist["assignment_version"] == out)]
    assert set(busiest["instance"]) == {3}
    # a user moves (is exported) exactly when its instance's label changes with N
    moved = resize_scenario["control"][resize_scenario["control"]["kind"] == "in"]
    label = {3: instance_labels(3), 4: instance_labels(4), 2: instance_labels(2)}
    routing = {out: {resize_scenario["busiest"]: 3}, back_in: {}}
    before = {out: (3, {}), back_in: (4, routing[out])}
    n_of = {out: 4, back_in: 2}
    for version in (out, back_in):
        keys = [payload_of(r)["key"] for r in moved.itertuples() if r.version == version]
        assert keys and len(keys) == len(set(keys)), (version, keys)
        n_old, old_routing = before[version]
        for key in keys:
            old = old_routing.get(key, int(default_instances([key], n_old)[0]))
            new = routing[version].get(key, int(default_instances([key], n_of[version])[0]))
            assert label[n_old][old] != label[n_of[version]][new], (version, key)
