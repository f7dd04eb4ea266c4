"""``python -m rebalance.cli``: the ``rebalance`` command."""

import sys

from rebalance.cli import main

sys.exit(main())
