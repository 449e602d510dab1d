# The two commands: `make run` (the pipeline on this machine) and `make test` (the test suite);
# `make airflow` starts Airflow with its UI to trigger and watch runs.
# Both create or refresh the virtual environment from requirements.txt first.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
CORPUS ?=
SET ?=
ARGS ?=

.PHONY: run airflow test venv lock clean

$(BIN)/.installed: requirements.txt
	@command -v java >/dev/null || { echo "Java (17) is required for Spark: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

venv: $(BIN)/.installed

# The whole DAG once with `airflow dags test`, S3 on a moto server that lives as long as the command.
run: venv
	$(BIN)/python -m include.airflow_local run $(if $(CORPUS),--corpus '$(CORPUS)') $(foreach s,$(SET),--set '$(s)') $(ARGS)

# Airflow standalone (UI on http://127.0.0.1:8080) with the DAG and a moto S3 server; Ctrl-C stops it.
airflow: venv
	$(BIN)/python -m include.airflow_local ui

test: venv
	$(BIN)/python -m pytest $(ARGS)

# Re-pin requirements.txt from requirements.in in a scratch environment.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet -r requirements.in
	(echo "# Generated from requirements.in by \`make lock\`: the complete pinned environment."; \
	 .lock-venv/bin/pip freeze) > requirements.txt
	rm -rf .lock-venv

clean:
	rm -rf lake build .pytest_cache airflow_home
