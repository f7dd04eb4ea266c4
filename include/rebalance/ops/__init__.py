"""Operations: the service's processes (``make up``), the standalone cluster, the Kafka
broker, the demo, the REST client of Airflow and the health strip."""
