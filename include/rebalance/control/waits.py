"""The DAG's two waits, ``await_restart`` and ``verify``, deferred to the triggerer.

Each is one check of :mod:`.rollout` (``await_restart``: has the job acknowledged the
controlled restart; ``verify``: are the windows under the new version in, and within the
bound), run once in the task and, while not done, every ``poke_seconds`` by
:class:`RolloutWaitTrigger` on the triggerer (``make up`` runs one): the wait holds no
worker slot, however long the run's deadline (``restart_timeout_minutes``,
``verify_timeout_minutes``, checked by the checks themselves) lets it last.

The check runs in a thread of the triggerer (it reads Delta through Spark, which blocks).
When it fails (the restart was rolled back, the plan diverged, the deadline passed), the
trigger hands the error back and the task resumes on a worker to raise it there, so the
task fails with the check's own message, as the sensors it replaces did.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from airflow.sdk import BaseOperator
from airflow.triggers.base import BaseTrigger, TriggerEvent

from . import rollout
from .errors import RestartFailed, RunSkipped, VerificationFailed

#: The checks a wait may run, by name: each returns ``{"is_done", "xcom_value"}``.
CHECKS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "await_restart": rollout.await_restart,
    "verify": rollout.verify,
}
#: How a failed check's exception crosses from the triggerer back to the task.
ERRORS = {cls.__name__: cls for cls in (RestartFailed, VerificationFailed, RunSkipped)}


def _outcome(check: str, applied: Mapping[str, Any]) -> dict[str, Any]:
    """One check, as a JSON-able event: done with its XCom, waiting, or the error."""
    try:
        result = CHECKS[check](applied)
    except Exception as exc:  # noqa: BLE001 - handed back to the task, raised there
        return {"status": "error", "error": type(exc).__name__, "message": str(exc)}
    if result["is_done"]:
        return {"status": "done", "xcom_value": result["xcom_value"]}
    return {"status": "waiting"}


class RolloutWaitTrigger(BaseTrigger):
    """Runs ``check`` every ``poke_seconds`` until it is done or fails (one event)."""

    def __init__(self, check: str, applied: dict[str, Any], poke_seconds: float) -> None:
        super().__init__()
        if check not in CHECKS:
            raise ValueError(f"unknown check {check!r}; choose one of {', '.join(CHECKS)}")
        self.check, self.applied, self.poke_seconds = check, applied, float(poke_seconds)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"check": self.check, "applied": self.applied,
                 "poke_seconds": self.poke_seconds})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            event = await asyncio.to_thread(_outcome, self.check, self.applied)
            if event["status"] != "waiting":
                yield TriggerEvent(event)
                return
            await asyncio.sleep(self.poke_seconds)


class RolloutWait(BaseOperator):
    """A wait of the rollout (``check``: ``await_restart`` or ``verify``) on ``applied``
    (the XCom of the task before it): checked once here, then deferred while not done.
    ``timeout`` lies beyond the longest deadline the Params allow, so the check's own
    deadline (rollback, diverged) always fires first."""

    template_fields = ("applied",)
    ui_color = "#e8f4fd"

    def __init__(self, *, check: str, applied: Any, poke_seconds: float,
                 timeout: dt.timedelta, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if check not in CHECKS:
            raise ValueError(f"unknown check {check!r}; choose one of {', '.join(CHECKS)}")
        self.check, self.applied = check, applied
        self.poke_seconds, self.timeout = float(poke_seconds), timeout

    def execute(self, context: Any) -> Any:
        event = _outcome(self.check, self.applied)
        if event["status"] == "waiting":
            self.log.info("deferred to the triggerer: %s checked every %.0f s", self.check,
                          self.poke_seconds)
            self.defer(trigger=RolloutWaitTrigger(self.check, dict(self.applied),
                                                  self.poke_seconds),
                       method_name="resume", timeout=self.timeout)
        return self.resume(context, event)

    def resume(self, context: Any, event: dict[str, Any]) -> Any:
        if event["status"] == "done":
            return event["xcom_value"]
        error = ERRORS.get(event.get("error", ""))
        if error is None:
            raise RuntimeError(f"{self.check}: {event.get('error')}: {event.get('message')}")
        raise error(event["message"])
