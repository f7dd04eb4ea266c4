"""Helpers shared by the tests that run the service's processes (test_service, test_faults).

* :func:`free_port`: a free TCP port on 127.0.0.1.
* :func:`read_delta` / :func:`delta_commits`: a Delta table's current rows and its commits,
  read from the ``_delta_log`` JSON files with pyarrow: the test process checks what the
  Spark processes wrote without starting a JVM of its own (appends and overwrites of
  plain Parquet tables: no deletion vectors or column mapping, which these tables do not
  use; a table with them is refused, not misread).
* :class:`EventsWriter`: appends batches of :class:`rebalance.streaming.generator.EventGenerator`
  to the ``events`` Delta table, one commit and one file per batch, exactly as
  ``generate_events.py`` lays them out, but without a JVM (on this shared 2-core machine
  the generator's own Spark took about 3 minutes for 8 batches).
* :class:`Proc`: a process started in its own process group, its log in a file, stopped or
  killed (SIGKILL of the whole group: the Python driver, its JVM and Python workers).
* :func:`service`: the one service stack (``make up``'s processes, :class:`ServiceStack`)
  of a test session, shared by ``test_service.py`` and ``test_service_faults.py``, on
  test-sized time constants; :func:`quiet` / :func:`scheduled`: the DAG's schedule a test
  needs (no scheduled run, or one every 30 s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rebalance.ops.service import Service


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def running_broker(folder: Path):
    """A single-node Kafka broker (``rebalance.ops.kafka.Broker``) on a free port and the one
    after it (its controller), in ``folder``; stopped at the end, both ports checked closed."""
    from rebalance.ops.kafka import Broker, BrokerSettings

    port = free_port()
    while port_taken(port + 1):
        port = free_port()
    b = Broker(BrokerSettings(dir=folder, port=port), out=lambda _: None)
    b.up()
    try:
        yield b
    finally:
        b.down()
        assert not b.running()
        assert not port_taken(port) and not port_taken(port + 1)


# ------------------------------------------------------------------------- Delta, read
def delta_commits(path: str | Path) -> list[tuple[int, list[dict]]]:
    """Every commit of the table: (version, actions), oldest first."""
    log = Path(path) / "_delta_log"
    out = []
    for f in sorted(log.glob("*.json")):
        if not f.stem.isdigit():
            continue
        try:
            actions = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        except (OSError, json.JSONDecodeError):
            continue  # a commit being written right now (Delta writes it atomically)
        out.append((int(f.stem), actions))
    return out


def commit_metadata(actions: list[dict]) -> dict:
    """The commit's ``userMetadata`` JSON (empty when none)."""
    for a in actions:
        info = a.get("commitInfo")
        if info and info.get("userMetadata"):
            try:
                return json.loads(info["userMetadata"])
            except json.JSONDecodeError:
                return {}
    return {}


def read_delta(path: str | Path, columns: list[str] | None = None):
    """The table's current rows (a pyarrow Table), from the log's add and remove actions."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    live: dict[str, dict] = {}
    schema = None
    for _, actions in delta_commits(path):
        for a in actions:
            if "metaData" in a:
                schema = a["metaData"]
                cfg = schema.get("configuration") or {}
                if cfg.get("delta.columnMapping.mode", "none") != "none":
                    raise ValueError(f"{path}: column mapping is not read here")
            if "add" in a:
                if a["add"].get("deletionVector"):
                    raise ValueError(f"{path}: deletion vectors are not read here")
                live[a["add"]["path"]] = a["add"]
            if "remove" in a:
                live.pop(a["remove"]["path"], None)
    from urllib.parse import unquote

    parts = [_without_views(pq.read_table(path / unquote(p), columns=columns))
             for p in sorted(live)]
    parts = [t for t in parts if t.num_rows]
    if not parts:
        return None if schema is None else pa.table({c: [] for c in (columns or [])})
    return pa.concat_tables(parts, promote_options="permissive")


def _without_views(table):
    """String and binary view columns (what delta-rs writes) as plain string and binary,
    so files written by Spark and by delta-rs concatenate."""
    import pyarrow as pa

    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    return table.cast(pa.schema([f.with_type(plain.get(f.type, f.type)) for f in table.schema]))


# ------------------------------------------------------------------------ Delta, write
class EventsWriter:
    """Appends generator batches to ``<tables>/events`` as a minimal Delta writer.

    Commit 0 creates the table (protocol 1/2, the ``events`` schema of
    :data:`rebalance.spark.tables.EVENTS`); each batch is then one commit with one Parquet
    file and the generator's commit metadata. A commit file is published by ``os.link``
    (fails if the version exists), so the commit is atomic like Delta's own.
    """

    def __init__(self, tables_root: Path, config) -> None:
        from rebalance.streaming.generator import EventGenerator

        self.path = Path(tables_root) / "events"
        self.log = self.path / "_delta_log"
        self.generator = EventGenerator(config)
        self.config = config
        self.sent = []  # the pandas frames appended, in order

    def _commit(self, actions: list[dict]) -> int:
        self.log.mkdir(parents=True, exist_ok=True)
        versions = [int(f.stem) for f in self.log.glob("*.json") if f.stem.isdigit()]
        version = max(versions) + 1 if versions else 0
        tmp = self.log / f".tmp-{uuid.uuid4().hex}.json"
        tmp.write_text("".join(json.dumps(a) + "\n" for a in actions))
        try:
            os.link(tmp, self.log / f"{version:020d}.json")
        finally:
            tmp.unlink()
        return version

    def create(self) -> None:
        from rebalance.spark.tables import EVENTS

        now = int(time.time() * 1000)
        fields = [{"name": c.split()[0], "type": "string", "nullable": True, "metadata": {}}
                  for c in EVENTS.schema_ddl.split(", ")]
        self._commit([
            {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE",
                            "isBlindAppend": True, "engineInfo": "rebalance-tests"}},
            {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                          "schemaString": json.dumps({"type": "struct", "fields": fields}),
                          "partitionColumns": [], "configuration": {}, "createdTime": now}},
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        ])

    def append(self, batch: int):
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.log.is_dir():
            self.create()
        events = self.generator.batch(batch).events
        name = f"part-{batch:05d}-{uuid.uuid4()}.c000.snappy.parquet"
        table = pa.Table.from_pandas(events, preserve_index=False).cast(pa.schema(
            [(c, pa.string()) for c in events.columns]))
        pq.write_table(table, self.path / name)
        size = (self.path / name).stat().st_size
        now = int(time.time() * 1000)
        meta = {"kind": "generator", "batch": batch, "config": self.config.to_dict()}
        self._commit([
            {"commitInfo": {"timestamp": now, "operation": "WRITE", "isBlindAppend": True,
                            "operationParameters": {"mode": "Append"},
                            "userMetadata": json.dumps(meta), "engineInfo": "rebalance-tests"}},
            {"add": {"path": name, "partitionValues": {}, "size": size, "modificationTime": now,
                     "dataChange": True}},
        ])
        self.sent.append(events)
        return events


# ---------------------------------------------------------------------------- processes
class Proc:
    """A process in its own group, output to ``log``; every pid it had is remembered."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path | None = None):
        self.argv, self.log = argv, Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as fh:
            self.popen = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env,
                                          cwd=str(cwd) if cwd else None, start_new_session=True)
        self.pid = self.popen.pid
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def group(self) -> list[int]:
        """Pids of the process group (the driver, its JVM, Python workers)."""
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == self.pid:  # pgrp, not a zombie
                out.append(int(d.name))
        return out

    def kill9(self) -> float:
        """SIGKILL the whole group at once; returns the time it took until all are gone."""
        t0 = time.monotonic()
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=60)
        self._wait_group_gone(30)
        return time.monotonic() - t0

    def stop(self, grace: float = 30.0) -> None:
        """SIGINT (queries stop at a batch boundary), then SIGKILL of the group."""
        if self.alive():
            try:
                os.killpg(self.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        if self.group():
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.alive():
            self.popen.wait(timeout=30)
        self._wait_group_gone(30)

    def _wait_group_gone(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.group() and time.monotonic() < deadline:
            time.sleep(0.2)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.output().splitlines()[-n:])


# ------------------------------------------------------------- the DAG's steps, as a child
#: Both children below end as an Airflow task process ends (the task SDK's forked child:
#: flush, then ``os._exit``), without the interpreter's teardown, where a library's native
#: thread pool can abort a process whose work is done ("terminate called without an active
#: exception"; docs/testing.md), which an Airflow task never reaches.
#:
#: ``python -c PIPELINE_CHILD DATA_INTERVAL_START DATA_INTERVAL_END RUN_ID``: the
#: ``rebalance`` DAG's task functions in order (windows -> detect -> plan -> validate ->
#: publish -> apply), as the Airflow task processes call them, in one process the tests can
#: ``kill -9``. Prints ``STEP <name> start`` / ``STEP <name> done <plan id>`` lines.
PIPELINE_CHILD = r'''
import os, sys
from rebalance.control import inputs, rollout, tasks

start, end, run_id = sys.argv[1:4]
params = {"method": "mixed", "theta": 0.1, "max_table": None, "migration_budget": None,
          "lookback_windows": 6, "min_windows": 1, "min_events": 1, "apply_mode": "broadcast",
          "require_approval": False, "force": True}

def step(name, fn, *args):
    print(f"STEP {name} start", flush=True)
    out = fn(*args)
    plan = (out.get("plan") or {}).get("plan_id") if isinstance(out, dict) else None
    print(f"STEP {name} done {plan}", flush=True)
    return out

w = step("windows", inputs.read_windows, params, "rebalance", run_id, "manual", start, end)
d = step("detect", tasks.detect, w)
p = step("plan", tasks.plan, d)
v = step("validate", tasks.validate, p)
pub = step("publish", tasks.publish, v)
a = step("apply", rollout.apply, pub)
print("STATUS", a["plan"]["status"], a["plan"].get("assignment_version"), flush=True)
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)   # as an Airflow task process ends (above)
'''


#: ``python -c RUNS_CHILD RUN_ID:START:END ...``: the same steps for several runs in one
#: process (one JVM); prints ``RESULT <run id> applied <plan id> <version>`` or ``RESULT
#: <run id> <exception class> <message>`` per run. Windows are waited for 5 s at most.
RUNS_CHILD = r'''
import os, sys
os.environ["REBALANCE_WINDOWS_WAIT_SECONDS"] = "5"
from rebalance.control import inputs, rollout, tasks

params = {"method": "mixed", "theta": 0.1, "max_table": None, "migration_budget": None,
          "lookback_windows": 6, "min_windows": 1, "min_events": 1, "apply_mode": "broadcast",
          "require_approval": False, "force": True}
for spec in sys.argv[1:]:
    run_id, start, end = spec.split("|")
    try:
        w = inputs.read_windows(params, "rebalance", run_id, "manual", start, end)
        a = rollout.apply(tasks.publish(tasks.validate(tasks.plan(tasks.detect(w)))))
        print(f"RESULT {run_id} applied {a['plan']['plan_id']} {a['plan'].get('assignment_version')}",
              flush=True)
    except Exception as exc:
        line = str(exc).replace("\n", " ")
        print(f"RESULT {run_id} {type(exc).__name__} {line}", flush=True)
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)   # as an Airflow task process ends (above)
'''


# ------------------------------------------------------------- the shared service stack
DAG = "rebalance"
#: The schedule while a test wants the scheduler to plan on its own: a run every 30 s,
#: whose data interval holds the 6 windows of 5 s a run looks back on.
SCHEDULE = "30s"
#: The schedule while a test wants no scheduled run: manual runs only (a manual run,
#: triggered from the UI's form with a logical date or over REST without one, plans on the
#: latest windows stored; a yearly cron would give a UI-triggered run last year's
#: interval). Pausing the DAG would not do: Airflow starts no run of a paused DAG, the
#: manual runs every test triggers included (they stay queued), so the schedule itself is
#: switched (:meth:`ServiceStack.set_schedule`).
QUIET = "none"
#: Airflow settings of the test stack (Airflow 3.3's defaults in brackets): a task whose
#: supervisor stopped heartbeating is failed after 60 s [300], checked every 5 s [10];
#: a scheduler is taken for dead after 15 s [30] and orphaned tasks are looked for every
#: 30 s [300] (the scheduler-kill test waits on these).
AIRFLOW_TEST_SETTINGS = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
}


def stack_settings(root: Path):
    """The service's settings for tests: the same processes on test-sized time constants
    (production's in brackets). Windows of 5 s [20] with a 2-s watermark [10],
    micro-batches every 2 s [10], generator batches of 10 s [10] at 800 events/s [200]: a
    window holds about 4000 events, as production's does, so a plan's verification on one
    window is as steady as there (batches of 10 s halve the generator's appends on the
    Spark Connect server, whose CPU the job's micro-batches need on a slow machine). The
    hot keys do not shift during a session (every 3600 s [600]): a verified plan is
    compared with windows of the load it was planned on. The
    job reads restart requests every 2 s [10]; a run waits 40 s [90] for its interval's
    last windows, its waits look again every 1.25 s [5], a failed task is retried after
    5 s [30]. The DAG starts with no schedule (:meth:`ServiceStack.scheduled` turns it on
    once the job keeps up). Temporary Airflow home and data folder, free loopback ports."""
    from rebalance.ops.service import Settings

    return Settings(data=root / "data", airflow_home=root / "airflow",
                    api_port=free_port(), connect_port=free_port(), schedule=QUIET,
                    window_seconds=5, trigger_seconds=2, batch_seconds=10,
                    events_per_second=800, fluctuation_seconds=3600, restart_poll_seconds=2,
                    windows_wait_seconds=40, retry_delay_seconds=5,
                    # no maintenance run at 03:00 UTC in the middle of a test
                    maintenance_schedule="none",
                    airflow_settings=dict(AIRFLOW_TEST_SETTINGS))


class ServiceStack(Service):
    """``rebalance.ops.service.Service`` on :func:`stack_settings`, with what the tests need
    to put it in a known state: the schedule, no run in flight, the default placement."""

    def __init__(self, root: Path, job: str | None = None, registry: Path | None = None,
                 **settings) -> None:
        import dataclasses

        from rebalance.core import registry as job_registry

        jobs = {} if registry is None else {"registry": job_registry.load(registry)}
        super().__init__(dataclasses.replace(stack_settings(root), job=job, **jobs, **settings),
                         out=lambda line: print(line, flush=True))
        self.figures: dict = {}
        self.started: float | None = None
        #: wall-clock time (time.time()) since which the stack runs on :data:`SCHEDULE`
        #: with every process ready
        self.scheduled_since: float | None = None
        self._client = None

    @property
    def tables(self) -> Path:
        return self.s.data / "tables"

    def start(self) -> None:
        t0 = time.monotonic()
        self.up()
        self.started = t0
        self.figures["seconds_to_up"] = round(time.monotonic() - t0, 1)

    def stop(self) -> None:
        """``down``; then no process of the service may be left, nor any record."""
        from rebalance.ops.service import alive

        records = self.records()
        self.down()
        print("service stack figures:", json.dumps(self.figures, default=str), flush=True)
        left = [f"{name} (pid {rec.pid})" for name, rec in records.items() if alive(rec)]
        assert not left, f"processes left running after down: {left}"
        assert not any(self.s.pids.glob("*.json"))

    def client(self):
        """Airflow's REST API as the admin user (one token for the session)."""
        from rebalance.ops.airflow_client import AirflowClient

        if self._client is None:
            self._client = AirflowClient(self.s.api_url, *self.login())
        return self._client

    # ------------------------------------------------------------- the schedule
    def set_schedule(self, schedule: str, timeout: float = 300.0) -> None:
        """Serve the DAG on ``schedule``: the dag-processor is restarted through the
        service with it (the schedule is read when the DAG file is parsed) and the test
        waits for Airflow to store the re-parsed DAG. The DAG is paused meanwhile, so no
        run is created on the old schedule's next interval."""
        if self.s.schedule == schedule:
            return
        api = self.client()
        path = f"/api/v2/dags/{DAG}"
        before = api.get(path)["timetable_summary"]
        api.call("PATCH", path, {"is_paused": True})
        try:
            self.s = dataclasses.replace(self.s, schedule=schedule)
            self.down(only=["dag-processor"])
            # (and whatever else is down); the DAG stays paused until it is re-parsed
            assert "dag-processor" in self.up(unpause=False)
            deadline = time.monotonic() + timeout
            while api.get(path)["timetable_summary"] == before:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the DAG was not re-parsed with schedule {schedule!r} "
                                         f"within {timeout:.0f} s (still {before!r})")
                time.sleep(1)
        finally:
            api.call("PATCH", path, {"is_paused": False})
        if schedule == SCHEDULE:
            self.scheduled_since = time.time()

    def wait_idle(self, timeout: float = 600.0) -> None:
        """Until the DAG has no queued or running run."""
        api = self.client()
        path = f"/api/v2/dags/{DAG}/dagRuns?state=queued&state=running&limit=20"
        deadline = time.monotonic() + timeout
        while True:
            runs = api.get(path)["dag_runs"]
            if not runs:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"runs still active after {timeout:.0f} s: "
                                     f"{[(r['dag_run_id'], r['state']) for r in runs]}")
            time.sleep(2)

    # -------------------------------------------------------------- the stream
    def windows_stored(self) -> list[dt.datetime]:
        """Start of every histogram window the job wrote, oldest first."""
        t = read_delta(self.tables / "key_histograms", ["window_start"])
        if t is None:
            return []
        return sorted({w.replace(tzinfo=dt.timezone.utc) if w.tzinfo is None else w
                       for w in t.column("window_start").to_pylist()})

    def wait_windows_until(self, end: dt.datetime, timeout: float = 300.0) -> None:
        """Until the job wrote the window that ends at ``end`` (a multiple of 5 s)."""
        last = end - dt.timedelta(seconds=self.s.window_seconds)
        deadline = time.monotonic() + timeout
        while not any(w >= last for w in self.windows_stored()):
            if time.monotonic() > deadline:
                raise AssertionError(f"no histogram window at or after {last} within "
                                     f"{timeout:.0f} s")
            time.sleep(1)

    def wait_job_caught_up(self, lag_seconds: float = 60.0, timeout: float = 900.0) -> float:
        """Until the job's newest histogram window ended at most ``lag_seconds`` ago;
        returns the lag then. A job just started lags its input while its JVM warms up
        (minutes on a slow machine): a scheduled run meanwhile finds no window of its
        interval and skips. 60 s: a run waits 40 s for two of its interval's six windows,
        and the job's steady lag there was 30-50 s (10-s generator batches, 20-s
        micro-batches, 2026-12-02)."""
        deadline = time.monotonic() + timeout
        while True:
            windows = self.windows_stored()
            now = dt.datetime.now(dt.timezone.utc)
            lag = ((now - windows[-1]).total_seconds() - self.s.window_seconds
                   if windows else None)
            if lag is not None and lag <= lag_seconds:
                self.figures.setdefault("seconds_until_the_job_kept_up",
                                        round(time.monotonic() - self.started, 1))
                return lag
            if time.monotonic() > deadline:
                raise AssertionError(f"the job still lags its input after {timeout:.0f} s "
                                     f"(newest window lag {lag} s)")
            time.sleep(2)

    def live_routing_keys(self) -> int:
        """Keys the live assignment version routes off their default instance."""
        live = [v for v in self.client().get("/rebalance/api/assignments") if v["live"]]
        return int(live[0]["routing_keys"] or 0) if live else 0

    def restore_default_placement(self) -> float | None:
        """Make the default placement live again when a plan moved keys, through the
        command users have (``rebalance rollback --to-version 0``): the generator's skew
        on the default placement is what makes the DAG plan without ``force``. Returns the
        wall-clock time once the rollback is live (a plan that went live then: the trigger
        rules' cooldown counts from it), None when nothing had to be done."""
        from rebalance.ops.service import base_env, job_name

        if self.live_routing_keys() == 0:
            return None
        env = {**base_env(self.s), "REBALANCE_SPARK_REMOTE": self.s.connect_url,
               "REBALANCE_JOB_NAME": job_name(self.s)}
        exe = str(Path(sys.executable).with_name("rebalance"))
        done = subprocess.run([exe, "rollback", "--to-version", "0"], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert self.live_routing_keys() == 0
        return time.time()

    # ------------------------------------------------------------- test states
    def quiet(self) -> None:
        """No scheduled run from now on, and none in flight."""
        self.set_schedule(QUIET)
        self.wait_idle()

    def scheduled(self) -> None:
        """Scheduled runs every 30 s on the default placement (the skew the DAG plans on
        by itself): a stack switched from quiet first restores the default placement, and
        the schedule starts once the job keeps up with its input."""
        if self.s.schedule != SCHEDULE:
            self.wait_idle()
            self.restore_default_placement()
            self.wait_job_caught_up()
            self.set_schedule(SCHEDULE)


#: The session's one stack, shared by the modules that import :func:`service`. pytest makes
#: one session-scoped fixture per importing module, torn down only at the session's end:
#: tests/conftest.py calls :func:`release_shared_stack` after the last test of a run of
#: consecutive modules that use it, so its streaming job (over a core of CPU) does not run
#: on through the modules after them.
_SHARED: dict = {}


#: The registry of the session's stack: what ``make up REGISTRY=examples/one_job.toml``
#: runs. Its modules check the built-in job alone, and the shipped registry's second
#: streaming job would share the machine's two cores (``test_service_sessions.py`` runs it).
ONE_JOB = Path(__file__).resolve().parents[2] / "examples" / "one_job.toml"


def release_shared_stack() -> None:
    """Stop the session's stack, if one runs; a module using :func:`service` later starts a
    new one."""
    stack = _SHARED.pop("stack", None)
    if stack is not None:
        stack.stop()


@pytest.fixture(scope="session")
def service(tmp_path_factory):
    """The service stack of the session (started once, stopped after the last module
    that uses it, or at the session's end), on :data:`ONE_JOB`."""
    if "error" in _SHARED:
        raise RuntimeError(f"the service stack did not start: {_SHARED['error']}")
    stack = _SHARED.get("stack")
    if stack is None:
        stack = ServiceStack(tmp_path_factory.mktemp("service"), registry=ONE_JOB)
        assert [j.name for j in stack.s.registry.jobs] == ["keyed"], stack.s.registry.path
        try:
            stack.start()
        except BaseException as exc:
            _SHARED["error"] = f"{type(exc).__name__}: {exc}"
            stack.stop()
            raise
        _SHARED["stack"] = stack
    try:
        yield stack
    finally:
        if _SHARED.get("stack") is stack:
            release_shared_stack()


@pytest.fixture()
def quiet(service):
    """The stack with no scheduled run (and none in flight): a test's runs are its own."""
    service.quiet()
    return service


@pytest.fixture()
def scheduled(service):
    """The stack with the DAG scheduled every 30 s on the default placement."""
    service.scheduled()
    return service
