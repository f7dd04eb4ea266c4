"""The DAG's three waits, deferred to the triggerer: ``windows`` (are the interval's
windows written), ``await_restart`` (has the job acknowledged the controlled restart) and
``verify`` (are the windows under the new version in, and within the bound).

Each is one check (:func:`.inputs.windows_check`, :func:`.rollout.await_restart`,
:func:`.rollout.verify`) run once in the task, then by :class:`RolloutWaitTrigger` on the
triggerer, again only when a table it reads gained a commit (:data:`WATCHED`) or a deadline
came. How and why: ``docs/dag.md``, "Deferred waits".
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from airflow.sdk import BaseOperator
from airflow.triggers.base import BaseTrigger, TriggerEvent

from rebalance.control import inputs, jobs, rollout
from rebalance.control.errors import InvalidParams, RestartFailed, RunSkipped, VerificationFailed
from rebalance.core.registry import JobConfig

#: The checks a wait may run, by name: each takes its JSON-able payload and returns
#: ``{"is_done", "xcom_value"}``.
CHECKS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "windows": inputs.windows_check,
    "await_restart": rollout.await_restart,
    "verify": rollout.verify,
}
#: The tables whose new commits may change a waiting check's answer (by table name).
WATCHED: dict[str, tuple[str, ...]] = {
    "windows": ("key_histograms", "assignments", "plans"),
    "await_restart": ("restarts", "plans"),
    "verify": ("key_histograms", "plans"),
}
#: A waiting check runs again at least this often, whatever its tables did.
FULL_CHECK_SECONDS = 60.0
#: How a failed check's exception crosses from the triggerer back to the task.
ERRORS = {cls.__name__: cls for cls in (RestartFailed, VerificationFailed, RunSkipped,
                                       InvalidParams)}


def run_check(check: str, payload: Any, job: JobConfig | None) -> dict[str, Any]:
    """``check`` on ``payload``, as ``job``'s when one is given (:func:`.jobs.run_as`):
    its XCom then names the job, as every task's of a job's DAG does."""
    if job is None:
        return CHECKS[check](payload)
    result = dict(jobs.run_as(job, CHECKS[check], payload))
    if isinstance(result.get("xcom_value"), dict):
        result["xcom_value"] = {**result["xcom_value"], "job": job.name}
    return result


def _outcome(check: str, payload: Mapping[str, Any],
             job: dict[str, Any] | None = None) -> dict[str, Any]:
    """One check, as a JSON-able event: done with its XCom, waiting, or the error (run
    as ``job``'s, :func:`.jobs.run_as`, when one is given)."""
    try:
        result = run_check(check, payload, jobs.from_dict(job))
    except Exception as exc:  # noqa: BLE001 - handed back to the task, raised there
        return {"status": "error", "error": type(exc).__name__, "message": str(exc)}
    if result["is_done"]:
        return {"status": "done", "xcom_value": result["xcom_value"]}
    return {"status": "waiting", "recheck_at": result.get("recheck_at")}


def log_versions(check: str, job: dict[str, Any] | None = None
                 ) -> dict[str, tuple[int, int] | None]:
    """The newest commit of each table :data:`WATCHED` by ``check`` in ``job``'s tables
    (:func:`~rebalance.spark.delta_rs.log_ident`; None: not listable)."""
    from rebalance.core import registry
    from rebalance.spark import tables
    from rebalance.spark.delta_rs import log_ident
    from rebalance.spark.paths import join

    with registry.job_scope(jobs.from_dict(job)):
        root = tables.tables_root()
    return {name: log_ident(join(root, name)) for name in WATCHED.get(check, ())}


def unchanged(before: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether no watched table gained a commit (and each could be listed both times)."""
    return bool(before) and before == now and None not in now.values()


class RolloutWaitTrigger(BaseTrigger):
    """Runs ``check`` every ``poke_seconds`` until it is done or fails (one event)."""

    def __init__(self, check: str, payload: dict[str, Any], poke_seconds: float,
                 job: dict[str, Any] | None = None) -> None:
        super().__init__()
        if check not in CHECKS:
            raise ValueError(f"unknown check {check!r}; choose one of {', '.join(CHECKS)}")
        self.check, self.payload, self.poke_seconds = check, payload, float(poke_seconds)
        self.job = job

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"check": self.check, "payload": self.payload,
                 "poke_seconds": self.poke_seconds, "job": self.job})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        seen: dict[str, Any] = {}
        recheck_at, checked = None, 0.0
        while True:
            now = await asyncio.to_thread(log_versions, self.check, self.job)
            due = (not unchanged(seen, now)
                   or (recheck_at is not None and time.time() >= float(recheck_at))
                   or time.monotonic() - checked >= FULL_CHECK_SECONDS)
            if due:
                # the logs as listed before the check: a commit during it is seen next time
                seen, checked = now, time.monotonic()
                event = await asyncio.to_thread(_outcome, self.check, self.payload, self.job)
                if event["status"] != "waiting":
                    yield TriggerEvent(event)
                    return
                recheck_at = event.get("recheck_at")
            await asyncio.sleep(self.poke_seconds)


class RolloutWait(BaseOperator):
    """A wait (``check``: ``await_restart`` or ``verify``) on ``payload`` (the XCom of the
    task before it): checked once here, then deferred while not done.
    ``timeout`` lies beyond the longest deadline the Params allow, so the check's own
    deadline (rollback, diverged) always fires first."""

    template_fields = ("payload",)
    ui_color = "#e8f4fd"

    def __init__(self, *, check: str, payload: Any, poke_seconds: float,
                 timeout: dt.timedelta, job: JobConfig | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if check not in CHECKS:
            raise ValueError(f"unknown check {check!r}; choose one of {', '.join(CHECKS)}")
        self.check, self.payload, self.job = check, payload, job
        self.poke_seconds, self.timeout = float(poke_seconds), timeout

    def execute(self, context: Any) -> Any:
        # its errors raised here as they are
        result = run_check(self.check, self.payload, self.job)
        if result["is_done"]:
            return result["xcom_value"]
        self.log.info("deferred to the triggerer: %s checked every %.0f s", self.check,
                      self.poke_seconds)
        self.defer(trigger=RolloutWaitTrigger(self.check, dict(self.payload),
                                              self.poke_seconds, jobs.to_dict(self.job)),
                   method_name="resume", timeout=self.timeout)

    def resume(self, context: Any, event: dict[str, Any]) -> Any:
        if event["status"] == "done":
            return event["xcom_value"]
        error = ERRORS.get(event.get("error", ""))
        if error is None:
            raise RuntimeError(f"{self.check}: {event.get('error')}: {event.get('message')}")
        raise error(event["message"])


class WindowsWait(RolloutWait):
    """The run's first task: its windows (:func:`.inputs.windows_check`, on the run's
    params and data interval), waited for on the triggerer until the wait's deadline."""

    def __init__(self, *, poke_seconds: float, timeout: dt.timedelta,
                 job: JobConfig | None = None, **kwargs: Any) -> None:
        super().__init__(check="windows", payload=None, poke_seconds=poke_seconds,
                         timeout=timeout, job=job, **kwargs)

    def execute(self, context: Any) -> Any:
        run = context["dag_run"]
        self.payload = inputs.windows_args(
            dict(context["params"]), run.dag_id, run.run_id, run.run_type,
            context.get("data_interval_start"), context.get("data_interval_end"))
        return super().execute(context)
