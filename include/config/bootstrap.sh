#!/bin/bash
# EMR bootstrap action: runs on every node before Spark starts.
# Builds a Python 3.11 virtual environment holding the jobs' pinned dependencies.
#   bootstrap.sh CODE_URI VENV
# CODE_URI is the run's code folder (s3://.../code/<run_id>), holding requirements-jobs.txt and
# constraints.txt (the project's complete pinned environment, so every transitive dependency gets
# the version tested locally). pyspark is not installed: the cluster's Spark provides it.
set -euo pipefail

code_uri="${1:?usage: bootstrap.sh CODE_URI VENV}"
venv="${2:?usage: bootstrap.sh CODE_URI VENV}"
work="$(mktemp -d)"

aws s3 cp "$code_uri/requirements-jobs.txt" "$work/requirements-jobs.txt"
aws s3 cp "$code_uri/constraints.txt" "$work/constraints.txt"

sudo dnf install -y -q python3.11 python3.11-pip
sudo mkdir -p "$venv"
sudo chown "$(id -u):$(id -g)" "$venv"
python3.11 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check \
  -r "$work/requirements-jobs.txt" -c "$work/constraints.txt"
# A broken environment fails the bootstrap (and so the cluster) now rather than in the first step.
"$venv/bin/python" -m pip check
rm -rf "$work"
