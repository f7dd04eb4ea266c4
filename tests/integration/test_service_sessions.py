"""Two jobs under one service: ``make up`` on the shipped registry.

The stack of ``rebalance.ops.service.Service`` on the shipped registry ``rebalance.toml``
(named explicitly, whatever ``REBALANCE_REGISTRY`` says):
the built-in job over the generator's events, and the sessionization example
(``examples/sessions.py``, unchanged, under ``rebalanced()``) over the same events with
tables, checkpoint and DAG (``rebalance_sessions``) of its own. Once the built-in job keeps
up, the real scheduler runs both DAGs every 30 s: each plans from its own job's
histograms, applies a plan, and ``verify`` measures windows run wholly under it; the
sessions query's ``follow()`` takes its plan with the moved users' sessions and timers.
Nothing crosses: each job's tables hold only its own plans, leases and starts.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest
from service_helpers import (
    SCHEDULE,
    ServiceStack,
    commit_metadata,
    delta_commits,
    read_delta,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

#: From the schedule's start to a verified plan of each job: 2-4 minutes on a quiet machine.
PLAN_TIMEOUT = 12 * 60


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # two streaming jobs share the two cores: half the test stack's events per second, in
    # windows twice as long, so that a window still holds about 4000 events (a plan's
    # verification on one window is as steady as in the other service tests)
    service = ServiceStack(tmp_path_factory.mktemp("two-jobs-service"),
                           registry=REPO / "rebalance.toml", events_per_second=400,
                           window_seconds=10)
    try:
        service.start()
        yield service
    finally:
        service.stop()


def _verified(store):
    done = [p for p in store.plans() if p.status in ("verified", "diverged")]
    return done[0] if done else None


def test_two_jobs_each_get_a_verified_plan_on_their_own_tables(stack):
    from rebalance.spark import delta_rs, tables
    from rebalance.spark.jobs import latest_start
    from rebalance.spark.plan_store import CONTROL, PlanStore
    from rebalance.streaming.rebalanced import control_path

    sessions_tables = stack.s.data / "jobs" / "sessions" / "tables"
    assert [j.dag_id for j in stack.s.registry.jobs] == ["rebalance", "rebalance_sessions"]
    stack.wait_job_caught_up()
    stack.set_schedule(SCHEDULE)
    since = time.monotonic()
    stores = {"keyed": PlanStore(None, stack.tables),
              "sessions": PlanStore(None, sessions_tables)}
    deadline, plans = since + PLAN_TIMEOUT, {}
    while time.monotonic() < deadline and len(plans) < 2:
        for job, store in stores.items():
            if job not in plans and (plan := _verified(store)) is not None:
                plans[job] = plan
                stack.figures[f"{job}_first_verified_plan_seconds"] = round(
                    time.monotonic() - since, 1)
        time.sleep(5)
    assert set(plans) == {"keyed", "sessions"}, (
        f"verified plans within {PLAN_TIMEOUT} s of the schedule: {sorted(plans)}")
    for job, plan in plans.items():
        summary = plan.summary()
        print(f"{job}: plan {plan.plan_id} {plan.status}: imbalance "
              f"{summary['imbalance_before']:.3f} -> realised {plan.realised_imbalance:.3f}, "
              f"{summary['moved_keys']} key(s) moved", flush=True)
        assert plan.status == "verified", plan.reasons
        assert summary["moved_keys"] > 0
        assert plan.realised_imbalance < summary["imbalance_before"]

    # nothing crosses: each job's plans are its DAG's, its starts its own, and every
    # holder of its apply lease is one of its own plans
    for job, root, dag_id in (("keyed", stack.tables, "rebalance"),
                              ("sessions", sessions_tables, "rebalance_sessions")):
        own = stores[job].plans()
        assert {p.dag_id for p in own} == {dag_id}
        assert set(read_delta(root / tables.JOBS.name, ["job"]).column("job").to_pylist()) \
            == {job}
        holders = {commit_metadata(actions).get("holder")
                   for _, actions in delta_commits(root / CONTROL.name)} - {None}
        assert holders and holders <= {p.plan_id for p in own}, (job, holders)

    # the sessions job took its plan as the user's processor under rebalanced(), live
    # switch only: every user the plan routes off its default instance had its session
    # handed over, once, from the version before to this one
    plan = plans["sessions"]
    start = latest_start(None, "sessions", root=sessions_tables)
    assert (start.app, start.capability, start.splits) == ("rebalanced", "handoff", False)
    routed = tables.read_assignment(None, plan.assignment_version, sessions_tables).routing
    control = delta_rs.rows(control_path(str(stack.s.data / "checkpoints" / "sessions")))
    handed = [pickle.loads(r["payload"])["key"] for r in control
              if r["kind"] == "in" and r["version"] == plan.assignment_version]
    assert sorted(handed) == sorted(routed), (handed, routed)

    # the Rebalance view opens on the jobs page: a row per job, each with its verified plan,
    # and each job's own page (a real browser, logged in as a person is)
    _jobs_page_in_a_browser(stack, plans)


def _jobs_page_in_a_browser(stack, plans) -> None:
    import os

    from ui_flows import CHROMIUM_ARGS, UI, chromium_path

    path = chromium_path()
    if path is None:   # as every browser test of the suite (.ci/run installs it)
        pytest.skip("no Chromium on this machine (apt-get install chromium): jobs page unchecked")
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("REBALANCE_TEST_SHOTS", REPO / ".data" / "test-shots"))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.set_default_timeout(60_000)
            ui = UI(page, stack.s.api_url, shots)
            ui.login(*stack.login())
            page.goto(f"{ui.base}/rebalance/jobs")
            rows = page.locator("table#jobs tr")
            assert rows.count() == 3                       # the header and two jobs
            for job, dag_id in (("keyed", "rebalance"), ("sessions", "rebalance_sessions")):
                row = page.locator("table#jobs tr", has=page.locator(f"a[href='/dags/{dag_id}']"))
                assert row.get_by_role("link", name=job, exact=True).count() == 1
                assert row.locator(f"a[href*='{plans[job].plan_id}']").count() == 1
                assert "active (unpaused)" in row.inner_text()
            ui.shot("jobs-page")
            page.get_by_role("link", name="sessions", exact=True).click()
            page.locator("h1", has_text="Rebalance: job sessions").wait_for()
            assert page.locator(f"a[href='/rebalance/plans/{plans['sessions'].plan_id}"
                                f"?job=sessions']").count() >= 1
            assert page.locator(f"a[href*='{plans['keyed'].plan_id}']").count() == 0
            ui.shot("jobs-page-sessions")
            # the Rebalance tab of the sessions job's DAG opens on the sessions job's page
            page.goto(f"{ui.base}/dags/rebalance_sessions/plugin/rebalance-dag")
            frame = page.frame_locator("iframe[title=Rebalance]")
            frame.locator("h1", has_text="Rebalance: job sessions").wait_for()
            assert frame.locator(f"a[href*='{plans['sessions'].plan_id}']").count() >= 1
            assert frame.locator(f"a[href*='{plans['keyed'].plan_id}']").count() == 0
        finally:
            browser.close()
