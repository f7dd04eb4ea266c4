"""The Spark side: event generator, keyed stateful streaming job, histograms, live routing.

Modules, in data-flow order: :mod:`.generator` (events) -> :mod:`.job` (parse,
quarantine, route, run) -> :mod:`.routing` (assignment -> instance -> partition)
-> :mod:`.processor` (the stateful operator: sliding windows and histograms).
Tables are owned by :mod:`rebalance.spark.tables`.
"""
