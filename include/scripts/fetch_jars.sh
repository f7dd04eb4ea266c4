#!/usr/bin/env bash
# Copy the Delta Lake JARs and the Kafka connector (include/jars/pom.xml) and
# their runtime dependencies into DEST, leaving out every artifact pyspark
# already ships (Scala, Hadoop, Jackson, Parquet, ...) so the classpath holds
# one version of each library; and the Kafka broker (include/jars/kafka-broker.xml)
# with all its dependencies into DEST/kafka-broker/, a classpath of its own.
# Usage: fetch_jars.sh DEST PYSPARK_JARS_DIR [MAVEN_OUTPUT_DIR [BROKER_OUTPUT_DIR]]
# With MAVEN_OUTPUT_DIR (JARs Maven already copied, e.g. in a Docker build
# stage) the Maven step is skipped; the broker is then copied from
# BROKER_OUTPUT_DIR, or left out when that is not given.
set -euo pipefail
dest=$1
spark_jars=$2
poms="$(cd "$(dirname "$0")/../jars" && pwd)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/spark" "$tmp/keep/kafka-broker"
copy_deps() {  # copy_deps POM OUTPUT_DIR
  mvn -q -B -Dstyle.color=never -f "$1" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$2"
}
if [ -n "${3:-}" ]; then
  cp "$3"/*.jar "$tmp/spark"/
  if [ -n "${4:-}" ]; then cp "$4"/*.jar "$tmp/keep/kafka-broker"/; fi
else
  copy_deps "$poms/pom.xml" "$tmp/spark"
  copy_deps "$poms/kafka-broker.xml" "$tmp/keep/kafka-broker"
fi
for jar in "$tmp"/spark/*.jar; do
  name=$(basename "$jar")
  artifact=$(printf '%s' "$name" | sed -E 's/-[0-9][^-]*(-[0-9]+)?\.jar$//')
  if ! compgen -G "$spark_jars/${artifact}-[0-9]*.jar" >/dev/null; then
    mv "$jar" "$tmp/keep/"
  fi
done
compgen -G "$tmp/keep/delta-spark_*.jar" >/dev/null || { echo "fetch_jars: delta-spark JAR missing after Maven copy" >&2; exit 1; }
compgen -G "$tmp/keep/spark-sql-kafka-0-10_*.jar" >/dev/null || { echo "fetch_jars: spark-sql-kafka JAR missing after Maven copy" >&2; exit 1; }
if [ -z "${3:-}" ] || [ -n "${4:-}" ]; then
  compgen -G "$tmp/keep/kafka-broker/kafka_2.13-*.jar" >/dev/null || { echo "fetch_jars: kafka_2.13 JAR missing after Maven copy" >&2; exit 1; }
fi
rm -rf "$dest.tmp" && mv "$tmp/keep" "$dest.tmp" && rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "Spark JARs in $dest: $(ls "$dest"/*.jar | xargs -n1 basename | tr '\n' ' ')"
echo "Kafka broker JARs in $dest/kafka-broker: $(ls "$dest/kafka-broker" | wc -l) files"
