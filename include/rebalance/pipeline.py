"""Compatibility facade: the control plane's task library now lives in :mod:`rebalance.control`.

``rebalance.pipeline.X`` keeps working for code written against it (``audit``, the
restart tests); new code imports the layer it needs: :mod:`rebalance.control.params`
(run params, identity, plan id), :mod:`~rebalance.control.inputs` (windows and problem
from Delta), :mod:`~rebalance.control.tasks` (detect -> plan -> validate -> publish),
:mod:`~rebalance.control.rollout` (apply -> await_restart -> verify).
"""

from __future__ import annotations

from .control.errors import (  # noqa: F401
    ApplyRefused,
    InvalidParams,
    PlanRejected,
    RestartFailed,
    RunSkipped,
    VerificationFailed,
)
from .control.inputs import (  # noqa: F401
    CONTROL_PLANE_CONF,
    WINDOWS_POLL_SECONDS,
    assignment_frame,
    load_problem,
    read_windows,
    spark_session,
    windows_wait_seconds,
)
from .control.params import (  # noqa: F401
    APPLY_MODES,
    DAG_ID,
    DEFAULT_SCHEDULE,
    PARAMS_SCHEMA,
    RunInfo,
    RunParams,
    plan_id_for,
    timetable,
)
from .control.rollout import (  # noqa: F401
    APPLY_LEASE_SECONDS,
    apply,
    await_restart,
    job_name,
    published_version,
    realised_imbalance,
    resolve_mode,
    roll_back_assignment,
    verify,
)
from .control.tasks import (  # noqa: F401
    detect,
    needs_approval,
    new_routing,
    periods_since_last_plan,
    plan,
    plan_limits,
    propose_rollback,
    publish,
    trigger_policy,
    validate,
)
