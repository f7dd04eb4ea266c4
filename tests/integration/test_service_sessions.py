"""``make up JOB=sessions``: the service rebalances a user's own StatefulProcessor.

The stack of ``rebalance.ops.service.Service`` with ``job="sessions"``: everything
``make up`` starts, with ``spark_apps/sessions_job.py`` as its job (the sessionization
example of ``examples/sessions.py``, unchanged, under ``rebalanced()``, over the
generator's events). Once the job keeps up, the real scheduler runs the DAG every 30 s:
it plans from the processor's histograms, applies a plan, the query's ``follow()`` takes
it with the moved users' sessions and timers, and ``verify`` measures windows run wholly
under it.
"""

from __future__ import annotations

import pickle
import time

import pytest
from service_helpers import SCHEDULE, ServiceStack

pytestmark = pytest.mark.slow

#: From the schedule's start to a verified plan: about 2 minutes on a quiet machine.
PLAN_TIMEOUT = 10 * 60


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    service = ServiceStack(tmp_path_factory.mktemp("sessions-service"), job="sessions")
    try:
        service.start()
        yield service
    finally:
        service.stop()


def test_the_scheduler_rebalances_the_sessions_example_and_its_state_moves(stack):
    from rebalance.spark import delta_rs, tables
    from rebalance.spark.jobs import latest_start
    from rebalance.spark.plan_store import PlanStore
    from rebalance.streaming.rebalanced import control_path

    stack.wait_job_caught_up()
    stack.set_schedule(SCHEDULE)
    since = time.monotonic()
    store = PlanStore(None, stack.tables)
    deadline, plan = since + PLAN_TIMEOUT, None
    while time.monotonic() < deadline:
        done = [p for p in store.plans() if p.status in ("verified", "diverged")]
        if done:
            plan = done[0]
            break
        time.sleep(5)
    assert plan is not None, f"no plan verified within {PLAN_TIMEOUT} s of the schedule"
    stack.figures["first_verified_plan_seconds"] = round(time.monotonic() - since, 1)
    summary = plan.summary()
    print(f"plan {plan.plan_id} {plan.status}: imbalance {summary['imbalance_before']:.3f} -> "
          f"realised {plan.realised_imbalance:.3f}, {summary['moved_keys']} key(s) moved",
          flush=True)
    assert plan.status == "verified", plan.reasons
    assert summary["moved_keys"] > 0
    assert plan.realised_imbalance < summary["imbalance_before"]

    # the job that took it is the user's processor under rebalanced(), live switch only
    start = latest_start(None, "sessions", root=stack.tables)
    assert (start.app, start.capability, start.splits) == ("rebalanced", "handoff", False)
    # every user the plan routes off its default instance had its session handed over,
    # once, from the version before (the default placement) to this one
    routed = tables.read_assignment(None, plan.assignment_version, stack.tables).routing
    control = delta_rs.rows(control_path(str(stack.s.data / "checkpoints" / "sessions")))
    handed = [pickle.loads(r["payload"])["key"] for r in control
              if r["kind"] == "in" and r["version"] == plan.assignment_version]
    assert sorted(handed) == sorted(routed), (handed, routed)
