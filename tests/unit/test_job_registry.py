"""The job registry (rebalance.core.registry): the shipped file, a job's defaults, where its
tables live, every refusal in one line naming the field, the environment's overrides, and
the current job of a scope (a context variable: threads and asyncio tasks stay apart)."""

from __future__ import annotations

import asyncio
import contextvars
import re
import threading
import tomllib
from pathlib import Path

import pytest

from rebalance.core import registry
from rebalance.core.registry import JobConfig, RegistryError


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch):
    for name in ("REBALANCE_JOB_NAME", "REBALANCE_SCHEDULE", "REBALANCE_REGISTRY"):
        monkeypatch.delenv(name, raising=False)


def _load(tmp_path, text: str):
    path = tmp_path / "rebalance.toml"
    path.write_text(text)
    return registry.load(path), path


def test_the_shipped_registry_holds_the_built_in_job_under_its_old_names_and_sessions():
    reg = registry.load()
    assert reg.path == registry.DEFAULT_FILE
    job, sessions = reg.jobs
    assert (job.name, job.dag_id, job.app, job.source, job.tables, job.instances,
            job.theta, job.apply_mode, job.require_approval) == (
        "keyed", "rebalance", "keyed", "delta", "tables", 4, 0.1, "auto", False)
    assert job.tables_root(Path("/d")) == Path("/d/tables")
    # the sessionization example, with a DAG and tables of its own
    assert (sessions.name, sessions.dag_id, sessions.app, sessions.source, sessions.instances,
            sessions.apply_mode) == ("sessions", "rebalance_sessions", "sessions", "delta", 4,
                                     "auto")
    assert sessions.tables_root(Path("/d")) == Path("/d/jobs/sessions/tables")
    assert (reg.service.api_port, reg.service.connect_port, reg.service.kafka_port) == (
        8080, 15002, 9092)


def test_the_one_job_example_is_the_shipped_first_job_alone():
    one = registry.load(registry.DEFAULT_FILE.parent / "examples" / "one_job.toml")
    assert one.jobs == registry.load().jobs[:1]
    assert one.service == registry.ServiceConfig()   # the defaults, the shipped file's ports


def test_a_job_named_alone_gets_its_own_dag_and_tables(tmp_path):
    reg, _ = _load(tmp_path, "[jobs.clicks]\n")
    assert reg.jobs == (JobConfig(name="clicks", dag_id="rebalance_clicks",
                                  tables="jobs/clicks/tables"),)
    assert reg.job("clicks") is reg.jobs[0] and reg.job() is reg.jobs[0]
    assert reg.by_dag("rebalance_clicks") is reg.jobs[0] and reg.by_dag("x") is None
    with pytest.raises(RegistryError, match=r"unknown job 'x'; the registry .* has: clicks$"):
        reg.job("x")


def test_every_field_is_read_and_normalised(tmp_path):
    reg, _ = _load(tmp_path, """
[jobs.devices]
dag_id = "dev.rebalance"
app = "devices"
source = "delta"
topic = "readings"
tables = "/srv/tables/devices"
instances = 8
theta = 1
schedule = "5m"
apply_mode = "broadcast"
require_approval = true
[jobs.devices.retention]
histograms = 30
events = 1.5
[jobs.devices.spark]
"spark.sql.shuffle.partitions" = 8
"spark.sql.adaptive.enabled" = false
""")
    (job,) = reg.jobs
    assert (job.dag_id, job.app, job.topic, job.instances, job.theta, job.schedule,
            job.apply_mode, job.require_approval) == (
        "dev.rebalance", "devices", "readings", 8, 1.0, "5m", "broadcast", True)
    assert isinstance(job.theta, float)
    assert job.retention == {"histograms": 30.0, "events": 1.5}
    assert job.spark == {"spark.sql.shuffle.partitions": "8",
                         "spark.sql.adaptive.enabled": "false"}
    assert job.tables_root(Path("/d")) == Path("/srv/tables/devices")


@pytest.mark.parametrize("tables, root", [
    ("t", Path("/d/t")), ("/abs/t", Path("/abs/t")), ("file:///abs/t", Path("/abs/t")),
    ("s3a://bucket/t", "s3a://bucket/t")])
def test_where_a_jobs_tables_live(tables, root):
    assert JobConfig(name="j", dag_id="d", tables=tables).tables_root(Path("/d")) == root


def test_the_object_store_of_s3a_tables(tmp_path):
    reg, _ = _load(tmp_path, '[service.object_store]\nendpoint = "http://127.0.0.1:9000/"\n'
                             '[jobs.a]\ntables = "s3a://team-bucket/jobs/a"\n')
    store = reg.service.object_store
    assert (store.endpoint, store.region, store.path_style, store.allow_http) == (
        "http://127.0.0.1:9000", "us-east-1", True, True)
    assert reg.job().tables_root(tmp_path) == "s3a://team-bucket/jobs/a"
    reg, _ = _load(tmp_path, '[jobs.a]\n')
    assert reg.service.object_store.endpoint is None
    assert not reg.service.object_store.allow_http


@pytest.mark.parametrize("text, where, why", [
    ("[jobs.c]\ntheta = 0\n", "jobs.c.theta", "must be a number in (0, 2], got 0"),
    ("[jobs.c]\ntheta = 2.5\n", "jobs.c.theta", "must be a number in (0, 2], got 2.5"),
    ("[jobs.c]\ntheta = \"x\"\n", "jobs.c.theta", "must be a number in (0, 2], got 'x'"),
    ("[jobs.c]\ninstances = 0\n", "jobs.c.instances", "must be an integer in [1, 4096]"),
    ("[jobs.c]\ninstances = true\n", "jobs.c.instances", "must be an integer in [1, 4096]"),
    ("[jobs.c]\napp = \"mine\"\n", "jobs.c.app", "must be one of keyed, sessions"),
    ("[jobs.c]\nsource = \"s3\"\n", "jobs.c.source", "must be one of delta, kafka"),
    ("[jobs.c]\napply_mode = \"now\"\n", "jobs.c.apply_mode", "must be one of auto, broadcast"),
    ("[jobs.c]\nrequire_approval = \"yes\"\n", "jobs.c.require_approval", "must be true or false"),
    ("[jobs.c]\ndag_id = \"a b\"\n", "jobs.c.dag_id", "must be a DAG id"),
    ("[jobs.c]\ntables = \"\"\n", "jobs.c.tables", "must be a folder"),
    ("[jobs.c]\ntables = \"gs://b/t\"\n", "jobs.c.tables",
     "the URI scheme 'gs' is not supported; use a folder, s3a:// or file://"),
    ("[jobs.c]\ntables = \"s3a://Bucket/t\"\n", "jobs.c.tables",
     "an s3a:// URI names a bucket and a folder (s3a://bucket/folder)"),
    ("[service.object_store]\nendpoint = \"127.0.0.1:9000\"\n[jobs.a]\n",
     "service.object_store.endpoint", "must be an http:// or https:// URL of the store"),
    ("[service.object_store]\nsecret_key = \"x\"\n[jobs.a]\n", "service.object_store.secret_key",
     "unknown field; known: endpoint, region, path_style (credentials come from the environment"),
    ("[service.object_store]\npath_style = \"yes\"\n[jobs.a]\n",
     "service.object_store.path_style", "must be true or false, got 'yes'"),
    ("[service]\nobject_store = 1\n[jobs.a]\n", "service.object_store",
     "must be a table ([service.object_store]), got int"),
    ("[jobs.c]\nthet = 0.1\n", "jobs.c.thet", "unknown field; known: app, apply_mode"),
    ("[jobs.c]\n[jobs.c.retention]\nhistogram = 3\n", "jobs.c.retention.histogram",
     "unknown kind; known: histograms, results, events"),
    ("[jobs.c]\n[jobs.c.retention]\nresults = -1\n", "jobs.c.retention.results",
     "must be a number of days > 0, got -1"),
    ("[jobs.c]\n[jobs.c.spark]\n\"spark.x\" = [1]\n", "jobs.c.spark.spark.x",
     "must be a string or number"),
    ("[jobs.c]\napp = \"sessions\"\napply_mode = \"restart\"\n", "jobs.c.apply_mode",
     "'restart' needs app 'keyed'"),
    ("[jobs.\"a b\"]\n", "jobs.a b", "a job name is 1-63 letters"),
    ("[jobs.a]\n[jobs.b]\ndag_id = \"rebalance_a\"\n", "jobs.b.dag_id",
     "'rebalance_a' is also job 'a''s; each job needs its own"),
    ("[jobs.a]\ntables = \"t\"\n[jobs.b]\ntables = \"t\"\n", "jobs.b.tables",
     "'t' is also job 'a''s"),
    ("[service]\napi_port = 70000\n[jobs.a]\n", "service.api_port",
     "must be a port number in [1, 65535], got 70000"),
    ("[service]\nport = 1\n[jobs.a]\n", "service.port", "unknown field; known: api_port"),
    ("[servce]\n[jobs.a]\n", "servce", "unknown section"),
    ("[service]\n", "jobs", "must be a table ([jobs])"),
    ("[jobs]\n", "jobs", "no job; add one as [jobs.<name>]"),
    ("jobs = 3\n", "jobs", "must be a table ([jobs]), got int"),
])
def test_a_bad_registry_is_refused_in_one_line_naming_the_field(tmp_path, text, where, why):
    path = tmp_path / "rebalance.toml"
    path.write_text(text)
    with pytest.raises(RegistryError) as err:
        registry.load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: {where}: {why}"), message
    assert "\n" not in message


def test_a_missing_or_malformed_file_is_refused_in_one_line(tmp_path):
    with pytest.raises(RegistryError, match=r"nope.toml: cannot read the job registry: "
                                            r"No such file or directory$"):
        registry.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[jobs.a\n")
    with pytest.raises(RegistryError, match=r"bad.toml: not valid TOML: ") as err:
        registry.load(bad)
    assert "\n" not in str(err.value)


def test_the_environment_overrides_the_file(tmp_path, monkeypatch):
    path = tmp_path / "r.toml"
    path.write_text("[jobs.a]\nschedule = \"5m\"\n[jobs.b]\n")
    monkeypatch.setenv("REBALANCE_REGISTRY", str(path))
    monkeypatch.setenv("REBALANCE_SCHEDULE", "*/2 * * * *")
    monkeypatch.setenv("REBALANCE_JOB_NAME", "a-kafka")
    reg = registry.load()
    assert reg.path == path
    assert [(j.name, j.dag_id, j.schedule) for j in reg.jobs] == [
        ("a-kafka", "rebalance_a", "*/2 * * * *"), ("b", "rebalance_b", "*/2 * * * *")]
    monkeypatch.setenv("REBALANCE_JOB_NAME", "a b")
    with pytest.raises(RegistryError, match="REBALANCE_JOB_NAME: 'a b' is not a job name"):
        registry.load()


def test_a_job_scope_nests_and_stays_in_its_thread_or_task():
    a, b = (JobConfig(name=n, dag_id=n) for n in "ab")
    assert registry.current_job() is None
    with registry.job_scope(a):
        with registry.job_scope(b):
            assert registry.current_job() is b
        assert registry.current_job() is a
        seen = []
        thread = threading.Thread(target=lambda: seen.append(registry.current_job()))
        thread.start()
        thread.join()
        assert seen == [None]                 # a plain thread starts outside any scope
        assert contextvars.copy_context().run(registry.current_job) is a
    assert registry.current_job() is None

    async def both():
        async def one(job):
            with registry.job_scope(job):
                await asyncio.sleep(0.01)     # the other task sets its own job meanwhile
                return registry.current_job()
        return await asyncio.gather(one(a), one(b))
    assert asyncio.run(both()) == [a, b]


@pytest.mark.parametrize("text, where, why", [
    ("[jobs.rollback]\n", "jobs.rollback.dag_id", "'rebalance_rollback' is reserved"),
    ("[jobs.maintenance]\n", "jobs.maintenance.dag_id", "'rebalance_maintenance' is reserved"),
    ("[jobs.healthcheck]\n", "jobs.healthcheck.dag_id", "'rebalance_healthcheck' is reserved"),
    ("[jobs.c]\ndag_id = \"rebalance-cli\"\n", "jobs.c.dag_id", "'rebalance-cli' is reserved"),
    ("[jobs.a]\ntables = \"t\"\n[jobs.b]\ntables = \"./t/\"\n", "jobs.b.tables",
     "'./t/' is also job 'a''s ('t'); each job needs its own"),
    ("[jobs.a]\ntables = \"/abs/t\"\n[jobs.b]\ntables = \"file:///abs/t\"\n", "jobs.b.tables",
     "'file:///abs/t' is also job 'a''s ('/abs/t')"),
    ("[jobs.a]\ntables = \"s3a://bkt/t\"\n[jobs.b]\ntables = \"s3a://bkt/t/\"\n", "jobs.b.tables",
     "'s3a://bkt/t/' is also job 'a''s ('s3a://bkt/t')"),
])
def test_a_job_cannot_take_a_services_dag_or_another_jobs_folder(tmp_path, text, where, why):
    path = tmp_path / "rebalance.toml"
    path.write_text(text)
    with pytest.raises(RegistryError) as err:
        registry.load(path)
    assert str(err.value).startswith(f"{path}: {where}: {why}"), str(err.value)
    assert "\n" not in str(err.value)


def test_the_reserved_dag_ids_are_the_services_own():
    """A job named ``rollback`` once replaced the rollback DAG (a duplicate DAG id)."""
    from rebalance.cli.apply import CLI_DAG_ID
    from rebalance.spark.maintenance import DAG_ID as MAINTENANCE_DAG_ID

    dags = registry.DEFAULT_FILE.parent / "dags"
    literal = {m for f in dags.glob("*.py")
               for m in re.findall(r'dag_id\s*=\s*"([^"]+)"', f.read_text())}
    assert literal == {"rebalance_rollback", "rebalance_healthcheck"}
    assert set(registry.RESERVED_DAG_IDS) == literal | {MAINTENANCE_DAG_ID, CLI_DAG_ID}


def test_similar_folders_and_ids_stay_apart(tmp_path):
    reg, _ = _load(tmp_path, '[jobs.a]\ntables = "t"\n[jobs.b]\ntables = "t2"\n'
                             '[jobs.c]\ntables = "t/c"\n[jobs.rollbacks]\n')
    assert [j.tables for j in reg.jobs] == ["t", "t2", "t/c", "jobs/rollbacks/tables"]
    assert reg.job("rollbacks").dag_id == "rebalance_rollbacks"


def test_a_file_not_in_utf8_is_one_line_naming_it(tmp_path):
    path = tmp_path / "rebalance.toml"
    path.write_bytes(b"[jobs.caf\xe9]\n")
    with pytest.raises(RegistryError) as err:
        registry.load(path)
    assert str(err.value) == f"{path}: not UTF-8 text (byte 9)"
    path.write_bytes('[jobs.a]\ntopic = "caf\u00e9s"\n'.encode())   # UTF-8 whatever the locale
    with pytest.raises(RegistryError, match=r"jobs\.a\.topic: must be a Kafka topic name, "
                                            r"got 'caf\u00e9s'$"):
        registry.load(path)


def test_a_folder_or_a_renamed_job_clashing_is_refused(tmp_path, monkeypatch):
    with pytest.raises(RegistryError, match=r"cannot read the job registry: Is a directory$"):
        registry.load(tmp_path)
    path = tmp_path / "r.toml"
    path.write_text("[jobs.a]\n[jobs.b]\n")
    monkeypatch.setenv("REBALANCE_JOB_NAME", "b")
    with pytest.raises(RegistryError) as err:
        registry.load(path)
    assert str(err.value) == f"REBALANCE_JOB_NAME: 'b' is another job's name in {path}"


def test_copied_contexts_keep_two_threads_jobs_apart():
    a, b = (JobConfig(name=n, dag_id=n) for n in "ab")
    both_in = threading.Barrier(2)
    seen = {}

    def run(job):
        with registry.job_scope(job):
            both_in.wait(timeout=5)           # both scopes are open at once
            seen[job.name] = registry.current_job()
        seen[job.name + " after"] = registry.current_job()

    threads = [threading.Thread(target=contextvars.copy_context().run, args=(run, job))
               for job in (a, b)]
    with registry.job_scope(a):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert registry.current_job() is a    # the threads' scopes left this one alone
    assert seen == {"a": a, "b": b, "a after": None, "b after": None}
    with registry.job_scope(a), registry.job_scope(None):
        assert registry.current_job() is None   # None: no job of its own, inside another's


def test_the_documented_files_load_as_the_page_says(tmp_path):
    docs = (registry.DEFAULT_FILE.parent / "docs" / "registry.md").read_text()
    shipped, two = re.findall(r"```toml\n(.*?)```", docs, flags=re.S)
    store = re.search(r"```text\n(\[service.object_store\].*?)```", docs, flags=re.S).group(1)
    reg = registry.parse(tomllib.loads(store), Path("x"))
    assert reg.job("clicks").tables_root(tmp_path) == "s3a://team-tables/jobs/clicks"
    assert reg.service.object_store.endpoint == "http://127.0.0.1:9000"
    assert registry.parse(tomllib.loads(shipped), Path("x")).jobs == registry.load().jobs
    keyed, clicks = registry.parse(tomllib.loads(two), Path("x")).jobs
    assert (keyed.dag_id, keyed.tables_root(tmp_path)) == ("rebalance", tmp_path / "tables")
    assert (clicks.dag_id, clicks.tables_root(tmp_path), clicks.app, clicks.theta,
            clicks.schedule, clicks.require_approval, clicks.retention, clicks.spark) == (
        "rebalance_clicks", tmp_path / "jobs/clicks/tables", "sessions", 0.2, "5m", True,
        {"histograms": 30.0}, {"spark.sql.shuffle.partitions": "8"})
    assert [j.name for j in registry.load(registry.DEFAULT_FILE.parent / "examples"
                                          / "one_job.toml").jobs] == ["keyed"]
