"""What a control-plane task raises when it does not simply return.

Skips raise :class:`RunSkipped` (Airflow marks the task skipped, with the reason in its
log and in its XCom :data:`SKIP_REASON`, and skips what follows); the others fail the
task without retrying. Outside Airflow (the CLI) the same classes work as plain exceptions.
"""

from __future__ import annotations

import logging

try:  # the task library runs under Airflow; the CLI (rollback) may run without it
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
except ImportError:  # pragma: no cover - exercised only where Airflow is absent
    class AirflowSkipException(Exception):  # type: ignore[no-redef]
        """Stand-in when Airflow is not installed."""

    class AirflowFailException(Exception):  # type: ignore[no-redef]
        """Stand-in when Airflow is not installed."""


log = logging.getLogger("rebalance.control")
#: The XCom key of a skipped task's reason (read by :func:`rebalance.ops.health.db_lines`
#: from Airflow's metadata database: the Rebalance view's last run).
SKIP_REASON = "skip_reason"


class RunSkipped(AirflowSkipException):
    """Nothing to do for this run; the message says why. Airflow marks the task skipped.

    The reason goes to the task's log (``make status`` reads it through the REST API,
    ``airflow_client.SKIPPED``) and, inside a task, to its XCom :data:`SKIP_REASON`. A
    check that waits may make one and wait on: the last one made is the one raised, and
    a reason counts only for a task that ended skipped.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        log.info("skipped: %s", reason)  # airflow_client.SKIPPED finds it in the task log
        _keep_reason(reason)


def _keep_reason(reason: str) -> None:
    """``reason`` as the running task's XCom :data:`SKIP_REASON`; nothing outside a task
    (the CLI, the triggerer: a reason found there is made again in the task). Failing to
    keep it never changes the skip."""
    try:
        from airflow.sdk import get_current_context

        ti = get_current_context()["ti"]
    except (ImportError, RuntimeError, KeyError):
        return
    try:
        ti.xcom_push(SKIP_REASON, reason)
    except Exception:  # noqa: BLE001 - the log still has the reason
        log.warning("could not keep the skip reason as XCom %s", SKIP_REASON, exc_info=True)


class InvalidParams(AirflowFailException, ValueError):
    """The run's params are inconsistent; raised before any work, never retried."""


class PlanRejected(AirflowFailException):
    """The plan failed validation; it is stored as rejected and never applied."""


class ApplyRefused(AirflowFailException):
    """The plan cannot be applied (stale, wrong status, or another run holds the lease)."""


class VerificationFailed(AirflowFailException):
    """The realised imbalance after applying did not match the prediction."""


class RestartFailed(AirflowFailException):
    """The controlled restart failed or timed out; the previous assignment was restored."""

