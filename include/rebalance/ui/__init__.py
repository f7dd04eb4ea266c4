"""The Rebalance view's pages (the Airflow plugin in ``plugins/`` serves them)."""
