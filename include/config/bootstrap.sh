#!/bin/bash
# EMR bootstrap action: runs on every node before Spark starts.
# Builds a Python 3.11 virtual environment holding the jobs' pinned dependencies, offline, from
# the run's wheelhouse on S3: no node reaches PyPI.
#   bootstrap.sh CODE_URI VENV WHEELHOUSE_URI
# CODE_URI is the run's code folder (s3://.../code/<run_id>), holding requirements-jobs.txt and
# constraints.txt (the project's complete pinned environment, so every transitive dependency gets
# the version tested locally). WHEELHOUSE_URI (s3://.../code/wheelhouse/<hash>) holds their wheels
# and, uploaded last, manifest.json (include/wheelhouse.py). pyspark is not installed: the
# cluster's Spark provides it. Every wheel is checked against the sha256 the manifest lists before
# any is installed. Each download and the dnf install has step_timeout_s. Any failure exits
# non-zero with a "bootstrap: ERROR" line naming the step.
set -euo pipefail

code_uri="${1:?usage: bootstrap.sh CODE_URI VENV WHEELHOUSE_URI}"
venv="${2:?usage: bootstrap.sh CODE_URI VENV WHEELHOUSE_URI}"
wheelhouse="${3:?usage: bootstrap.sh CODE_URI VENV WHEELHOUSE_URI}"
build="python -m include.wheelhouse build (or any run's prepare task, which builds a missing one)"
min_free_mb=4000 # the wheels (~0.4 GB) and the environment (~1.9 GB), with room to spare
# A stalled download or dnf fails the bootstrap instead of using up the cluster's start-up allowance.
step_timeout_s="${BOOTSTRAP_STEP_TIMEOUT_S:-600}"

fail() {
  echo "bootstrap: ERROR $*" >&2
  exit 1
}

# Runs a command within step_timeout_s; one out of time fails the bootstrap, naming it.
within_time() {
  local status=0
  timeout "$step_timeout_s" "$@" || status=$?
  [ "$status" -ne 124 ] || fail "timed out after $step_timeout_s s: $*"
  return "$status"
}

# Every downloaded wheel against the manifest's sha256s: exits non-zero naming the first that differs.
check_wheels() {
  python3.11 - "$work/manifest.json" "$work/wheels" <<'PY'
import hashlib, json, pathlib, sys

listed = json.loads(pathlib.Path(sys.argv[1]).read_text()).get("sha256")
if listed is None:
    sys.exit("its manifest.json lists no sha256 of its wheels")
for wheel in sorted(pathlib.Path(sys.argv[2]).glob("*.whl")):
    with wheel.open("rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    if wheel.name not in listed:
        sys.exit(f"{wheel.name} is not in its manifest.json")
    if digest != listed[wheel.name]:
        sys.exit(f"{wheel.name} hash mismatch (sha256 {digest}, manifest.json {listed[wheel.name]})")
PY
}

root="$(dirname "$venv")"
sudo mkdir -p "$root" || fail "$root not created"
sudo chown "$(id -u):$(id -g)" "$root"
free_mb="$(df -Pm "$root" | awk 'NR == 2 {print $4}')"
[ "$free_mb" -ge "$min_free_mb" ] || fail "$root has $free_mb MB free, the environment needs $min_free_mb MB"
work="$(mktemp -d "$root/bootstrap.XXXXXX")"

within_time aws s3 cp --quiet "$code_uri/requirements-jobs.txt" "$work/requirements-jobs.txt" ||
  fail "$code_uri/requirements-jobs.txt not read"
within_time aws s3 cp --quiet "$code_uri/constraints.txt" "$work/constraints.txt" || fail "$code_uri/constraints.txt not read"
# The manifest is uploaded last: without it the wheelhouse is missing or was never finished.
within_time aws s3 cp --quiet "$wheelhouse/manifest.json" "$work/manifest.json" ||
  fail "wheelhouse $wheelhouse missing (no manifest.json): build it with $build"
within_time aws s3 cp --quiet --recursive "$wheelhouse/" "$work/wheels/" || fail "wheelhouse $wheelhouse not downloaded"

# From the Amazon Linux 2023 repositories, which are S3 buckets: an S3 gateway endpoint reaches them.
within_time sudo dnf install -y -q python3.11 python3.11-pip || fail "python3.11 not installed with dnf"
problem="$(check_wheels 2>&1)" || fail "wheelhouse $wheelhouse: $problem: rebuild it with $build"
python3.11 -m venv "$venv" || fail "virtual environment $venv not created"
"$venv/bin/python" -m pip install --no-cache-dir --progress-bar off --disable-pip-version-check \
  --no-index --find-links "$work/wheels" \
  -r "$work/requirements-jobs.txt" -c "$work/constraints.txt" ||
  fail "pip could not install from wheelhouse $wheelhouse (pip's output above names the requirement): rebuild it with $build"
# A broken environment fails the bootstrap (and so the cluster) now rather than in the first step.
"$venv/bin/python" -m pip check || fail "the environment $venv is inconsistent (pip check above)"
rm -rf "$work"
