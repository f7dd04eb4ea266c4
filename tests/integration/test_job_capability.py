"""A job that cannot restart (``keyed_job.py``: :func:`rebalance.streaming.builtin.start_job`,
a processor with a merge under ``rebalanced()``, whose moved keys' state stays where it
is) records so when it starts (table ``jobs``); ``apply`` reads it before it asks for a
controlled restart: ``auto`` above ``restart_above`` switches live instead and says so,
an explicit ``restart`` is refused at once in one line (issue 20: it waited for the
15-minute restart timeout, then rolled back). Real Spark and Delta, through
``rebalance plan`` and ``rebalance apply`` (the DAG's gate and ``apply``)."""

from __future__ import annotations

import datetime as dt

import pytest
from dag_helpers import KEYS, N, data, placement, traffic  # noqa: F401 - data: fixture

from rebalance import cli

pytestmark = pytest.mark.slow


def _windows_with_state(spark, starts, counts):
    """Histogram rows whose state follows the load (100 bytes per event): a plan that
    evens the skew out moves far more than ``restart_above`` (5 %) of the state."""
    from rebalance.core.records import as_utc
    from rebalance.spark import tables

    default, group = placement()
    rows = [(as_utc(s), k, counts[k], float(counts[k]), 100 * counts[k], int(d), int(d),
             int(g), int(d), 0, 0) for s in starts for k, d, g in zip(KEYS, default, group)]
    tables.ensure_table(spark, tables.KEY_HISTOGRAMS)
    tables.append(spark.createDataFrame(rows, tables.KEY_HISTOGRAMS.schema),
                  tables.KEY_HISTOGRAMS)


@pytest.mark.usefixtures("data")
def test_a_job_that_cannot_restart_is_switched_live_by_auto_and_refused_a_restart(
        spark, tmp_path, capsys):
    from rebalance.spark import tables
    from rebalance.spark.jobs import latest_start
    from rebalance.spark.plan_store import PlanStore
    from rebalance.streaming.builtin import start_job
    from rebalance.streaming.job import JobConfig

    t0 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)
    _windows_with_state(spark, [t0 + i * dt.timedelta(minutes=1) for i in range(3)],
                        traffic(True))
    out = tmp_path / "plan"
    assert cli.main(["plan", "--histograms", tables.KEY_HISTOGRAMS.path(), "--instances",
                     str(N), "--windows", "3", "--method", "mixed", "--theta", "0.1",
                     "--out", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()

    # The non-restartable job starts (on an empty events table: nothing to process).
    tables.ensure_table(spark, tables.EVENTS)
    job = start_job(spark, JobConfig(n_instances=N, checkpoint_root=str(tmp_path / "ckpt")))
    job.process_all_available()
    job.stop()
    start = latest_start(spark, "keyed")
    assert start is not None and (start.capability, start.app) == ("live", "rebalanced")

    # An explicit restart: refused at once, in one line, nothing published or requested.
    assert cli.main(["apply", "--plan", str(out), "--apply-mode", "restart"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "apply_mode restart refused: the job 'keyed' cannot restart (started by " in err
    assert "run spark_apps/restartable_job.py for controlled restarts, or choose apply_mode " \
           "broadcast" in err
    assert tables.latest_assignment_version(spark) == 0
    assert not tables.exists(spark, tables.RESTARTS)

    # auto, on a plan that moves more than restart_above of the state: a live switch.
    assert cli.main(["apply", "--plan", str(out)]) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "applied (broadcast): assignment version 1 is live" in text, text
    assert "note: apply_mode auto chose a controlled restart (the plan moves " in text, text
    assert "cannot restart (started by " in text and "live switch instead" in text, text
    (plan,) = [p for p in PlanStore(spark).plans() if p.status == "applied"]
    assert plan.apply_mode == "broadcast" and plan.metrics["migration_fraction"] > 0.05
    assert plan.verification["requested_mode"] == "auto"
    assert plan.reasons[-1] == plan.verification["mode_note"]
    (commit,) = [c for c in tables.assignment_history(spark) if c.metadata.get("plan_id")]
    assert commit.metadata["apply_mode"] == "broadcast"
    assert not tables.exists(spark, tables.RESTARTS)   # no restart request to wait for
