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
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def running_broker(folder: Path):
    """A single-node Kafka broker (``rebalance.kafka.Broker``) on a free port and the one
    after it (its controller), in ``folder``; stopped at the end, both ports checked closed."""
    from rebalance.kafka import Broker, BrokerSettings

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

    parts = [pq.read_table(path / unquote(p), columns=columns) for p in sorted(live)]
    parts = [t for t in parts if t.num_rows]
    if not parts:
        return None if schema is None else pa.table({c: [] for c in (columns or [])})
    return pa.concat_tables(parts, promote_options="permissive")


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
#: ``python -c PIPELINE_CHILD DATA_INTERVAL_START DATA_INTERVAL_END RUN_ID``: the
#: ``rebalance`` DAG's task functions in order (windows -> detect -> plan -> validate ->
#: publish -> apply), as the Airflow task processes call them, in one process the tests can
#: ``kill -9``. Prints ``STEP <name> start`` / ``STEP <name> done <plan id>`` lines.
PIPELINE_CHILD = r'''
import sys
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
'''
