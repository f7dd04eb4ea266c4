"""rebalance: plan and apply load rebalancing for keyed stateful stream jobs."""

__version__ = "0.1.0"
