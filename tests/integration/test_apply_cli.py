"""``rebalance apply --plan DIR`` and ``rebalance status`` through the real CLI, on local
Spark and Delta: a plan made by ``rebalance plan`` goes through the DAG's gate, lease and
audit trail; a dry run changes nothing; a stale plan is refused."""

from __future__ import annotations

import pytest
from dag_helpers import N, data, traffic, write_windows  # noqa: F401 - data: fixture

from rebalance import cli

pytestmark = pytest.mark.slow


def _plan(tmp_path, capsys, name="plan", assignment=None):
    from rebalance.spark import tables

    out = tmp_path / name
    argv = ["plan", "--histograms", tables.KEY_HISTOGRAMS.path(), "--instances", str(N),
            "--windows", "3", "--method", "mixed", "--theta", "0.1", "--out", str(out)]
    if assignment is not None:
        argv += ["--assignment", str(assignment)]
    code = cli.main(argv)
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    return out


@pytest.mark.usefixtures("data")
def test_apply_publishes_a_cli_plan_through_the_gate_and_refuses_it_when_stale(
        spark, tmp_path, capsys):
    import datetime as dt

    from rebalance.spark import tables
    from rebalance.spark.plan_store import PlanStore

    t0 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)
    write_windows(spark, [t0 + i * dt.timedelta(minutes=1) for i in range(3)], traffic(True))
    out = _plan(tmp_path, capsys)

    # Dry run: validated and stored as what-if, nothing live changes.
    assert cli.main(["apply", "--plan", str(out), "--dry-run"]) == 0, capsys.readouterr().err
    assert "passed validation" in capsys.readouterr().out
    assert tables.latest_assignment_version(spark) == 0
    (what_if,) = PlanStore(spark).plans()
    assert what_if.status == "what-if" and what_if.dag_id == "rebalance-cli"

    # Apply: a new assignment version, annotated like the DAG's, plan verified by the gate.
    assert cli.main(["apply", "--plan", str(out)]) == 0, capsys.readouterr().err
    assert "assignment version 1 is live" in capsys.readouterr().out
    live = tables.read_assignment(spark)
    assert live.version == 1 and live.routing
    applied = [p for p in PlanStore(spark).plans() if p.status == "applied"]
    assert len(applied) == 1 and applied[0].assignment_version == 1
    assert applied[0].validation  # the Great Expectations statistics are stored
    (commit,) = [c for c in tables.assignment_history(spark) if c.metadata.get("plan_id")]
    assert commit.metadata["plan_id"] == applied[0].plan_id
    assert commit.metadata["action"] == "apply"

    # The same plan again: computed against version 0, version 1 is live -> stale, refused.
    assert cli.main(["apply", "--plan", str(out)]) == 1
    assert "stale plan" in capsys.readouterr().err
    assert tables.latest_assignment_version(spark) == 1

    # status: the live version, N, the latest windows' imbalance, the last plan.
    assert cli.main(["status", "--windows", "2"]) == 0
    text = capsys.readouterr().out
    assert f"live assignment: version 1, N = {N}" in text
    assert text.count("window 2026-03-02T12:0") == 2 and "imbalance" in text
    assert f"last plan: {applied[0].plan_id}" in text and "applied" in text


@pytest.mark.usefixtures("data")
def test_apply_refuses_a_plan_whose_files_do_not_match(spark, tmp_path, capsys):
    import datetime as dt

    t0 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)
    write_windows(spark, [t0 + i * dt.timedelta(minutes=1) for i in range(3)], traffic(True))
    out = _plan(tmp_path, capsys)
    (out / "assignment.parquet").write_bytes(b"not the plan's assignment")
    assert cli.main(["apply", "--plan", str(out)]) == 2
    assert "SHA-256 differs" in capsys.readouterr().err
    assert cli.main(["apply", "--plan", str(tmp_path / "nowhere")]) == 2
    assert "nowhere is not a directory (not found)" in capsys.readouterr().err


def _split_plan(spark, tmp_path, capsys):
    """``rebalance plan --split-keys`` on three windows where KEYS[0] has half of all
    events (above (1 + theta) x mean on any instance): the plan's folder."""
    import datetime as dt

    from dag_helpers import KEYS

    from rebalance.spark import tables

    t0 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)
    counts = traffic(False)
    counts[KEYS[0]] = 3000
    write_windows(spark, [t0 + i * dt.timedelta(minutes=1) for i in range(3)], counts)
    out = tmp_path / "split"
    assert cli.main(["plan", "--histograms", tables.KEY_HISTOGRAMS.path(), "--instances",
                     str(N), "--windows", "3", "--theta", "0.1", "--split-keys",
                     "--out", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return out


@pytest.mark.usefixtures("data")
def test_a_split_plan_is_applied_with_its_shares(spark, tmp_path, capsys):
    from dag_helpers import KEYS

    from rebalance.spark import tables
    from rebalance.spark.plan_store import PlanStore

    out = _split_plan(spark, tmp_path, capsys)
    assert cli.main(["apply", "--plan", str(out)]) == 0, capsys.readouterr().err
    assert "assignment version 1 is live" in capsys.readouterr().out
    live = tables.read_assignment(spark)
    (key, parts), = live.splits.items()
    assert key == KEYS[0] and len(parts) >= 2 and sum(parts.values()) == pytest.approx(1.0)
    assert live.routing[key] == max(parts, key=parts.get)
    assert live.metadata["split_keys"] == 1
    assert live.metadata["table_size"] == len(live.routing) - 1 + len(parts)
    (plan,) = [p for p in PlanStore(spark).plans() if p.status == "applied"]
    assert plan.predicted_imbalance <= 1.1 and plan.metrics["split_keys"] == 1
    frame = PlanStore(spark).frame(plan.plan_id)
    assert frame.loc[frame.key == key, "split"].notna().all()
    assert frame.loc[frame.key != key, "split"].isna().all()
    # the plan page: the split key with its shares, instance loads after by share
    from rebalance.ui import views

    page = views.plan(spark, plan.plan_id)
    assert [(x["key"], len(x["instances"])) for x in page["split"]] == [(key, len(parts))]
    after = page["instance_loads"]["after"]
    assert max(after) / (sum(after) / N) == pytest.approx(plan.predicted_imbalance)


@pytest.mark.usefixtures("data")
def test_a_split_plan_is_refused_for_a_job_that_does_not_merge_split_keys(spark, tmp_path,
                                                                          capsys):
    """The job's newest start (table ``jobs``) says it cannot merge the partial results of
    a split key (a ``rebalanced()`` job records so): the gate rejects a plan that splits
    one, in one line, and nothing goes live."""
    from types import SimpleNamespace

    from rebalance.spark import tables
    from rebalance.spark.jobs import LIVE, latest_start, record_start
    from rebalance.spark.plan_store import PlanStore

    record_start(spark, SimpleNamespace(name="keyed", tables_root=None), LIVE,
                 app="rebalanced", splits=False)
    assert latest_start(spark, "keyed").splits is False
    out = _split_plan(spark, tmp_path, capsys)
    assert cli.main(["apply", "--plan", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the plan splits 1 key(s), but the job 'keyed' does not merge " \
        "the partial results of a split key (started by rebalanced" in err[0], err
    assert tables.latest_assignment_version(spark) == 0
    (plan,) = PlanStore(spark).plans()
    assert plan.status == "rejected" and "does not merge" in plan.reasons[0]
