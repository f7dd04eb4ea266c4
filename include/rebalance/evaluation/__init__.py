"""Evaluation harness (``rebalance bench``): replay workloads over many intervals and run
every planner side by side on the same data.

* :mod:`.workloads`: traces (per-interval load and state of every key) for the seed
  workloads (003 Zipf with fluctuation, 001 Gaussian vs Zipf substreams, 002 node
  perturbation) and for a histogram table the streaming job wrote.
* :mod:`.runner`: the replay loop (plan on window t-1, carry the assignment to t).
* :mod:`.experiments`: the experiment grids of the seeds and the quick mode.
* :mod:`.plots`: PNG plots of a summary.
* :mod:`.cli`: the ``bench`` subcommand.
"""
