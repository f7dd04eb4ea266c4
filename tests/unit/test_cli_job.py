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
