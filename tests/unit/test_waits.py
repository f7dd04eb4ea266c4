"""The deferred waits of the DAG (rebalance.control.waits): the trigger's loop, its
serialization, and how a check's error crosses back to the task. The checks themselves
(rollout.await_restart, rollout.verify) run for real in the DAG integration tests."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest

from rebalance.control import waits
from rebalance.control.errors import RestartFailed, RunSkipped, VerificationFailed


@pytest.fixture(autouse=True)
def _no_tables(monkeypatch, tmp_path):
    """The waits list tables' logs under the data folder: an empty one unless a test
    makes tables (never a developer's own ``data/``)."""
    monkeypatch.setenv("REBALANCE_DATA_DIR", str(tmp_path))


def _events(trigger) -> list:
    async def collect():
        return [event async for event in trigger.run()]
    return asyncio.run(collect())


def test_the_trigger_checks_until_done_and_yields_one_event(monkeypatch):
    answers = iter([{"is_done": False, "xcom_value": None}] * 2
                   + [{"is_done": True, "xcom_value": {"plan": "p"}}])
    seen = []

    def check(payload):
        seen.append(payload)
        return next(answers)
    monkeypatch.setitem(waits.CHECKS, "verify", check)
    trigger = waits.RolloutWaitTrigger("verify", {"plan": {"plan_id": "p"}}, 0.01)
    (event,) = _events(trigger)
    assert event.payload == {"status": "done", "xcom_value": {"plan": "p"}}
    assert len(seen) == 3 and seen[0] == {"plan": {"plan_id": "p"}}


def test_a_failed_check_ends_the_wait_with_its_error(monkeypatch):
    def check(payload):
        raise RestartFailed("plan p: controlled restart failed; version 3 restored as 5")
    monkeypatch.setitem(waits.CHECKS, "await_restart", check)
    (event,) = _events(waits.RolloutWaitTrigger("await_restart", {}, 0.01))
    assert event.payload == {"status": "error", "error": "RestartFailed",
                             "message": "plan p: controlled restart failed; version 3 "
                                        "restored as 5"}


def test_the_trigger_serializes_to_what_rebuilds_it():
    trigger = waits.RolloutWaitTrigger("verify", {"plan": {"plan_id": "p"}}, 10)
    path, kwargs = trigger.serialize()
    assert path == "rebalance.control.waits.RolloutWaitTrigger"
    again = waits.RolloutWaitTrigger(**kwargs)
    assert (again.check, again.payload, again.poke_seconds) == ("verify", {"plan": {"plan_id": "p"}},
                                                                10.0)


@pytest.mark.parametrize("error, cls", [("RestartFailed", RestartFailed),
                                        ("VerificationFailed", VerificationFailed),
                                        ("RunSkipped", RunSkipped)])
def test_the_task_raises_the_checks_error_when_it_resumes(error, cls):
    task = waits.RolloutWait(task_id="verify", check="verify", payload={}, poke_seconds=1,
                             timeout=dt.timedelta(hours=1))
    with pytest.raises(cls, match="the message"):
        task.resume({}, {"status": "error", "error": error, "message": "the message"})
    assert task.resume({}, {"status": "done", "xcom_value": 7}) == 7
    with pytest.raises(RuntimeError, match="verify: KeyError: 'x'"):
        task.resume({}, {"status": "error", "error": "KeyError", "message": "'x'"})


def test_an_unknown_check_is_refused():
    with pytest.raises(ValueError, match="unknown check 'wait'"):
        waits.RolloutWaitTrigger("wait", {}, 1)
    with pytest.raises(ValueError, match="unknown check 'wait'"):
        waits.RolloutWait(task_id="x", check="wait", payload={}, poke_seconds=1,
                          timeout=dt.timedelta(hours=1))


def test_the_waits_poll_and_retry_delay_come_from_the_environment_or_the_defaults(
        monkeypatch):
    from rebalance.control import inputs
    from rebalance.ops.service import Settings, airflow_env

    monkeypatch.delenv("REBALANCE_WAIT_POLL_SECONDS", raising=False)
    monkeypatch.delenv("REBALANCE_RETRY_DELAY_SECONDS", raising=False)
    assert (inputs.wait_poll_seconds(), inputs.retry_delay_seconds()) == (5.0, 30.0)
    monkeypatch.setenv("REBALANCE_WAIT_POLL_SECONDS", "1.25")
    monkeypatch.setenv("REBALANCE_RETRY_DELAY_SECONDS", "0")
    assert (inputs.wait_poll_seconds(), inputs.retry_delay_seconds()) == (1.25, 0.0)
    for bad in ("0", "-1", "soon", "nan", "601"):
        monkeypatch.setenv("REBALANCE_WAIT_POLL_SECONDS", bad)
        with pytest.raises(ValueError, match=f"REBALANCE_WAIT_POLL_SECONDS must be .*{bad!r}"):
            inputs.wait_poll_seconds()
    monkeypatch.setenv("REBALANCE_RETRY_DELAY_SECONDS", "-5")
    with pytest.raises(ValueError, match="REBALANCE_RETRY_DELAY_SECONDS must be .*'-5'"):
        inputs.retry_delay_seconds()
    # the windows wait: none by default, the service's 90 s, and a bad value named
    monkeypatch.delenv("REBALANCE_WINDOWS_WAIT_SECONDS", raising=False)
    assert inputs.windows_wait_seconds() == 0.0
    monkeypatch.setenv("REBALANCE_WINDOWS_WAIT_SECONDS", "90")
    assert inputs.windows_wait_seconds() == 90.0
    for bad in ("-1", "a minute", "inf", "3601"):
        monkeypatch.setenv("REBALANCE_WINDOWS_WAIT_SECONDS", bad)
        with pytest.raises(ValueError, match=f"REBALANCE_WINDOWS_WAIT_SECONDS must be a "
                                             f"number of seconds in \\[0, 3600\\], got {bad!r}"):
            inputs.windows_wait_seconds()
    # the job's staleness limit reads the same way, and apply refuses a bad one
    from rebalance.control import rollout
    from rebalance.control.errors import ApplyRefused

    monkeypatch.setenv("REBALANCE_JOB_STALE_SECONDS", "90")
    assert rollout.job_stale_seconds() == 90.0
    monkeypatch.setenv("REBALANCE_JOB_STALE_SECONDS", "0")
    with pytest.raises(ApplyRefused, match="REBALANCE_JOB_STALE_SECONDS must be a number of "
                                           "seconds > 0, got '0'"):
        rollout.job_stale_seconds()
    # the service polls a few times per window, at most every 5 s
    env = airflow_env(Settings(window_seconds=5, retry_delay_seconds=5))
    assert (env["REBALANCE_WAIT_POLL_SECONDS"], env["REBALANCE_RETRY_DELAY_SECONDS"]) == (
        "1.25", "5")
    assert airflow_env(Settings())["REBALANCE_WAIT_POLL_SECONDS"] == "5"


def _table_logs(root, *names) -> dict:
    logs = {}
    for name in names:
        logs[name] = root / "tables" / name / "_delta_log"
        logs[name].mkdir(parents=True)
        (logs[name] / f"{0:020d}.json").write_text("{}")
    return logs


def test_a_waiting_check_runs_again_only_once_a_watched_table_has_a_new_commit(
        monkeypatch, tmp_path):
    """Between checks the trigger lists the watched tables' logs; while no commit lands
    (and the deadline is far) it does not run the check."""
    logs = _table_logs(tmp_path, "key_histograms", "plans")
    checks, polls = [], []
    listed = waits.log_versions

    def log_versions(check, job=None):
        polls.append(check)
        if len(polls) == 6:            # the job commits a window between two pokes
            (logs["key_histograms"] / f"{1:020d}.json").write_text("{}")
        return listed(check, job)

    def check(payload):
        checks.append(len(polls))
        if len(checks) == 1:
            return {"is_done": False, "xcom_value": None, "recheck_at": time.time() + 3600}
        return {"is_done": True, "xcom_value": 7}
    monkeypatch.setattr(waits, "log_versions", log_versions)
    monkeypatch.setitem(waits.CHECKS, "verify", check)
    (event,) = _events(waits.RolloutWaitTrigger("verify", {}, 0.01))
    assert event.payload == {"status": "done", "xcom_value": 7}
    assert checks == [1, 6], (checks, polls)   # pokes 2-5 listed the logs only
    assert {k: v[0] for k, v in waits.log_versions("verify").items()} == {
        "key_histograms": 1, "plans": 0}


def test_a_waiting_check_runs_again_at_its_deadline_and_every_poke_when_unlisted(
        monkeypatch, tmp_path):
    _table_logs(tmp_path, "restarts", "plans")
    checks = []

    def check(payload):
        checks.append(time.time())
        if len(checks) == 1:       # times out in 0.2 s: checked again then, with no commit
            return {"is_done": False, "xcom_value": None, "recheck_at": time.time() + 0.2}
        return {"is_done": True, "xcom_value": None}
    monkeypatch.setitem(waits.CHECKS, "await_restart", check)
    _events(waits.RolloutWaitTrigger("await_restart", {}, 0.01))
    assert len(checks) == 2 and checks[1] - checks[0] >= 0.2
    # a table not created yet cannot be listed: no skipping, the check runs every poke
    assert waits.log_versions("windows")["key_histograms"] is None
    assert not waits.unchanged({"key_histograms": None}, {"key_histograms": None})
    assert not waits.unchanged({}, {})
    assert waits.unchanged({"plans": 3}, {"plans": 3})


def test_two_jobs_triggers_on_one_triggerer_each_check_and_list_their_own_job(
        monkeypatch, tmp_path):
    """The triggerer runs every job's waits in one process: each trigger runs its check as
    its own job (tables, name; a context variable, not the process's environment) and its
    event's XCom names that job; a payload of another job is refused."""
    from rebalance.control import inputs, jobs
    from rebalance.core.registry import JobConfig
    from rebalance.spark import tables

    clicks = JobConfig(name="clicks", dag_id="rebalance_clicks", tables="jobs/clicks/tables")
    views = JobConfig(name="views", dag_id="rebalance_views", tables=str(tmp_path / "v"))
    seen = []

    def check(payload):
        time.sleep(0.05)              # both checks overlap on the triggerer's threads
        seen.append((inputs.job_name(), tables.tables_root()))
        return {"is_done": True, "xcom_value": {"root": str(tables.tables_root())}}
    monkeypatch.setitem(waits.CHECKS, "verify", check)

    async def both():
        async def one(job):
            trigger = waits.RolloutWaitTrigger("verify", {}, 0.01, jobs.to_dict(job))
            return [event async for event in trigger.run()]
        return await asyncio.gather(one(clicks), one(views))
    (c,), (v,) = asyncio.run(both())
    assert c.payload["xcom_value"] == {"root": str(tmp_path / "jobs/clicks/tables"),
                                       "job": "clicks"}
    assert v.payload["xcom_value"] == {"root": str(tmp_path / "v"), "job": "views"}
    assert sorted(seen) == [("clicks", tmp_path / "jobs/clicks/tables"),
                            ("views", tmp_path / "v")]
    assert inputs.job_name() == "keyed" and tables.tables_root() == tmp_path / "tables"
    (refused,) = _events(waits.RolloutWaitTrigger("verify", {"job": "clicks"}, 0.01,
                                                  jobs.to_dict(views)))
    assert refused.payload["status"] == "error"
    assert refused.payload["message"].startswith("this payload belongs to job 'clicks'; "
                                                 "the DAG of job 'views' never")


def test_a_run_waits_for_a_job_that_just_started_and_from_its_interval_end(monkeypatch):
    """The windows wait (inputs._wait_until, windows_args): counted from the interval's end
    when it lies ahead; while the job that (re)started since has written no histogram, it
    lasts JOB_START_SECONDS from that start; then it counts from the job's first commit
    (maintenance commits are not the job's); a job started long ago, or no wait, changes
    nothing. Real tables, written through delta-rs."""
    from rebalance.control import inputs
    from rebalance.spark import tables

    now = time.time()
    ahead = dt.datetime.fromtimestamp(now + 30, dt.timezone.utc)
    args = inputs.windows_args({}, "rebalance", "manual__x", "manual", ahead - dt.timedelta(
        minutes=2), ahead)
    assert args["deadline"] == pytest.approx(now + 30, abs=2) and args["wait"] == 0.0
    args = {"deadline": now + 5, "wait": 40.0}
    assert inputs._wait_until(None, args) == now + 5          # no job recorded
    for table in (tables.JOBS, tables.KEY_HISTOGRAMS):
        tables.ensure_table(None, table)
    started = dt.datetime.fromtimestamp(now - 20, dt.timezone.utc)
    tables.append_rows(None, [{"job": "keyed", "capability": "restart", "app": "t",
                               "generation": 0, "started_at": started, "host": "h", "pid": 1,
                               "splits": True}], tables.JOBS)
    until = inputs._wait_until(None, args)
    assert until == pytest.approx(now - 20 + inputs.JOB_START_SECONDS, abs=1)
    assert inputs._wait_until(None, {**args, "wait": 0.0}) == now + 5
    # a maintenance commit is not the job's first window; the job's own commit is
    row = {c: None for c in tables.KEY_HISTOGRAMS.columns}
    tables.append_rows(None, [row], tables.KEY_HISTOGRAMS, metadata={"kind": "maintenance"})
    assert inputs._wait_until(None, args) == until
    tables.append_rows(None, [row], tables.KEY_HISTOGRAMS, metadata={"batch_id": 0})
    first = tables.history(None, tables.KEY_HISTOGRAMS, limit=1)[0].timestamp
    assert inputs._wait_until(None, args) == pytest.approx(
        first.replace(tzinfo=dt.timezone.utc).timestamp() + 40, abs=0.01)
    # a job whose newest start is an hour old: the wait is the run's own
    monkeypatch.setenv("REBALANCE_JOB_NAME", "other")
    tables.append_rows(None, [{"job": "other", "capability": "live", "app": "t",
                               "generation": 0, "started_at": started - dt.timedelta(hours=1),
                               "host": "h", "pid": 2, "splits": True}], tables.JOBS)
    assert inputs._wait_until(None, args) == now + 5
