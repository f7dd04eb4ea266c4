"""The planner registry's names, without importing any planner (nor numpy).

:mod:`rebalance.core.planners` builds planners from it (``get_planner``); the DAG's Params
form, the CLI's ``--method`` choices and the benchmarks list the methods from
:data:`METHODS`, so a planner added here shows up everywhere.
"""

# name -> "module:Class"; modules are imported on first use.
_REGISTRY = {
    "hash": "baselines:HashPlanner",
    "lpt": "baselines:LptPlanner",
    "elb": "eager_groups:ElbPlanner",
    "clb": "correlated_groups:ClbPlanner",
    "milp": "milp:MilpPlanner",
    "mintable": "table_migration:MinTablePlanner",
    "minmig": "table_migration:MinMigPlanner",
    "mixed": "table_migration:MixedPlanner",
    "greedy": "greedy:GreedyPlanner",
    "auto": "auto:AutoPlanner",
}

METHODS = tuple(_REGISTRY)
