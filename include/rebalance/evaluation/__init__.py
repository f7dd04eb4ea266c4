"""Evaluation harness (``rebalance bench``): replay workloads over many intervals and run
every planner side by side on the same data.

* :mod:`.workloads`: traces (per-interval load and state of every key) for the papers'
  workloads (Fang et al.'s Zipf with fluctuation, the ELB/CLB paper's Gaussian vs Zipf
  substreams, Madsen et al.'s node perturbation) and for a histogram table the streaming
  job wrote.
* :mod:`.runner`: the replay loop (plan on window t-1, carry the assignment to t).
* :mod:`.experiments`: the experiment grids of the papers and the quick mode.
* :mod:`.scale`: the whole ``rebalance plan`` command at 10^4 to 10^7 keys.
* :mod:`.plots`: PNG plots of a summary.

The ``bench`` subcommand itself is :mod:`rebalance.cli.evaluate`.
"""
