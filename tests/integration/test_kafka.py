"""The keyed job reading a real Kafka broker: exactly once across kill -9, dedup of retries.

The broker is the test session's single-node KRaft broker (``kafka_broker`` in
tests/conftest.py: ``rebalance.ops.kafka.Broker``, the JARs ``make setup`` put in
``.jars/kafka-broker``, on free ports of 127.0.0.1, stopped at the end); this module's
topic is its own.

* ``test_kafka_exactly_once_across_two_kill9``: the generator produces 6 batches to a
  topic, with a tenth of the events sent twice (a producer's retries) and 5 % malformed;
  the keyed job (``spark_apps/keyed_job.py --source kafka``, dedup on by default, its
  own process group) is killed with SIGKILL in the middle of a micro-batch (offsets of
  batch n written, batch n not committed) twice, then run to the end (availableNow).
  Results, key and instance histograms equal a pandas recomputation of the unique valid
  events; ``instance_histograms.duplicates`` equals the valid duplicates sent, per
  instance and window; the quarantine holds every malformed message sent, with the
  generator's reasons.
* ``test_delta_source_drops_duplicates_within_the_watermark``: the same dedup on the
  Delta source, the retries of two batches appended after them (so they meet their
  originals' ids in the state, in a later micro-batch).

The watermark delay (30 s) is longer than a retry's lag behind its original (at most one
generator batch, 10 s of event time): no retry is late, so every one reaches the operator
and is counted as a duplicate.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest


class Proc:
    """A job process in its own group (the Python driver, its JVM, Python workers)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log = log
        with log.open("ab") as fh:
            self.popen = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env, cwd=str(REPO),
                                          start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        """SIGKILL of the whole group at once, then wait until every member is gone."""
        self._signal(signal.SIGKILL)
        self.popen.wait(timeout=60)
        deadline = time.monotonic() + 30
        while self._group() and time.monotonic() < deadline:
            time.sleep(0.2)

    def stop(self) -> None:
        if self.alive() or self._group():
            self.kill9()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def _group(self) -> list[int]:
        out = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and os.getpgid(int(d.name)) == self.popen.pid:
                    out.append(int(d.name))
            except OSError:
                continue
        return out


REPO = Path(__file__).resolve().parents[2]
N = 2
W_MS = 10_000
T0_MS = 1_704_067_200_000
GEN = dict(n_keys=20, zipf=1.0, events_per_batch=200, batch_seconds=10.0, n_instances=N,
           malformed_fraction=0.05, seed=11)
BATCHES = range(6)
DUPLICATES = 0.1


def _sent(gen, batches, duplicates: float) -> pd.DataFrame:
    """Every message the generator produced (duplicates included), with the malformed kind."""
    import numpy as np

    frames = []
    for b in batches:
        g = gen.batch(b)
        events = g.events.assign(kind=g.malformed.values)
        if duplicates:
            rng = np.random.default_rng([gen.config.seed, 3, b])
            events = pd.concat([events, events[rng.random(len(events)) < duplicates]],
                               ignore_index=True)
        frames.append(events)
    return pd.concat(frames, ignore_index=True)


def _expected(sent: pd.DataFrame) -> pd.DataFrame:
    ok = sent[sent.kind.isna()].drop_duplicates("event_id")
    ms = (pd.to_datetime(ok.event_time).astype("int64") // 1_000_000) - T0_MS
    return ok.assign(window=(ms // W_MS) * W_MS)


def _table(spark, table, root) -> pd.DataFrame:
    from rebalance.spark import tables

    df = tables.read(spark, table, root).toPandas()
    if "window_start" in df:
        df["window"] = (pd.to_datetime(df.window_start).astype("int64") // 1_000_000
                        - T0_MS).astype("int64")
    return df


def _batches(checkpoint: Path, folder: str) -> list[int]:
    d = checkpoint / folder
    return sorted(int(f.name) for f in d.iterdir() if f.name.isdigit()) if d.is_dir() else []


def _causes(log: Path) -> str:
    """The error lines of a job's log (its tail is a query plan, which says nothing)."""
    lines = log.read_text(errors="replace").splitlines()
    picked = [x for x in lines if any(w in x for w in ("Exception", "Error", "Caused by"))]
    return "\n".join(picked[:40])[:6000]


def _kill_mid_batch(proc: Proc, checkpoint: Path, after_commits: int, timeout: float = 420) -> int:
    """SIGKILL the job's group once a batch past ``after_commits`` committed batches has
    started (its offsets written) and is not committed; return that batch id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.alive(), _causes(proc.log)
        offsets, commits = _batches(checkpoint, "offsets"), _batches(checkpoint, "commits")
        if len(commits) >= after_commits and offsets and offsets[-1] not in commits:
            proc.kill9()
            return offsets[-1]
        time.sleep(0.1)
    proc.stop()
    raise AssertionError(f"no micro-batch in flight within {timeout} s")


def _check(spark, root: str, sent: pd.DataFrame) -> None:
    from rebalance.spark import tables

    exp = _expected(sent)
    res = _table(spark, tables.RESULTS, root)
    assert not res.duplicated(["batch_id", "key", "window", "final"]).any()
    got = res.groupby(["key", "window"])["events"].sum().sort_index()
    want = exp.groupby(["key", "window"]).size().sort_index()
    pd.testing.assert_series_equal(got, want, check_names=False)
    # Closed windows: histograms equal the unique valid events (duplicates dropped).
    kh = _table(spark, tables.KEY_HISTOGRAMS, root)
    closed = sorted(kh.window.unique())
    assert closed, "no window closed"
    want_closed = exp[exp.window.isin(closed)]
    pd.testing.assert_series_equal(kh.groupby(["key", "window"])["count"].sum().sort_index(),
                                   want_closed.groupby(["key", "window"]).size().sort_index(),
                                   check_names=False)
    ih = _table(spark, tables.INSTANCE_HISTOGRAMS, root)
    assert not ih.duplicated(["window", "instance"]).any()
    pd.testing.assert_series_equal(ih.groupby("window")["events"].sum().sort_index(),
                                   want_closed.groupby("window").size().sort_index(),
                                   check_names=False)
    # Duplicates: every valid retry is dropped and counted, by the instance of its key,
    # in the window of its event time.
    instance_of = kh.groupby("key")["instance"].agg(["min", "max"])
    assert (instance_of["min"] == instance_of["max"]).all()       # no key changed instance
    valid = sent[sent.kind.isna()]
    retries = _expected(valid[valid.event_id.duplicated()].assign(kind=None))
    retries = retries.assign(instance=retries.key.map(instance_of["min"]))
    want_dups = retries[retries.window.isin(closed)].groupby(["instance", "window"]).size()
    got_dups = ih.set_index(["instance", "window"])["duplicates"].sort_index()
    assert set(want_dups.index) <= set(got_dups.index)
    pd.testing.assert_series_equal(got_dups, want_dups.reindex(got_dups.index, fill_value=0),
                                   check_names=False, check_dtype=False)
    assert got_dups.sum() > 0
    # Every malformed message is quarantined (retries too: the quarantine keeps what came).
    q = _table(spark, tables.QUARANTINE, root)
    bad = sent[sent.kind.notna()]
    assert sorted(q.event_id.fillna("")) == sorted(bad.event_id.fillna(""))
    assert (q.set_index("event_id").reason.groupby(level=0).first()
            == bad.set_index("event_id").kind.groupby(level=0).first()).all()


@pytest.mark.slow
def test_kafka_exactly_once_across_two_kill9(spark, kafka_broker, tmp_path):
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, produce_batches

    gen = EventGenerator(GeneratorConfig(**GEN))
    broker, topic = kafka_broker, "kill9-events"
    produce_batches(spark, gen, BATCHES, broker.bootstrap, topic, DUPLICATES)
    sent = _sent(gen, BATCHES, DUPLICATES)
    assert (sent.event_id.duplicated().sum()) > 50

    root, ckpt = tmp_path / "tables", tmp_path / "checkpoints"
    argv = [sys.executable, str(REPO / "spark_apps" / "keyed_job.py"), "--source", "kafka",
            "--bootstrap-servers", broker.bootstrap, "--topic", topic,
            "--instances", str(N), "--window-seconds", "10", "--windows", "2",
            "--watermark-seconds", "30", "--max-offsets-per-trigger", "400", "--name", "kt",
            "--tables-root", str(root), "--checkpoint-root", str(ckpt), "--master", "local[2]"]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    keyed = ckpt / "kt" / "keyed"
    killed = []
    for run in range(2):
        proc = Proc([*argv, "--trigger-seconds", "0.5"], env, tmp_path / f"job-{run}.log")
        killed.append(_kill_mid_batch(proc, keyed, after_commits=len(_batches(keyed, "commits")) + 1))
    assert killed[0] < killed[1]
    last = Proc(argv, env, tmp_path / "job-final.log")   # availableNow: to the end, then exit
    try:
        assert last.popen.wait(timeout=600) == 0, _causes(last.log)
    finally:
        last.stop()
    # The killed batches were replayed (re-run from their offsets), nothing counted twice.
    _check(spark, str(root), sent)


def _generate(root: str, *args: str) -> str:
    """Run spark_apps/generate_events.py in this process (its session is the tests' one)."""
    import contextlib
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location("generate_events",
                                                  REPO / "spark_apps" / "generate_events.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert module.main([
            "--keys", "20", "--zipf", "1", "--events-per-batch", "200", "--batch-seconds", "10",
            "--instances", str(N), "--malformed-fraction", "0.05", "--seed", "11",
            "--tables-root", root, *args]) == 0
    return out.getvalue()


@pytest.mark.slow
def test_delta_source_drops_duplicates_within_the_watermark(spark, tmp_path):
    from rebalance.spark import tables
    from rebalance.streaming.builtin import start_job
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches
    from rebalance.streaming.job import JobConfig

    root = str(tmp_path / "tables")
    gen = EventGenerator(GeneratorConfig(**GEN))
    batches = range(6)

    def retry(pair):     # the copies a producer sent again of two batches: one commit
        again = _sent(gen, pair, DUPLICATES)
        again = again[again.event_id.duplicated()].drop(columns="kind")
        tables.append(spark.createDataFrame(again, tables.EVENTS.schema).coalesce(1),
                      tables.EVENTS, root)

    assert append_batches(spark, gen, range(2), root) == [0, 1]
    retry(range(2))
    # A re-run over batches already in the table says what it did (and writes nothing twice).
    assert _generate(root, "--start-batch", "0", "--batches", "2").startswith(
        "appended nothing: batches 0..1 are already in the table")
    assert append_batches(spark, gen, range(2, 4), root) == [2, 3]
    retry(range(2, 4))
    assert _generate(root, "--start-batch", "2", "--batches", "4").startswith(
        "appended batches 4..5 (2 already in the table, skipped)")
    retry(range(4, 6))
    sent = _sent(gen, batches, DUPLICATES)
    # Two commits per micro-batch: the retries of batches 0..1 come in the batch after
    # their originals, and are found in the keys' state.
    config = JobConfig(n_instances=N, window_seconds=10, n_windows=2, watermark_seconds=30,
                       max_files_per_trigger=2, name="dt", tables_root=root,
                       checkpoint_root=str(tmp_path / "ck"))
    assert config.dedup                        # the default
    job = start_job(spark, config)
    job.await_termination()
    assert len(job.keyed.recentProgress) >= 5
    _check(spark, root, sent)
