"""``rebalance --job NAME <command>``: the command reads the registry's job's tables (no
Spark: history reads through delta-rs); an unknown job or a bad registry is one line."""

from __future__ import annotations

import pytest

from rebalance.cli import main

REGISTRY = """
[jobs.keyed]
dag_id = "rebalance"
tables = "tables"
[jobs.clicks]
app = "sessions"
"""


@pytest.fixture()
def two_jobs(tmp_path, monkeypatch):
    path = tmp_path / "rebalance.toml"
    path.write_text(REGISTRY)
    monkeypatch.setenv("REBALANCE_REGISTRY", str(path))
    monkeypatch.setenv("REBALANCE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("REBALANCE_JOB_NAME", raising=False)
    return path, tmp_path / "data"


def test_job_reads_that_jobs_tables_and_without_it_the_default_ones(two_jobs, capsys):
    _, data = two_jobs
    assert main(["--job", "clicks", "history"]) == 0
    out = capsys.readouterr().out
    assert f"({data}/jobs/clicks/tables/assignments)" in out
    assert f"({data}/jobs/clicks/tables/plans)" in out and "/data/tables/" not in out
    assert main(["history"]) == 0
    assert f"({data}/tables/plans)" in capsys.readouterr().out
    assert main(["--job", "keyed", "history"]) == 0
    assert f"({data}/tables/plans)" in capsys.readouterr().out


def test_an_unknown_job_or_a_bad_registry_is_one_line(two_jobs, capsys):
    path, _ = two_jobs
    assert main(["--job", "nope", "history"]) == 2
    err = capsys.readouterr().err
    assert err == (f"rebalance history: error: unknown job 'nope'; the registry {path} "
                   "has: keyed, clicks\n")
    path.write_text("[jobs.clicks]\ninstances = 0\n")
    assert main(["--job", "clicks", "status"]) == 2
    assert capsys.readouterr().err == (
        f"rebalance status: error: {path}: jobs.clicks.instances: must be an integer in "
        "[1, 4096], got 0\n")


@pytest.fixture()
def no_spark(monkeypatch):
    """A command that would start Spark fails the test: --job reads run on delta-rs."""
    from rebalance.cli import apply

    def refuse():
        raise AssertionError("a Spark session was started")
    monkeypatch.setattr(apply, "cli_spark_session", refuse)


def test_status_reads_the_jobs_tables_through_delta_rs(two_jobs, capsys, no_spark):
    _, data = two_jobs
    log = data / "jobs" / "clicks" / "tables" / "assignments" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("junk\n")   # only clicks' table is bad
    assert main(["status"]) == 0
    assert capsys.readouterr().out == (
        "no assignments table yet: the streaming job creates it at start\n")
    assert main(["--job", "clicks", "status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rebalance status: error: table 'assignments' at "
                          f"{data}/jobs/clicks/tables/assignments cannot be read as a Delta "
                          "table: ") and err.count("\n") == 1, err
    assert main(["--job", "keyed", "status"]) == 0


def test_advise_reads_the_jobs_histograms_by_default(two_jobs, capsys):
    _, data = two_jobs
    assert main(["--job", "clicks", "advise", "--instances", "4"]) == 2
    assert capsys.readouterr().err == (
        "rebalance advise: error: histograms path not found: "
        f"{data}/jobs/clicks/tables/key_histograms\n")


def test_the_command_runs_inside_the_scope_and_only_with_job(two_jobs, monkeypatch):
    from rebalance.cli import audit
    from rebalance.core import registry
    from rebalance.spark import tables

    _, data = two_jobs
    seen = []

    def history(args):
        job = registry.current_job()
        seen.append((job and job.name, tables.tables_root()))
        return 0
    monkeypatch.setattr(audit, "history", history)   # the parser is built at each main()
    assert main(["history"]) == 0
    assert main(["--job", "clicks", "history"]) == 0
    assert seen == [(None, data / "tables"), ("clicks", data / "jobs" / "clicks" / "tables")]
    assert registry.current_job() is None                # the scope ended with the command
    assert main(["--job", "nope", "history"]) == 2
    assert len(seen) == 2                                # refused before the command ran


def test_job_after_the_command_says_where_it_goes(two_jobs, capsys):
    assert main(["history", "--job", "clicks"]) == 2
    assert capsys.readouterr().err == (
        "rebalance: error: unrecognized arguments: --job clicks (--job NAME goes before the "
        "command: rebalance --job NAME <command>)\n")


def test_a_missing_registry_or_tables_no_engine_writes_are_one_line(two_jobs, capsys,
                                                                      monkeypatch, no_spark):
    path, _ = two_jobs
    missing = path.parent / "none.toml"
    monkeypatch.setenv("REBALANCE_REGISTRY", str(missing))
    assert main(["--job", "keyed", "history"]) == 2
    assert capsys.readouterr().err == (
        f"rebalance history: error: {missing}: cannot read the job registry: "
        "No such file or directory\n")
    monkeypatch.setenv("REBALANCE_REGISTRY", str(path))
    path.write_text('[jobs.keyed]\ntables = "gs://bucket/keyed"\n')
    assert main(["--job", "keyed", "status"]) == 2
    assert capsys.readouterr().err == (
        f"rebalance status: error: {path}: jobs.keyed.tables: the URI scheme 'gs' is not "
        "supported; use a folder, s3a:// or file://\n")


def test_trigger_runs_the_jobs_dag_and_reads_its_plans(two_jobs, capsys, monkeypatch):
    from rebalance.cli import trigger

    calls = []

    class Client:
        base = "http://airflow"

        def trigger(self, dag_id, conf, note=None):
            calls.append(("trigger", dag_id))
            return {"dag_run_id": "r1"}

        def wait(self, dag_id, run_id, timeout):
            return {"state": "success"}

        def task_instances(self, dag_id, run_id):
            return {}

        def skip_reasons(self, dag_id, run_id, tis):
            return {}

        def plans(self, job=None):
            calls.append(("plans", job))
            return []
    monkeypatch.setattr(trigger, "_client", lambda args: Client())
    assert main(["--job", "clicks", "trigger", "--wait"]) == 0
    assert main(["trigger"]) == 0
    assert calls == [("trigger", "rebalance_clicks"), ("plans", "clicks"),
                     ("trigger", "rebalance")]
    out = capsys.readouterr().out
    assert "triggered rebalance_clicks run r1" in out and "no plan stored by this run" in out
