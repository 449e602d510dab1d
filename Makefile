# The two commands: `make run` (the pipeline on this machine) and `make test` (the test suite);
# `make airflow` starts Airflow with its UI to trigger and watch runs.
# Both create or refresh the virtual environment from requirements.txt first.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
CORPUS ?=
SET ?=
ARGS ?=
# pytest-xdist workers: one per core and one more, as the tests often wait on a process (a JVM's or
# Airflow's start, a healthcheck, a poll) and a core would sit idle (docs/testing.md).
TEST_WORKERS := $(shell echo $$(( $$(nproc) + 1 )))
# What `make tensorboard` shows: a run folder, or the folder of every run.
RUN ?= lake/runs
# VERBOSE=1: all of Airflow's, Spark's and TensorFlow's output on the console, not only in the log.
VERBOSE ?=
VERBOSE_ARG := $(if $(filter 1 yes true,$(VERBOSE)),--verbose)
# Through the environment, not pasted into the command line, so that quotes, spaces and `#` in
# them reach the run command as typed; the run command splits SET into words as a shell would.
# $(value): as typed, `$` too, which make would otherwise expand (`$5` to nothing, `$(shell …)` run).
override CORPUS := $(value CORPUS)
override SET := $(value SET)
export CORPUS SET

.PHONY: help run rehearse airflow mlflow tensorboard wheelhouse check test compose-test venv hf-venv mlflow-venv browser lock clean
.DEFAULT_GOAL := help

help:
	@echo "make run      the whole pipeline (the Airflow DAG) on this machine; CORPUS='...' SET='section.key=value ...' VERBOSE=1"
	@echo "make rehearse the DAG with target emr on this machine: moto's EMR and S3, a Spark standalone cluster (docs/rehearsal.md)"
	@echo "make check    ruff, then the tests that start no Spark, TensorFlow, Airflow or pip: minutes (docs/testing.md); ARGS='tests/... -k ...'"
	@echo "make test     the test suite: make check, then the rest (Spark, TensorFlow, Airflow, pip, end to end)"
	@echo "make compose-test docker-compose.yaml really run: images built here, one DAG run through the REST API (docs/docker.md); ARGS=--remove-images"
	@echo "make airflow  Airflow with its UI on http://127.0.0.1:8080, to trigger and watch runs"
	@echo "make mlflow   MLflow's UI on http://127.0.0.1:5000: every local run, the registered models (docs/tracking.md); builds .venv-mlflow"
	@echo "make tensorboard  TensorBoard on http://127.0.0.1:6006 for every run in lake/runs, or RUN=lake/runs/<run id>"
	@echo "make wheelhouse the EMR nodes' Python wheels, built with pip download and uploaded to emr.code_prefix (docs/emr.md); ARGS='--no-upload ...'"
	@echo "make clean    remove Airflow's home, the rehearsals' copies, build and test leftovers (lake/, the runs, stays)"
	@echo "make lock     re-pin requirements.txt from requirements.in"
	@echo "make hf-venv  .venv-hf: transformers and torch (requirements-hf.txt) for the Hugging Face export's test"

$(BIN)/.installed: requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || { \
	  echo "Python 3.11 is required, and $(PYTHON) is not it: apt-get install -y python3.11 python3.11-venv (or make PYTHON=/path/to/python3.11)"; exit 1; }
	@command -v java >/dev/null || { echo "Java (17) is required for Spark: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	# --clear: a changed requirements.txt gets a new environment holding exactly its pins, so a
	# package dropped or renamed (tensorflow -> tensorflow-cpu) does not linger beside its successor.
	$(PYTHON) -m venv --clear $(VENV)
	$(PYTHON) -m local_platform.venv_install $(VENV) requirements.txt
	touch $@

venv: $(BIN)/.installed

# transformers and torch for the test that loads the model's Hugging Face folder with them
# (tests/spark_jobs/test_export_transformers.py, which makes it when missing); kept out of .venv.
HF_VENV ?= .venv-hf
$(HF_VENV)/.installed: requirements-hf.txt
	$(PYTHON) -m venv --clear $(HF_VENV)
	$(PYTHON) -m local_platform.venv_install $(HF_VENV) requirements-hf.txt
	touch $@

hf-venv: $(HF_VENV)/.installed

# MLflow with its UI for `make mlflow`'s server (requirements-mlflow.txt): kept out of .venv, whose
# pyarrow it cannot share; .venv holds the runs' client, mlflow-skinny.
MLFLOW_VENV ?= .venv-mlflow
$(MLFLOW_VENV)/.installed: requirements-mlflow.txt
	$(PYTHON) -m venv --clear $(MLFLOW_VENV)
	$(PYTHON) -m local_platform.venv_install $(MLFLOW_VENV) requirements-mlflow.txt
	touch $@

mlflow-venv: $(MLFLOW_VENV)/.installed

# The whole DAG once with `airflow dags test`, S3 on a moto server that lives as long as the command.
run: venv
	$(BIN)/python -m local_platform.airflow_runner run --corpus "$$CORPUS" --set-from-env SET $(VERBOSE_ARG) $(ARGS)

# The DAG with target emr against moto's EMR and S3, its steps run on a Spark standalone cluster of loopback nodes.
rehearse: venv
	$(BIN)/python -m local_platform.rehearsal.rehearse --corpus "$$CORPUS" --set-from-env SET $(VERBOSE_ARG) $(ARGS)

# Airflow standalone (UI on http://127.0.0.1:8080) with the DAG and a moto S3 server; Ctrl-C stops it.
airflow: venv
	$(BIN)/python -m local_platform.airflow_runner ui

# MLflow's server on 127.0.0.1:5000 over the local runs' store, mlflow/ (SQLite and artifacts); Ctrl-C stops it.
mlflow: venv mlflow-venv
	$(BIN)/python -m local_platform.mlflow_local --mlflow $(MLFLOW_VENV)/bin/mlflow

# TensorBoard over the runs' tensorboard/ folders (docs/training.md#tensorboard); Ctrl-C stops it.
tensorboard: venv
	$(BIN)/tensorboard --logdir "$(RUN)" --host 127.0.0.1 --port 6006
# The EMR nodes' wheelhouse: pip download here, uploaded to s3://{emr.code_prefix}/wheelhouse/{hash}/
# with this machine's AWS credentials (the DAG's prepare task also builds a missing one).
wheelhouse: venv
	$(BIN)/python -m include.wheelhouse build $(ARGS)

# The UI test (tests/e2e/test_ui_trigger.py) drives Debian's Chromium through chromium-driver;
# installed with apt-get when missing (CI runs as root), so nothing downloads a browser.
browser:
	@[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || { \
	  [ "$$(id -u)" = 0 ] || { echo "The UI test needs Chromium: sudo apt-get install -y chromium chromium-driver"; exit 1; }; \
	  echo "apt-get install chromium chromium-driver (for the UI test)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; }

# The inner loop: lint, format, and the tests marked none of slow, spark, tensorflow, airflow, pip
# (tests/layers.py), on TEST_WORKERS pytest-xdist workers. ARGS narrows it: a file, -k, -x, another
# -m; ARGS='-n 0' runs it in one process (for pdb).
check: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest --part check -n $(TEST_WORKERS) $(ARGS)

# check first, so that a lint error or a broken unit shows in minutes; then the rest of the suite
# on TEST_WORKERS workers, a test file at a time, the files that hold fixed addresses one after the
# other (tests/side_by_side.py). ARGS='-n 0' runs it in one process.
test: check browser
	$(BIN)/python -m pytest --part rest -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# The compose stack started on this machine (dockerd too, as root, when none runs), one small DAG
# run triggered through Airflow's REST API and its record read from LocalStack; then the stack is
# removed. The images stay as a build cache unless ARGS=--remove-images.
compose-test: venv
	$(BIN)/python -m local_platform.compose_stack $(ARGS)

# Re-pin requirements.txt from requirements.in in a scratch environment.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet -r requirements.in
	(echo "# Generated from requirements.in by \`make lock\`: the complete pinned environment."; \
	 .lock-venv/bin/pip freeze) > requirements.txt
	rm -rf .lock-venv

# lake/ holds the runs (models, reports): left for people to delete themselves.
clean:
	rm -rf build .pytest_cache airflow_home rehearsals test-artifacts spark-warehouse metastore_db derby.log
