"""The registry's jobs as the DAGs see them: one ``rebalance`` DAG per job, its Params
defaults taken from the job, and every task run as that job's (:func:`run_as`).

A task's payload carries the job it was made for (``job``); a task of another job's DAG
refuses it, so a plan of one job is never validated, published or applied on another's
tables (each job's plans also live in its own tables).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from rebalance.control.errors import InvalidParams
from rebalance.control.params import PARAMS_SCHEMA
from rebalance.core import registry
from rebalance.core.registry import JobConfig

#: The run params whose default a job sets in the registry (Params form defaults).
JOB_PARAM_DEFAULTS = ("theta", "apply_mode", "require_approval")


def jobs() -> tuple[JobConfig, ...]:
    """The registry's jobs (``REBALANCE_REGISTRY``, default ``rebalance.toml``)."""
    return registry.load().jobs


def named(name: str | None) -> JobConfig:
    """The registry's job ``name`` (None: the first); unknown: one line, the names."""
    try:
        return registry.load().job(name)
    except registry.RegistryError as exc:
        raise InvalidParams(str(exc)) from None


def params_schema(job: JobConfig) -> dict[str, dict[str, Any]]:
    """The DAG's Params for ``job``: :data:`PARAMS_SCHEMA` with the job's defaults."""
    return {name: ({**spec, "default": getattr(job, name)} if name in JOB_PARAM_DEFAULTS
                   else dict(spec))
            for name, spec in PARAMS_SCHEMA.items()}


def check_payload(job: JobConfig, payload: Any) -> None:
    """Refuse a payload made for another job (one line, both names)."""
    if isinstance(payload, Mapping) and payload.get("job") not in (None, job.name):
        raise InvalidParams(f"this payload belongs to job {payload['job']!r}; the DAG of job "
                            f"{job.name!r} never plans, publishes or applies another job's "
                            f"plan")


def run_as(job: JobConfig, fn: Callable[..., Any], *payloads: Any) -> Any:
    """``fn(*payloads)`` as ``job``'s (its tables, its name), the job named in its result."""
    for payload in payloads:
        check_payload(job, payload)
    with registry.job_scope(job):
        result = fn(*payloads)
    if isinstance(result, dict):
        result = {**result, "job": job.name}
    return result


def to_dict(job: JobConfig | None) -> dict[str, Any] | None:
    """``job`` as JSON-able values (a trigger carries it to the triggerer)."""
    return None if job is None else dataclasses.asdict(job)


def from_dict(values: Mapping[str, Any] | None) -> JobConfig | None:
    return None if values is None else JobConfig(**values)
