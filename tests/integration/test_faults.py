"""Issue 14, part 2: faults injected into the running keyed job; nothing lost or doubled.

The processes are the service's own: the keyed job is ``spark_apps/restartable_job.py``
started with the argv and environment ``rebalance.ops.service`` gives it (``make up``'s
``job`` component), on a data folder of the test. The events are the live generator's
batches (:class:`rebalance.streaming.generator.EventGenerator`, the same pure function of
its options), appended to the ``events`` Delta table one commit per batch by a small Delta
writer in the test process (no JVM: on this shared 2-core machine each JVM start costs
one to two minutes). Everything is checked by reading the Delta tables' files from the
test process (:func:`service_helpers.read_delta`).

One module-scoped stack (the job's data folder and process); each test brings it to
what it needs (:meth:`Stack.ready`: events sent, the job running and caught up), so a
test run alone (``-k``) sets up its own; run in file order they share the job:

1. ``kill -9`` (SIGKILL of the whole process group: Python driver, JVM, Python workers)
   of the job twice during a micro-batch: first after the batch's offsets were logged
   and before its commit, then after one of its sinks committed but before the
   checkpoint commit where the timing allows; input arrives while the job is down; after
   the restart every event is counted once in ``results``, ``key_histograms`` and
   ``instance_histograms``.
2. The disk fills up (the data folder is a 256 MB tmpfs, filled by a ballast file): the
   job stops with ``No space left on device`` in its log; with space back it resumes and
   still every event is counted once.

Figures (events sent, counted, lost, doubled, seconds to recover) are printed with
``-s`` and summarised in docs/reliability.md.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from service_helpers import (
    PIPELINE_CHILD,
    RUNS_CHILD,
    EventsWriter,
    Proc,
    commit_metadata,
    delta_commits,
    read_delta,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
N_KEYS = 40
EVENTS_PER_BATCH = 500
BATCH_SECONDS = 10
WINDOW_SECONDS = 20
SPLIT_KEY = "k1"    # split by the kill -9 test
WATERMARK_SECONDS = 10
#: A JVM start takes 1-2 minutes on the shared machine; a micro-batch about 10 s.
START_TIMEOUT = 300
CATCH_UP_TIMEOUT = 420
TMPFS_MB = 256


def _mount_tmpfs(path: Path) -> bool:
    """A size-limited tmpfs at ``path`` (root only); False where mounting is not allowed."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m,mode=0755", "tmpfs",
                           str(path)], capture_output=True, text=True)
    return done.returncode == 0


class Stack:
    """The job's process, its data folder and the events sent so far."""

    def __init__(self, root: Path) -> None:
        from rebalance.ops.service import Settings, components
        from rebalance.streaming.generator import GeneratorConfig

        self.root = root
        self.data = root / "data"
        self.mounted = _mount_tmpfs(self.data)
        self.data.mkdir(parents=True, exist_ok=True)
        settings = Settings(data=self.data, airflow_home=root / "airflow",
                            window_seconds=WINDOW_SECONDS)
        job = next(c for c in components(settings) if c.name == "job")
        # The service's job, with one events file per micro-batch (so a batch is under way
        # long enough to be killed in) and the short trigger and poll of a test.
        argv = list(job.argv)
        for flag, value in (("--trigger-seconds", "2"), ("--poll-seconds", "5")):
            argv[argv.index(flag) + 1] = value
        self.argv = [*argv, "--max-files-per-trigger", "1",
                     "--conf", "spark.databricks.delta.snapshotPartitions=1",
                     "--conf", "spark.ui.enabled=false"]
        self.env = dict(job.env)
        self.env["REBALANCE_DATA_DIR"] = str(self.data)
        self.tables = self.data / "tables"
        self.checkpoint = self.data / "checkpoints" / "keyed" / "keyed-g0"
        self.writer = EventsWriter(self.tables, GeneratorConfig(
            n_keys=N_KEYS, events_per_batch=EVENTS_PER_BATCH, batch_seconds=BATCH_SECONDS,
            seed=14, fluctuation=1.0, interval_batches=4, n_instances=4,
            start="2026-01-01T00:00:00Z"))
        self.job: Proc | None = None
        self.batches = 0  # generator batches sent so far (0, 1, ...)
        self.procs: list[Proc] = []
        self.figures: dict[str, object] = {}

    # ------------------------------------------------------------------ the job
    def start_job(self) -> Proc:
        assert self.job is None or not self.job.alive()
        self.job = Proc(self.argv, self.env, self.data.parent / "job.log", cwd=REPO)
        self.procs.append(self.job)
        return self.job

    def send(self, count: int) -> None:
        """Append the next ``count`` generator batches to ``events``."""
        for _ in range(count):
            self.writer.append(self.batches)
            self.batches += 1

    def stored(self) -> bool:
        """The job's tables exist and hold the histograms of a closed window."""
        return self.tables.joinpath("assignments").exists() and bool(self.histogram_windows())

    def ready(self) -> None:
        """The job running, every event sent counted and the closed windows' histograms
        written: sends six batches if none was sent and starts the job if it does not run
        (a test run alone); after the kill -9 test it only checks."""
        if not self.batches:
            self.send(6)
        if self.job is None or not self.job.alive():
            self.start_job()
        self.wait("the job to count every event sent", self.caught_up,
                  START_TIMEOUT + CATCH_UP_TIMEOUT, 2.0)

    def stop_all(self) -> None:
        for p in self.procs:
            p.stop(grace=20)

    # --------------------------------------------------------------- checkpoint
    def _ids(self, folder: str) -> set[int]:
        d = self.checkpoint / folder
        return {int(f.name) for f in d.iterdir() if f.name.isdigit()} if d.is_dir() else set()

    def offsets(self) -> set[int]:
        return self._ids("offsets")

    def commits(self) -> set[int]:
        return self._ids("commits")

    def sink_batches(self) -> set[int]:
        """Batch ids of which at least one output table has a commit."""
        out = set()
        for table in ("results", "key_histograms", "instance_histograms"):
            for _, actions in delta_commits(self.tables / table):
                meta = commit_metadata(actions)
                if "batch_id" in meta:
                    out.add(int(meta["batch_id"]))
        return out

    def wait(self, what: str, check, timeout: float, every: float = 0.25):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            if self.job is not None and not self.job.alive():
                raise AssertionError(f"job exited while waiting for {what}:\n{self.job.tail(40)}")
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; job log:\n"
                             + (self.job.tail(40) if self.job else ""))

    # ------------------------------------------------------------------- checks
    def expected(self) -> tuple[Counter, Counter, float]:
        """Events sent per key, per (window start ms, key), and the largest event time (ms)."""
        import pandas as pd

        sent = pd.concat(self.writer.sent, ignore_index=True)
        ms = pd.to_datetime(sent["event_time"], utc=True).astype("int64") // 10 ** 6
        window = (ms - ms % (WINDOW_SECONDS * 1000)).astype("int64")
        return (Counter(sent["key"]), Counter(zip(window, sent["key"])), float(ms.max()))

    def closed_windows(self) -> set[int]:
        _, per_window, last = self.expected()
        mark = last - WATERMARK_SECONDS * 1000
        return {w for w, _ in per_window if w + WINDOW_SECONDS * 1000 <= mark}

    def counted(self) -> int:
        t = read_delta(self.tables / "results", ["events"])
        return 0 if t is None else int(sum(v or 0 for v in t.column("events").to_pylist()))

    def histogram_windows(self) -> set[int]:
        t = read_delta(self.tables / "key_histograms", ["window_start"])
        if t is None:
            return set()
        import pandas as pd

        return {int(pd.Timestamp(v).timestamp() * 1000)
                for v in t.column("window_start").to_pylist()}

    def caught_up(self) -> bool:
        sent = sum(len(f) for f in self.writer.sent)
        offsets, commits = self.offsets(), self.commits()
        return (self.counted() >= sent and offsets and max(offsets) in commits
                and self.closed_windows() <= self.histogram_windows())

    def assert_exact(self) -> dict[str, int]:
        """Every event sent counted once: results, both histograms, no duplicate commit."""
        import pandas as pd

        per_key, per_window_key, _ = self.expected()
        sent = sum(per_key.values())
        res = read_delta(self.tables / "results").to_pandas()
        got = res.groupby("key")["events"].sum()
        lost = sum(max(0, n - int(got.get(k, 0))) for k, n in per_key.items())
        doubled = sum(max(0, int(got.get(k, 0)) - n) for k, n in per_key.items())
        doubled += int(got[[k for k in got.index if k not in per_key]].sum())
        dup_rows = int(res.duplicated(["batch_id", "window_start", "key", "instance"]).sum())
        # one commit per (table, batch) in each output table
        dup_commits = 0
        for table in ("results", "key_histograms", "instance_histograms"):
            ids = [commit_metadata(a).get("batch_id") for _, a in delta_commits(self.tables / table)]
            ids = [i for i in ids if i is not None]
            dup_commits += len(ids) - len(set(ids))
        # the closed windows' histograms equal the events sent in them, key by key
        kh = read_delta(self.tables / "key_histograms").to_pandas()
        kh["w"] = kh["window_start"].map(lambda t: int(pd.Timestamp(t).timestamp() * 1000))
        hist = kh.groupby(["w", "key"])["count"].sum()
        closed = self.closed_windows()
        want = {wk: n for wk, n in per_window_key.items() if wk[0] in closed}
        have = {(int(w), k): int(n) for (w, k), n in hist.items()}
        hist_mismatch = sum(1 for wk in set(want) | set(have) if want.get(wk, 0) != have.get(wk, 0))
        ih = read_delta(self.tables / "instance_histograms").to_pandas()
        ih["w"] = ih["window_start"].map(lambda t: int(pd.Timestamp(t).timestamp() * 1000))
        inst = ih.groupby("w")["events"].sum().to_dict()
        inst_mismatch = sum(1 for w in closed
                            if int(inst.get(w, 0)) != sum(n for (ww, _), n in want.items()
                                                          if ww == w))
        # window_results: one merged row per closed window and key (a split key's partials)
        wr = read_delta(self.tables / "window_results").to_pandas()
        wr["w"] = wr["window_start"].map(lambda t: int(pd.Timestamp(t).timestamp() * 1000))
        final_dups = int(wr.duplicated(["w", "key"]).sum())
        final = {(int(w), k): int(n) for w, k, n in zip(wr["w"], wr["key"], wr["count"])}
        final_mismatch = sum(1 for wk in set(want) | set(final)
                             if want.get(wk, 0) != final.get(wk, 0))
        figures = {"events_sent": sent, "events_counted": int(got.sum()), "lost": lost,
                   "doubled": doubled, "duplicate_result_rows": dup_rows,
                   "duplicate_sink_commits": dup_commits, "closed_windows": len(closed),
                   "window_key_pairs": len(want), "histogram_mismatches": hist_mismatch,
                   "instance_histogram_mismatches": inst_mismatch,
                   "window_results_duplicates": final_dups,
                   "window_results_mismatches": final_mismatch,
                   "merged_partials": int((wr["instances"] > 1).sum())}
        assert closed, "no closed window: the histogram check would prove nothing"
        assert (lost, doubled, dup_rows, dup_commits, hist_mismatch, inst_mismatch, final_dups,
                final_mismatch) == (0, 0, 0, 0, 0, 0, 0, 0), figures
        assert int(got.sum()) == sent, figures
        return figures


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("faults"))
    try:
        yield s
    finally:
        s.stop_all()
        left = [pid for p in s.procs for pid in p.group()]
        if s.mounted:
            subprocess.run(["umount", str(s.data)], capture_output=True)
            if os.path.ismount(s.data):
                subprocess.run(["umount", "-l", str(s.data)], capture_output=True)
        print("fault figures:", s.figures, flush=True)
        assert not left, f"processes left running: {left}"


def _in_batch(stack: Stack):
    """A batch under way: its offsets are logged, its commit is not (and it has input)."""
    offsets, commits = stack.offsets(), stack.commits()
    if not commits:
        return None
    pending = [b for b in offsets if b not in commits]
    return ("offsets logged, not committed", max(pending)) if pending else None


def _after_a_sink(stack: Stack):
    """A batch of which a sink already committed, but not the checkpoint."""
    offsets, commits = stack.offsets(), stack.commits()
    pending = {b for b in offsets if b not in commits}
    written = pending & stack.sink_batches()
    return ("a sink committed, the checkpoint not", max(written)) if written else None


def test_kill9_of_the_job_twice_mid_batch_loses_and_doubles_nothing(stack, spark):
    from rebalance.spark import tables

    t0 = time.monotonic()
    if stack.job is not None and stack.job.alive():  # (run after another test)
        stack.job.kill9()
    # A key split over three of the four instances: its partials merge in window_results
    tables.publish_assignment(spark, {}, 4, {"test": "kill9"}, str(stack.tables),
                              splits={SPLIT_KEY: {0: 0.4, 1: 0.3, 3: 0.3}})
    before = max(stack.commits(), default=-1)
    stack.send(6)  # one events file per micro-batch: six batches to kill one in
    kills = []

    # 1st: killed after the batch's offsets are logged, before its commit
    job = stack.start_job()
    stack.wait("a first committed batch", lambda: max(stack.commits(), default=-1) > before,
               START_TIMEOUT)
    moment, batch = stack.wait("a micro-batch under way", lambda: _in_batch(stack), 120, 0.05)
    job.kill9()
    kills.append((moment, batch))
    assert batch not in stack.commits()

    # 2nd, after a restart: after a sink wrote where the timing allows, else mid-batch
    job = stack.start_job()
    restart = time.monotonic()
    stack.wait("the restarted job's first commit", lambda: max(stack.commits()) > batch,
               START_TIMEOUT)
    try:
        found = stack.wait("a sink committed before the checkpoint",
                           lambda: _after_a_sink(stack), 60, 0.05)
    except AssertionError:
        if not job.alive():
            raise
        found = stack.wait("a micro-batch under way", lambda: _in_batch(stack), 120, 0.05)
    job.kill9()
    kills.append(found)
    assert found[1] not in stack.commits()

    # input arrives while the job is down
    stack.send(3)
    job = stack.start_job()
    restart = time.monotonic()
    stack.wait("every event counted and the closed windows' histograms written",
               stack.caught_up, CATCH_UP_TIMEOUT, 2.0)
    recovered = time.monotonic() - restart
    time.sleep(8)  # a few more triggers: nothing may be written twice afterwards
    figures = stack.assert_exact()
    assert figures["merged_partials"] >= 1, figures   # the split key's windows after it
    figures.update(kills=kills, seconds_from_restart_to_caught_up=round(recovered, 1),
                   test_seconds=round(time.monotonic() - t0, 1))
    stack.figures["kill9"] = figures
    print("kill -9 twice:", figures, flush=True)


def _assignment_commits(stack: Stack, plan_id: str) -> list[int]:
    return [v for v, a in delta_commits(stack.tables / "assignments")
            if commit_metadata(a).get("plan_id") == plan_id]


def _plan_row(stack: Stack, plan_id: str) -> dict:
    t = read_delta(stack.tables / "plans", ["plan_id", "status", "assignment_version"])
    rows = [r for r in (t.to_pylist() if t is not None else []) if r["plan_id"] == plan_id]
    assert len(rows) == 1, rows
    return rows[0]


def _lease(stack: Stack) -> dict | None:
    t = read_delta(stack.tables / "control")
    rows = [r for r in (t.to_pylist() if t is not None else []) if r["name"] == "apply"]
    return rows[0] if rows else None


def _liveness_not_tested(stack: Stack) -> dict[str, str]:
    """The stack's env for tests about retries and the lease: the job may sit idle between
    the test's event batches for longer than the apply's liveness check allows (a test of
    its own below), so the check is widened to a day."""
    return {**stack.env, "REBALANCE_JOB_STALE_SECONDS": "86400"}


def _pipeline(stack: Stack, name: str, run_id: str) -> Proc:
    """The DAG's task functions in a child process (windows ... apply) on the stack's data."""
    child = Proc([sys.executable, "-c", PIPELINE_CHILD, "2026-01-01T00:00:00+00:00",
                  "2026-01-01T00:05:00+00:00", run_id], _liveness_not_tested(stack),
                 stack.root / f"{name}.log", cwd=REPO)
    stack.procs.append(child)
    return child


def _line(child: Proc, prefix: str) -> str | None:
    return next((x for x in child.output().splitlines() if x.startswith(prefix)), None)


def test_kill9_during_apply_then_the_retry_applies_the_same_plan_once(stack):
    """The Airflow task process killed after it wrote the assignment version and before it
    recorded the plan as applied: the retry (same run) finds its own version, writes none,
    records it; the lease, held by the plan, does not block the retry."""
    stack.ready()
    t0 = time.monotonic()
    run_id = "manual__faults-apply"
    before = [v for v, _ in delta_commits(stack.tables / "assignments")]
    first = _pipeline(stack, "apply-1", run_id)

    def apply_started():
        if not first.alive():
            raise AssertionError("the pipeline ended before apply:\n" + first.tail(40))
        return _line(first, "STEP apply start")
    stack.wait("the pipeline's apply step", apply_started, START_TIMEOUT + 300, 0.5)
    plan_id = _line(first, "STEP publish done").split()[-1]
    stack.wait("the assignment version of the plan",
               lambda: _assignment_commits(stack, plan_id), 180, 0.05)
    first.kill9()
    killed = time.monotonic()
    versions = _assignment_commits(stack, plan_id)
    status_after_kill = _plan_row(stack, plan_id)["status"]
    lease_after_kill = _lease(stack)
    assert len(versions) == 1

    second = _pipeline(stack, "apply-2", run_id)
    deadline = time.monotonic() + START_TIMEOUT + 300
    while second.alive() and time.monotonic() < deadline:
        time.sleep(1)
    assert not second.alive() and second.popen.returncode == 0, second.tail(40)
    retried = time.monotonic() - killed
    assert _line(second, "STEP publish done").split()[-1] == plan_id  # same plan id
    assert _assignment_commits(stack, plan_id) == versions            # no extra version
    after = [v for v, _ in delta_commits(stack.tables / "assignments")]
    assert len(after) == len(before) + 1, (before, after)
    row = _plan_row(stack, plan_id)
    assert row["status"] == "applied" and row["assignment_version"] == versions[0], row
    lease = _lease(stack)
    assert lease is not None and lease["holder"] is None, lease  # released by the retry
    figures = {"plan_id": plan_id, "assignment_version": versions[0],
               "status_after_kill": status_after_kill,
               "lease_after_kill": None if lease_after_kill is None else
               {k: str(v) for k, v in lease_after_kill.items()},
               "seconds_from_kill_to_applied": round(retried, 1),
               "test_seconds": round(time.monotonic() - t0, 1)}
    stack.figures["kill9_apply"] = figures
    print("kill -9 during apply:", figures, flush=True)


def test_full_disk_stops_the_job_with_a_clear_error_and_it_resumes_without_loss(stack):
    if not stack.mounted:
        pytest.skip("needs root to mount a size-limited tmpfs under the data folder")
    stack.ready()
    t0 = time.monotonic()
    ballast = stack.data / "ballast"
    free = os.statvfs(stack.data)
    with open(ballast, "wb") as fh:  # fill the disk: every write of the job now fails
        chunk = b"\0" * (1 << 20)
        try:
            for _ in range(free.f_bavail * free.f_frsize // len(chunk) + 2):
                fh.write(chunk)
                fh.flush()
        except OSError:
            pass
    # a new batch arrives (space for exactly its file and commit, then the disk is full)
    events_dir = stack.writer.path
    os.truncate(ballast, max(0, ballast.stat().st_size - (256 << 10)))
    stack.send(1)
    with open(ballast, "ab") as fh:
        try:
            fh.write(b"\0" * (1 << 20))
        except OSError:
            pass
    assert os.statvfs(stack.data).f_bavail * os.statvfs(stack.data).f_frsize < (64 << 10)
    committed = max(stack.commits())
    job = stack.job
    deadline = time.monotonic() + 240
    while job.alive() and time.monotonic() < deadline:
        time.sleep(1)
    stopped = not job.alive()
    log = job.output()
    if not stopped:
        job.kill9()
    ballast.unlink()
    assert events_dir.exists()
    assert stopped, "the job kept running on a full disk for 240 s without stopping"
    assert "No space left on device" in log, log[-3000:]
    # the job's own last word: one line naming the root cause, exit code 1
    said = [line for line in log.splitlines() if line.startswith("error: the keyed query stopped:")]
    assert said and "No space left on device" in said[-1], log[-3000:]
    assert max(stack.commits()) == committed  # the batch was not committed on a full disk
    stopped_after = time.monotonic() - t0

    # space is back: restart, catch up, count exactly
    stack.send(1)
    job = stack.start_job()
    restart = time.monotonic()
    stack.wait("every event counted after the disk had space again", stack.caught_up,
               CATCH_UP_TIMEOUT, 2.0)
    recovered = time.monotonic() - restart
    time.sleep(8)
    figures = stack.assert_exact()
    figures.update(seconds_until_the_job_stopped=round(stopped_after, 1),
                   seconds_from_restart_to_caught_up=round(recovered, 1),
                   error_line=next((line.strip()[:200] for line in log.splitlines()
                                    if "No space left on device" in line), None))
    stack.figures["enospc"] = figures
    print("full disk:", figures, flush=True)


# ------------------------------------------------------------- a DAG run, the job down
EMPTY_RUN = "manual__job-down-no-windows"
STORED_RUN = "manual__job-down-stored-windows"


@pytest.fixture(scope="module")
def job_down(stack) -> dict[str, str]:
    """With windows stored, kill the job, then run the DAG's steps for two runs in one
    child process: one whose data interval has no windows (what a scheduled run meets while
    the job is down) and one whose interval holds windows the job stored before it went
    down."""
    if not stack.stored():
        stack.ready()
    if stack.job is not None and stack.job.alive():
        stack.job.kill9()
    before = len(delta_commits(stack.tables / "assignments"))
    child = Proc([sys.executable, "-c", RUNS_CHILD,
                  f"{EMPTY_RUN}|2026-01-01T02:00:00+00:00|2026-01-01T02:05:00+00:00",
                  f"{STORED_RUN}|2026-01-01T00:00:00+00:00|2026-01-01T00:05:00+00:00"],
                 # The job was killed before the child started: any results commit is
                 # older than a second (the default, 300 s, is for a live service).
                 {**stack.env, "REBALANCE_JOB_STALE_SECONDS": "1"},
                 stack.root / "job-down.log", cwd=REPO)
    stack.procs.append(child)
    t0 = time.monotonic()
    while child.alive() and time.monotonic() - t0 < START_TIMEOUT + 300:
        time.sleep(1)
    assert not child.alive() and child.popen.returncode == 0, child.tail(40)
    results = {}
    for line in child.output().splitlines():
        if line.startswith("RESULT "):
            _, run, rest = line.split(" ", 2)
            results[run] = rest
    results["new_assignment_versions"] = len(delta_commits(stack.tables / "assignments")) - before
    stack.figures["job_down"] = results
    print("DAG runs with the job down:", results, flush=True)
    return results


def test_a_run_while_the_job_is_down_and_wrote_no_windows_skips_with_the_reason(job_down):
    outcome = job_down[EMPTY_RUN]
    assert outcome.startswith("RunSkipped "), outcome
    assert "window" in outcome, outcome  # the reason names the missing windows


def test_a_run_while_the_job_is_down_applies_nothing_even_with_stored_windows(job_down):
    outcome = job_down[STORED_RUN]
    assert outcome.startswith("RunSkipped ") and "job" in outcome, outcome
    assert job_down["new_assignment_versions"] == 0, job_down


def test_two_manual_runs_at_once_apply_exactly_one_plan(stack):
    """Two triggers at the same moment (two processes running the DAG's steps over the same
    stored windows, each with its own run id and plan): one plan becomes the next version,
    the other applies nothing; never two versions from one base.

    The loser is refused by the apply lease or as stale when the two interleave at apply;
    when they interleave earlier, its UPDATE of the ``plans`` table may lose Delta's
    optimistic-concurrency check (``ConcurrentAppendException``): PlanStore re-reads and
    retries it (``CONFLICT_RETRIES``), and the run goes on to be refused at apply. A
    conflict left after the retries fails the task, as Airflow's task retry would see it.
    """
    if not stack.stored():  # windows to plan from (the job need not run: liveness widened)
        stack.ready()
    before = len(delta_commits(stack.tables / "assignments"))
    runs = [f"manual__faults-concurrent-{i}" for i in (1, 2)]
    children = [Proc([sys.executable, "-c", RUNS_CHILD,
                      f"{run}|2026-01-01T00:00:00+00:00|2026-01-01T00:05:00+00:00"],
                     _liveness_not_tested(stack), stack.root / f"concurrent-{i}.log", cwd=REPO)
                for i, run in enumerate(runs)]
    stack.procs.extend(children)
    t0 = time.monotonic()
    while any(c.alive() for c in children) and time.monotonic() - t0 < START_TIMEOUT + 300:
        time.sleep(1)
    assert all(not c.alive() and c.popen.returncode == 0 for c in children), \
        "\n".join(c.tail(20) for c in children)
    outcomes = {}
    for c in children:
        for line in c.output().splitlines():
            if line.startswith("RESULT "):
                _, run, rest = line.split(" ", 2)
                outcomes[run] = rest
    new_versions = len(delta_commits(stack.tables / "assignments")) - before
    stack.figures["concurrent"] = {**outcomes, "new_assignment_versions": new_versions,
                                   "seconds": round(time.monotonic() - t0, 1)}
    print("two runs at once:", stack.figures["concurrent"], flush=True)
    assert set(outcomes) == set(runs), outcomes
    applied = [r for r, o in outcomes.items() if o.startswith("applied ")]
    assert len(applied) == 1, outcomes
    loser = outcomes[next(r for r in runs if r not in applied)]
    assert re.search(r"^ApplyRefused .*(lease 'apply' is held|stale plan)|"
                     r"ConcurrentAppendException|ConcurrentUpdateException", loser), outcomes
    assert new_versions == 1, outcomes
