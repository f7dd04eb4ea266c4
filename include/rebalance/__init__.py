"""rebalance: plan and apply load rebalancing for keyed stateful stream jobs.

``from rebalance import rebalanced`` runs a user's own StatefulProcessor rebalanced
(:func:`rebalance.streaming.rebalanced.rebalanced`; imported on first use, so that
``import rebalance`` needs no Spark).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "rebalanced":
        from rebalance.streaming.rebalanced import rebalanced

        return rebalanced
    raise AttributeError(f"module 'rebalance' has no attribute {name!r}")
