"""The two relative tolerances of the planning core's float comparisons, each with its one job.

Not the imbalance bound theta, nor the DAG's ``verify_tolerance``: these absorb rounding.

* :data:`LOAD_TOL` (1e-12): a planner comparing its own loads with a bound (L_max, a
  level, an excess to shed). Sums of the same float loads in another order differ by a
  few ulps; a key that fits up to that fits.
* :data:`CHECK_TOL` (1e-9): checking a finished plan against its limits (imbalance
  bound, byte and key budgets) and comparing plans. Metrics are recomputed from the
  assignment in another order than the planner summed them, over up to 10^7 keys, so
  the check must accept what the planner, at :data:`LOAD_TOL`, considered within: the
  check is looser than the planner by design, never the other way round.
"""

LOAD_TOL = 1e-12
CHECK_TOL = 1e-9
