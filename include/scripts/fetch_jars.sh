#!/usr/bin/env bash
# Copy the Delta Lake JARs (include/jars/pom.xml) and their runtime dependencies
# into DEST, leaving out every artifact pyspark already ships (Scala, Hadoop,
# Jackson, Parquet, ...) so the classpath holds one version of each library.
# Usage: fetch_jars.sh DEST PYSPARK_JARS_DIR [MAVEN_OUTPUT_DIR]
# With MAVEN_OUTPUT_DIR (JARs Maven already copied, e.g. in a Docker build
# stage) the Maven step is skipped.
set -euo pipefail
dest=$1
spark_jars=$2
pom="$(cd "$(dirname "$0")/../jars" && pwd)/pom.xml"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "${3:-}" ]; then
  cp "$3"/*.jar "$tmp"/
else
  mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp"
fi
mkdir -p "$tmp/keep"
for jar in "$tmp"/*.jar; do
  name=$(basename "$jar")
  artifact=$(printf '%s' "$name" | sed -E 's/-[0-9][^-]*(-[0-9]+)?\.jar$//')
  if ! compgen -G "$spark_jars/${artifact}-[0-9]*.jar" >/dev/null; then
    mv "$jar" "$tmp/keep/"
  fi
done
compgen -G "$tmp/keep/delta-spark_*.jar" >/dev/null || { echo "fetch_jars: delta-spark JAR missing after Maven copy" >&2; exit 1; }
rm -rf "$dest.tmp" && mv "$tmp/keep" "$dest.tmp" && rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "Delta JARs in $dest: $(ls "$dest" | tr '\n' ' ')"
