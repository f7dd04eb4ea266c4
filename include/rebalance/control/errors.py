"""What a control-plane task raises when it does not simply return.

Skips raise :class:`RunSkipped` (Airflow marks the task skipped, with the reason in its
log, and skips what follows); the others fail the task without retrying. Outside
Airflow (the CLI) the same classes work as plain exceptions.
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


class RunSkipped(AirflowSkipException):
    """Nothing to do for this run; the message says why. Airflow marks the task skipped."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        log.info("skipped: %s", reason)  # airflow_client.SKIPPED finds it in the task log


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

