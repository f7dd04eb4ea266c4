"""rebalance: plan and apply load rebalancing for keyed stateful stream jobs.

``from rebalance import rebalanced`` runs a user's own StatefulProcessor rebalanced
(:func:`rebalance.streaming.rebalanced.rebalanced`); ``from rebalance import Merge``
declares how its partial results merge (:class:`rebalance.streaming.merge.Merge`);
``from rebalance import count_duplicates`` counts the input rows a processor dropped as
duplicates (:func:`rebalance.streaming.duplicates.count_duplicates`). Each is imported on
first use, so that ``import rebalance`` needs no Spark.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "rebalanced":
        from rebalance.streaming.rebalanced import rebalanced

        return rebalanced
    if name == "Merge":
        from rebalance.streaming.merge import Merge

        return Merge
    if name == "count_duplicates":
        from rebalance.streaming.duplicates import count_duplicates

        return count_duplicates
    raise AttributeError(f"module 'rebalance' has no attribute {name!r}")
