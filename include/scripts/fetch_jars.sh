#!/usr/bin/env bash
# Copy the Delta Lake JARs and the Kafka connector (include/jars/ivy.xml) and their
# runtime dependencies into DEST, leaving out every artifact pyspark already ships
# (Scala, Hadoop, Jackson, Parquet, ...) so the classpath holds one version of each
# library; and the Kafka broker (include/jars/kafka-broker.ivy.xml) with all its
# dependencies into DEST/kafka-broker/, a classpath of its own; and Hadoop's S3A connector
# (include/jars/s3a.ivy.xml: hadoop-aws and the AWS SDK bundle) into DEST/s3a/, given to a
# Spark session only when a job keeps its tables on an object store.
#
# Apache Ivy resolves and downloads them: the Ivy JAR pyspark ships (PYSPARK_JARS_DIR/
# ivy-*.jar), run on $JAVA_HOME/bin/java (else the java on PATH), so no Maven is needed.
# include/jars/ivysettings.xml keeps Ivy to its built-in public Maven repository resolver
# and checks every file against the repository's published checksum. Version conflicts go
# to the latest version (as with Spark's own --packages). Ivy's cache is $REBALANCE_IVY_CACHE
# (default .ivy-cache/ in the repository, git-ignored); a second fetch downloads nothing.
# Usage: fetch_jars.sh DEST PYSPARK_JARS_DIR [--no-broker]
# --no-broker leaves the Kafka broker out (the Docker image has none).
set -euo pipefail
dest=$1
spark_jars=$2
broker=yes
[ "${3:-}" = "--no-broker" ] && broker=no
here="$(cd "$(dirname "$0")/../.." && pwd)"
descriptors="$here/include/jars"
cache=${REBALANCE_IVY_CACHE:-$here/.ivy-cache}
java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
ivy=$(compgen -G "$spark_jars/ivy-[0-9]*.jar" | head -n1) \
  || { echo "fetch_jars: no ivy-*.jar in $spark_jars (pyspark's JARs)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/spark" "$tmp/s3a" "$tmp/keep/kafka-broker" "$tmp/keep/s3a"
retrieve() {  # retrieve IVY_XML OUTPUT_DIR (Ivy's output, download progress included, on failure only)
  "$java" -jar "$ivy" -warn -settings "$descriptors/ivysettings.xml" -cache "$cache" \
    -ivy "$1" -confs runtime -retrieve "$2/[artifact]-[revision](-[classifier]).[ext]" \
    >"$tmp/ivy.log" 2>&1 || { cat "$tmp/ivy.log" >&2; echo "fetch_jars: Ivy could not resolve $1" >&2; exit 1; }
}
retrieve "$descriptors/ivy.xml" "$tmp/spark"
[ "$broker" = no ] || retrieve "$descriptors/kafka-broker.ivy.xml" "$tmp/keep/kafka-broker"
retrieve "$descriptors/s3a.ivy.xml" "$tmp/s3a"
keep_unshipped() {  # keep_unshipped FROM TO: the JARs of FROM that pyspark does not ship
  for jar in "$1"/*.jar; do
    name=$(basename "$jar")
    artifact=$(printf '%s' "$name" | sed -E 's/-[0-9][^-]*(-[0-9]+)?\.jar$//')
    if ! compgen -G "$spark_jars/${artifact}-[0-9]*.jar" >/dev/null; then
      mv "$jar" "$2/"
    fi
  done
}
keep_unshipped "$tmp/spark" "$tmp/keep"
keep_unshipped "$tmp/s3a" "$tmp/keep/s3a"
compgen -G "$tmp/keep/delta-spark_*.jar" >/dev/null || { echo "fetch_jars: delta-spark JAR missing after the Ivy retrieve" >&2; exit 1; }
compgen -G "$tmp/keep/spark-sql-kafka-0-10_*.jar" >/dev/null || { echo "fetch_jars: spark-sql-kafka JAR missing after the Ivy retrieve" >&2; exit 1; }
compgen -G "$tmp/keep/s3a/hadoop-aws-*.jar" >/dev/null || { echo "fetch_jars: hadoop-aws JAR missing after the Ivy retrieve" >&2; exit 1; }
if [ "$broker" = yes ]; then
  compgen -G "$tmp/keep/kafka-broker/kafka_2.13-*.jar" >/dev/null || { echo "fetch_jars: kafka_2.13 JAR missing after the Ivy retrieve" >&2; exit 1; }
fi
rm -rf "$dest.tmp" && mv "$tmp/keep" "$dest.tmp" && rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "Spark JARs in $dest: $(ls "$dest"/*.jar | xargs -n1 basename | tr '\n' ' ')"
echo "Kafka broker JARs in $dest/kafka-broker: $(ls "$dest/kafka-broker" | wc -l) files"
echo "S3A JARs in $dest/s3a: $(ls "$dest"/s3a/*.jar | xargs -n1 basename | tr '\n' ' ')"
