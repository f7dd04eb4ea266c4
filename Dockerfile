# Airflow 3.3.2 (Python 3.11) with Java 17, Spark + Delta and this project.
# Build: docker build -t rebalance:latest .

# A Java 17 runtime for Spark, independent of the base image's Debian release.
FROM eclipse-temurin:17-jre AS java

FROM apache/airflow:slim-3.3.2-python3.11
USER root
COPY --from=java /opt/java/openjdk /opt/java/openjdk
ENV JAVA_HOME=/opt/java/openjdk \
    PATH=/opt/java/openjdk/bin:$PATH \
    REBALANCE_JARS_DIR=/opt/rebalance/jars \
    REBALANCE_DATA_DIR=/opt/airflow/data \
    REBALANCE_REGISTRY=/opt/airflow/rebalance.toml
RUN mkdir -p /opt/rebalance /opt/airflow/data && chown -R airflow:0 /opt/rebalance /opt/airflow/data
USER airflow

COPY --chown=airflow:0 requirements.txt constraints.txt pyproject.toml README.md /opt/rebalance/
COPY --chown=airflow:0 include/ /opt/rebalance/include/
RUN pip install --no-cache-dir -r /opt/rebalance/requirements.txt -c /opt/rebalance/constraints.txt \
 && pip install --no-cache-dir --no-deps /opt/rebalance

# Delta Lake JARs (include/jars/ivy.xml) with their runtime dependencies, and the S3A
# connector for tables on S3 (include/jars/s3a.ivy.xml, in jars/s3a: a session takes it only
# when a job of the registry keeps its tables on s3a://), fetched by the Ivy that pyspark
# ships (no Maven); no Kafka broker in the image.
RUN REBALANCE_IVY_CACHE=/tmp/ivy-cache bash /opt/rebalance/include/scripts/fetch_jars.sh /opt/rebalance/jars \
        "$(python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')" \
        --no-broker \
 && rm -rf /tmp/ivy-cache
# The class-data archive every Spark JVM of the image maps (rebalance.spark.class_data).
RUN python -m rebalance.cli.class_data

COPY --chown=airflow:0 dags/ /opt/airflow/dags/
COPY --chown=airflow:0 plugins/ /opt/airflow/plugins/
COPY --chown=airflow:0 spark_apps/ /opt/airflow/spark_apps/
# The job registry (docs/registry.md): mount your own over it. The image ships the built-in
# job alone (examples/one_job.toml): the repository's rebalance.toml adds the sessions
# example, whose app (examples/sessions.py) is not in the image.
COPY --chown=airflow:0 examples/one_job.toml /opt/airflow/rebalance.toml
