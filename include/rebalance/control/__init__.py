"""The control plane: what the DAGs and the CLI run around the planning core.

Layers, each importable without Spark (Spark is imported inside the functions that use it):

* :mod:`rebalance.core.records` (shared with the storage layer, so it lives beside both):
  plan statuses, the plan record, ids, time and JSON helpers;
* :mod:`.errors`: the outcomes a task raises (skipped, rejected, refused, ...);
* :mod:`.params`: the run's params (the DAG's Params form), its identity, the schedule
  and the plan id;
* :mod:`.inputs`: the run's input snapshot in Delta (windows, histograms -> problem);
* :mod:`.tasks`: detect -> plan -> validate -> publish, and rollback proposals;
* :mod:`.rollout`: apply -> await_restart -> verify, the steps that touch the live assignment.
"""
