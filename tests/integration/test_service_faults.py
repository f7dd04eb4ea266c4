"""Faults injected into the real service stack, through Airflow itself.

The session's service stack (:func:`service_helpers.service`, shared with
``test_service.py``: Spark Connect, Airflow's api-server, scheduler, dag-processor and
triggerer on LocalExecutor/SQLite, the keyed job and the live generator, on 5-s windows;
the one-job registry ``examples/one_job.toml``, as ``test_service.py``).
Each test runs with no scheduled run (:func:`service_helpers.quiet`): every run is the
test's own manual trigger through the REST API with an explicit data interval, so the runs
and their plans are the test's alone, verified with the default verification tolerance.
Airflow's task-heartbeat timeouts are shortened for the stack
(:data:`service_helpers.AIRFLOW_TEST_SETTINGS`).

1. two manual triggers at once (two concurrent ``POST /api/v2/dags/rebalance/dagRuns``)
   on the default placement: exactly one plan is applied, the other run ends with the
   reason (``max_active_runs=1`` queues it behind the first; it then meets the cooldown of
   the MLDC trigger rules, ``trigger_rule`` mldc);
2. in the same runs (one scenario, checked by two tests), ``kill -9`` of the Airflow task
   process of the first run's ``publish`` right after its commit to ``plans``: Airflow's
   retry publishes the same plan id, no extra Delta version;
3. the scheduler (with its executor, supervisors and task processes) killed with
   ``kill -9`` while ``apply`` runs, then restarted by the service (``up`` starts what is
   down): the run completes, the plan is applied once, the apply lease is released;
4. a controlled restart while the DAG's side commits restart requests to the same
   ``restarts`` table all along: no row is lost or doubled.

The kill -9 of a task *inside* ``apply`` and two runs racing at ``apply`` are covered
without Airflow, faster, by ``test_faults.py`` (the retry of the same run, and the lease);
here the faults go through Airflow's own retry, queueing and scheduler recovery.
Figures are printed with ``-s`` and summarised in docs/reliability.md.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from service_helpers import (  # noqa: F401 - quiet and service are fixtures
    DAG,
    commit_metadata,
    delta_commits,
    quiet,
    read_delta,
    service,
)

from rebalance.ops.airflow_client import AirflowClient, AirflowError

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 600
#: The data interval of a forced run: the 6 latest windows of 5 s (a run looks back on 6).
FORCED_INTERVAL = dt.timedelta(seconds=30)


class Api(AirflowClient):
    """Airflow's REST API as the admin user, on runs of the ``rebalance`` DAG with the
    test's own data intervals."""

    def __init__(self, svc) -> None:
        super().__init__(svc.s.api_url, *svc.login())

    def trigger_in(self, run_id: str, logical: dt.datetime, start: dt.datetime,
                   end: dt.datetime, conf: dict) -> dict:
        return self.trigger(DAG, conf, run_id=run_id, logical_date=logical.isoformat(),
                            data_interval=(start.isoformat(), end.isoformat()))

    def tis(self, run_id: str) -> dict[str, dict]:
        return self.task_instances(DAG, run_id)

    def log(self, run_id: str, task_id: str, try_number: int) -> str:
        return json.dumps(self.task_log(DAG, run_id, task_id, try_number), default=str)

    def wait_done(self, run_id: str, timeout: float = RUN_TIMEOUT) -> dict:
        try:
            return self.wait(DAG, run_id, timeout)
        except TimeoutError as exc:
            raise AssertionError(str(exc)) from None


@pytest.fixture(scope="module")
def api(service):
    return Api(service)


# ------------------------------------------------------------------ reading the stack
def _tables(svc) -> Path:
    return svc.s.data / "tables"


def _ti_row(svc, run_id: str, task_id: str) -> tuple[str | None, int | None, int | None]:
    """(state, pid, try_number) of a task instance, read from Airflow's SQLite database
    (read-only; fast enough to catch a task of a few seconds)."""
    db = svc.s.airflow_home / "airflow.db"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = con.execute("SELECT state, pid, try_number FROM task_instance WHERE dag_id = ? "
                          "AND run_id = ? AND task_id = ? AND map_index = -1",
                          (DAG, run_id, task_id)).fetchone()
    except sqlite3.OperationalError:
        row = None
    finally:
        con.close()
    return row or (None, None, None)


def _plans_of(svc, run_id: str) -> list[dict]:
    t = read_delta(_tables(svc) / "plans", ["plan_id", "run_id", "status", "assignment_version"])
    return [r for r in (t.to_pylist() if t is not None else []) if r["run_id"] == run_id]


def _commits(svc, table: str, plan_id: str, action: str | None = None) -> list[int]:
    return [v for v, a in delta_commits(_tables(svc) / table)
            if commit_metadata(a).get("plan_id") == plan_id
            and (action is None or commit_metadata(a).get("action") == action)]


def _lease(svc) -> dict | None:
    t = read_delta(_tables(svc) / "control")
    rows = [r for r in (t.to_pylist() if t is not None else []) if r["name"] == "apply"]
    return {k: str(v) for k, v in rows[0].items()} if rows else None


def _interval(length: dt.timedelta = FORCED_INTERVAL) -> tuple[dt.datetime, dt.datetime]:
    end = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    return end - length, end


def _wait(what: str, check, timeout: float, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _applied_once(svc, api, run_id: str) -> dict:
    """The run succeeded and its one plan became exactly one assignment version."""
    plans = _plans_of(svc, run_id)
    assert len(plans) == 1, plans
    plan = plans[0]
    versions = _commits(svc, "assignments", plan["plan_id"])
    assert len(versions) == 1, (plan, versions)
    assert plan["status"] in ("applied", "verified") and plan["assignment_version"] == versions[0], plan
    return plan


# ------------------------------------------------------------------------- the tests
def _forced_interval(svc) -> tuple[dt.datetime, dt.datetime]:
    """The last 30 s up to the window grid, once the job has written every window of it: a
    forced run plans on them at once. (Taking the last 30 s without waiting made the run's
    plan depend on the job's lag: a job just started, or sharing the cores, wrote the
    interval's windows after the run's 20-s windows wait, and the run skipped.)"""
    _wait("three histogram windows from the live job", lambda: len(svc.windows_stored()) >= 3,
          300, 2)
    step = svc.s.window_seconds
    now = dt.datetime.now(dt.timezone.utc).timestamp()
    end = dt.datetime.fromtimestamp(now - now % step, dt.timezone.utc)
    svc.wait_windows_until(end, timeout=300)
    return end - FORCED_INTERVAL, end


#: The double trigger's runs look at the two windows of the last 10 s: a period of 10 s
#: for the trigger rules' cooldown (3 periods), which the rollback must be older than.
DOUBLE_TRIGGER_INTERVAL = dt.timedelta(seconds=10)
DOUBLE_TRIGGER_RUNS = ("manual__double-trigger-1", "manual__double-trigger-2")


@pytest.fixture(scope="module")
def double_trigger(service, api) -> dict:
    """Two identical triggers at once (a double click) on the default placement, which the
    MLDC trigger rules plan on without ``force``; the run that goes first has the
    Airflow task process of its ``publish`` killed with ``kill -9`` right after the commit
    to ``plans``. Returns what the two tests below check: the runs' ends, task instances,
    plans and the publish commits."""
    service.quiet()  # no scheduled run: the runs are the scenario's own
    service.restore_default_placement()
    live = [dt.datetime.fromisoformat(p["updated_at"]).timestamp() for p in api.plans()
            if p["status"] in ("applied", "verified", "diverged")]
    cooldown = 3 * DOUBLE_TRIGGER_INTERVAL.total_seconds()
    end_ts = max([time.time(), *(t + cooldown + 1 for t in live)])
    end = dt.datetime.fromtimestamp(5 * -(-end_ts // 5), dt.timezone.utc)  # on the 5-s grid
    service.wait_windows_until(end, timeout=cooldown + 120)
    start = end - DOUBLE_TRIGGER_INTERVAL
    runs = list(DOUBLE_TRIGGER_RUNS)
    # identical, as a double click sends; the MLDC rules, whose cooldown (no plan live
    # in the last 3 periods) refuses the second run whatever the loads after the first plan
    # verified over two 5-s windows, as every run of this module that must succeed: one
    # window's noise misses 1 + theta + verify_tolerance now and then (docs/testing.md)
    conf = {"apply_mode": "broadcast", "trigger_rule": "mldc", "verify_windows": 2}
    answers: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def post(i: int) -> None:
        barrier.wait()
        try:
            answers[runs[i]] = api.trigger_in(runs[i], end - dt.timedelta(seconds=i), start,
                                              end, conf)["state"]
        except AirflowError as exc:
            answers[runs[i]] = str(exc)
    threads = [threading.Thread(target=post, args=(i,)) for i in (0, 1)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(a in ("queued", "running") for a in answers.values()), answers

    def publishing():
        for run_id in runs:
            state, pid, _ = _ti_row(service, run_id, "publish")
            if state == "running" and pid:
                return run_id, pid
        return None
    first, pid = _wait("a publish task running", publishing, RUN_TIMEOUT, 0.05)
    plan_id = _plans_of(service, first)[0]["plan_id"]

    def published():
        if _commits(service, "plans", plan_id, "publish"):
            return True
        if _ti_row(service, first, "publish")[0] != "running":
            raise AssertionError("publish finished before its commit was seen: kill missed")
        return False
    _wait("the publish commit", published, 300, 0.01)
    os.killpg(pid, signal.SIGKILL)  # the task runner has its own process group
    killed = time.monotonic()
    after_kill = _ti_row(service, first, "publish")[0]
    done = {r: api.wait_done(r) for r in runs}
    return {"runs": runs, "answers": answers, "done": done, "first": first,
            "plan_id": plan_id, "state_right_after_kill": after_kill,
            "tis": {r: api.tis(r) for r in runs}, "plans": {r: _plans_of(service, r) for r in runs},
            "seconds_until_both_done": round(time.monotonic() - t0, 1),
            "seconds_from_kill_to_first_done": round(time.monotonic() - killed, 1)}


def test_two_manual_triggers_at_once_through_the_rest_api_apply_one_plan(
        quiet, api, double_trigger):
    """One run applies a plan; the other, queued behind it, meets the rules' cooldown and
    stores nothing."""
    service, d = quiet, double_trigger
    runs, done = d["runs"], d["done"]
    assert all(x["state"] == "success" for x in done.values()), {
        r: {k: v["state"] for k, v in d["tis"][r].items()} for r in runs}
    applied = [r for r in runs if d["plans"][r]]
    assert applied == [d["first"]], d["plans"]
    winner, other = applied[0], next(r for r in runs if r != applied[0])
    plan = _applied_once(service, api, winner)
    # the other run waited (max_active_runs=1), then skipped with the reason, storing nothing
    assert done[other]["start_date"] >= done[winner]["end_date"], done
    tis = d["tis"][other]
    assert tis["detect"]["state"] == "skipped", {k: v["state"] for k, v in tis.items()}
    assert tis["apply"]["state"] == "skipped"
    reason = api.log(other, "detect", tis["detect"]["try_number"])
    assert "trigger rules" in reason, reason[-2000:]
    said = next((m for m in reason.split('"') if "trigger rules" in m), "")
    service.figures["double_trigger"] = {
        "post_answers": d["answers"], "winner": winner, "plan": plan,
        "other_started_after_winner_ended": True, "other_reason": said[:300],
        "seconds_until_both_done": d["seconds_until_both_done"]}
    print("two triggers at once:", service.figures["double_trigger"], flush=True)


def test_kill9_of_the_publish_task_process_then_the_retry_publishes_the_same_plan_once(
        quiet, api, double_trigger):
    """The first run's ``publish`` killed after its commit: Airflow's retry publishes the
    same plan id, with no extra Delta version, and the plan is applied once."""
    service, d = quiet, double_trigger
    run_id, plan_id = d["first"], d["plan_id"]
    tis = d["tis"][run_id]
    assert d["done"][run_id]["state"] == "success", {k: v["state"] for k, v in tis.items()}
    assert tis["publish"]["try_number"] >= 2, tis["publish"]  # Airflow retried the killed try
    first_try = api.log(run_id, "publish", 1)
    plan = _applied_once(service, api, run_id)                 # same plan id: one plan row
    assert plan["plan_id"] == plan_id
    assert len(_commits(service, "plans", plan_id, "publish")) == 1  # no extra version
    assert len(_commits(service, "plan_assignments", plan_id)) == 1
    service.figures["kill9_publish"] = {
        "plan_id": plan_id, "state_right_after_kill": d["state_right_after_kill"],
        "publish_tries": tis["publish"]["try_number"],
        "first_try_log_tail": first_try[-300:],
        "seconds_from_kill_to_run_success": d["seconds_from_kill_to_first_done"]}
    print("kill -9 during publish:", service.figures["kill9_publish"], flush=True)


def _kill_tree(rec) -> list[int]:
    from rebalance.ops.processes import descendants as _children
    from rebalance.ops.processes import group_members as _group_members

    pids = list(dict.fromkeys([rec.pid, *_children(rec.pid), *_group_members(rec.pid)]))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def test_the_scheduler_killed_mid_run_and_restarted_the_run_completes_once(quiet, api):
    from rebalance.ops.service import alive

    service = quiet
    start, end = _forced_interval(service)
    run_id = "manual__faults-scheduler"
    api.trigger_in(run_id, end, start, end,
                   {"force": True, "apply_mode": "broadcast", "verify_windows": 2})

    def in_apply():
        for task in ("apply", "await_restart", "verify"):
            state, pid, _ = _ti_row(service, run_id, task)
            if state == "running" and pid:
                return task
        return None
    task = _wait("apply (or the next task) running", in_apply, RUN_TIMEOUT, 0.05)
    plan_id = _plans_of(service, run_id)[0]["plan_id"]
    if task == "apply":
        # the harshest moment: apply holds the lease (and may be writing the version)
        def holding():
            lease = _lease(service) or {}
            if lease.get("holder") == plan_id:
                return "apply (lease held)"
            return None if _ti_row(service, run_id, "apply")[0] == "running" else "apply ended"
        task = _wait("apply to take the lease", holding, 300, 0.05)
    rec = service.records()["scheduler"]
    pids = _kill_tree(rec)
    killed = time.monotonic()
    _wait("the scheduler's processes gone", lambda: not any(
        Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split(")")[-1][:3]
        for p in pids), 30, 0.2)
    assert not alive(rec)
    lease_after_kill = _lease(service)
    versions_after_kill = _commits(service, "assignments", plan_id)
    status_after_kill = _plans_of(service, run_id)[0]["status"]
    time.sleep(5)
    assert service.up() == ["scheduler"]  # make up again: only what is down starts
    restarted = time.monotonic()
    run = api.wait_done(run_id)
    done = time.monotonic()
    tis = api.tis(run_id)
    assert run["state"] == "success", {k: (v["state"], v["try_number"]) for k, v in tis.items()}
    plan = _applied_once(service, api, run_id)
    assert plan["plan_id"] == plan_id
    lease = _lease(service)
    assert lease is not None and lease["holder"] == "None", lease  # released
    service.figures["scheduler_kill"] = {
        "task_running_at_kill": task, "processes_killed": len(pids), "plan_id": plan_id,
        "plan_status_after_kill": status_after_kill, "lease_after_kill": lease_after_kill,
        "assignment_versions_after_kill": versions_after_kill,
        "tries": {k: v["try_number"] for k, v in tis.items()},
        "seconds_kill_to_restart": round(restarted - killed, 1),
        "seconds_from_kill_to_run_success": round(done - killed, 1)}
    print("scheduler killed:", service.figures["scheduler_kill"], flush=True)


#: The DAG's side of the restarts table, in its own process as Airflow's tasks are: a Spark Connect
#: client (``pyspark.sql.SparkSession.builder.remote`` refuses to start in a process that
#: already runs a classic session, as the test process does in the full suite) committing
#: restart requests from when ``go`` exists until ``stop`` exists; each landed request id is
#: appended to ``written`` (created once the client is connected).
HAMMER = """
import sys, time
from pathlib import Path
from rebalance.spark import tables
from rebalance.spark.session import remote_session
from rebalance.streaming.restart.control import RestartControl

url, where, go, stop, written, errors = sys.argv[1:7]
spark = remote_session(url)
probe = RestartControl(spark, "probe", where)
assert tables.exists(spark, tables.RESTARTS, where)
Path(written).touch()
while not Path(go).exists():
    time.sleep(0.1)
i = 0
while not Path(stop).exists():
    rid = f"probe-{i:04d}"
    try:
        probe.request(0, 4, request_id=rid)
        with open(written, "a") as out:
            out.write(rid + "\\n")
    except Exception as exc:  # a lost write is what the test reports
        with open(errors, "a") as out:
            out.write(f"{rid}: {type(exc).__name__}: {str(exc)[:300]!r}\\n")
    i += 1
    time.sleep(0.2)  # a request commits in milliseconds (delta-rs): a few a second
spark.stop()
"""


def test_a_controlled_restart_while_the_dag_side_writes_restarts_loses_and_doubles_no_row(
        quiet, api, tmp_path):
    """The job writes its restart steps to ``restarts`` while the DAG's side commits restart
    requests to the same table all along (as the DAG's tasks do, from a Spark Connect
    session; both sides commit a step through delta-rs): every row of either side lands
    exactly once.

    Whether two of those commits overlap (the later one is then reconciled over the
    other: Spark records the older ``readVersion``, delta-rs its ``num_retries``) is up to
    timing, so it is counted and printed, not required; a conflict that is not reconciled
    is retried by ``RestartControl`` and would show here as a lost or doubled row, or as
    an error of either side."""
    import subprocess
    import sys

    service = quiet
    start, end = _forced_interval(service)
    run_id = "manual__faults-restart-concurrent"
    go, stop, written_file, errors_file = (
        tmp_path / n for n in ("go", "stop", "written", "errors"))
    hammer = subprocess.Popen(
        [sys.executable, "-c", HAMMER, service.s.connect_url, str(_tables(service)),
         str(go), str(stop), str(written_file), str(errors_file)])
    try:
        _wait("the DAG-side client", lambda: written_file.exists() or hammer.poll() is not None,
              180)
        assert hammer.poll() is None, f"the DAG-side client exited: {hammer.returncode}"
        # verified over two windows: one 5-s window right after a restart is noisy enough
        # to miss 1 + theta + verify_tolerance about one run in six
        api.trigger_in(run_id, end, start, end,
                       {"force": True, "apply_mode": "restart", "verify_windows": 2})
        _wait("the run's plan", lambda: _plans_of(service, run_id), RUN_TIMEOUT, 2)
        plan_id = _plans_of(service, run_id)[0]["plan_id"]
        go.touch()
        run = api.wait_done(run_id)
    finally:
        stop.touch()
        try:
            hammer.wait(timeout=300)
        except subprocess.TimeoutExpired:
            hammer.kill()
            hammer.wait()
    assert hammer.returncode == 0, hammer.returncode
    written = written_file.read_text().split()
    errors = errors_file.read_text().splitlines() if errors_file.exists() else []
    tis = api.tis(run_id)
    assert run["state"] == "success", {k: (v["state"], v["try_number"]) for k, v in tis.items()}
    assert not errors, errors
    rows = read_delta(_tables(service) / "restarts").to_pylist()
    job_steps = [r["step"] for r in rows if r["request_id"] == plan_id and r["job"] == "keyed"]
    assert "acknowledged" in job_steps and len(job_steps) == len(set(job_steps)), job_steps
    probes = [r["request_id"] for r in rows if r["job"] == "probe"]
    assert sorted(probes) == sorted(written), (len(probes), len(written))
    assert written, "the DAG side wrote no request while the run went on"
    # Delta's optimistic concurrency: a commit whose snapshot was older than the version
    # before it was reconciled over the commits in between (a figure, not a requirement).
    raced, rs_raced, side = [], [], {}
    for version, actions in delta_commits(_tables(service) / "restarts"):
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        meta = commit_metadata(actions)
        if meta.get("job") is not None:  # unlabelled: the table's creation, neither side
            side[version] = ("job" if meta["job"] == "keyed" and meta.get("step") != "requested"
                             else "dag")  # the DAG's own request of this restart is DAG-side
        read = info.get("readVersion")
        if read is not None and version - read > 1:
            raced.append((version, read, side.get(version), meta.get("step")))
        elif read is None and int((info.get("operationMetrics") or {}).get("num_retries") or 0):
            rs_raced.append((version, side.get(version), meta.get("step")))
    other = {"job": "dag", "dag": "job"}
    across = [r for r in raced  # reconciled over at least one commit of the other side
              if other.get(r[2]) in {side.get(v) for v in range(r[1] + 1, r[0])}]
    job_raced = [r for r in across if r[2] == "job"]
    _applied_once(service, api, run_id)
    service.figures["restarts_conflict"] = {
        "plan_id": plan_id, "job_steps": job_steps, "dag_side_requests": len(written),
        "commits_retried_over_another": len(raced), "across_the_two_sides": len(across),
        "job_commits_retried": job_raced, "delta_rs_commits_retried": len(rs_raced),
        "delta_rs_job_commits_retried": [r for r in rs_raced if r[1] == "job"]}
    print("restarts conflict:", service.figures["restarts_conflict"], flush=True)
