#!/usr/bin/env bash
# Stop setup with one clear message when a prerequisite is missing.
# Usage: check_prereqs.sh PYTHON
python=${1:-python3.11}
fail() { echo "setup: $*" >&2; exit 1; }

command -v "$python" >/dev/null 2>&1 \
  || fail "Python 3.11 not found as '$python': install Python 3.11 (or run make PYTHON=/path/to/python3.11)"
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
[ "$pyver" = "3.11" ] \
  || fail "'$python' is Python ${pyver:-unknown}, this project needs Python 3.11 (run make PYTHON=/path/to/python3.11)"

command -v java >/dev/null 2>&1 || fail "Java not found: install a Java 17 (or 21) runtime, e.g. openjdk-17-jre-headless"
javaver=$(java -version 2>&1 | sed -nE 's/.*version "([0-9]+)(\.[0-9]+)*.*/\1/p' | head -n1)
[ -n "$javaver" ] && [ "$javaver" -ge 17 ] \
  || fail "Java ${javaver:-unknown} found, Spark 4.2 needs Java 17 or 21: install openjdk-17-jre-headless"

command -v mvn >/dev/null 2>&1 || fail "Maven not found: install Maven (e.g. apt-get install maven) to fetch the Delta Lake JARs"
exit 0
