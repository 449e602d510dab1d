"""`make compose-test` as a test: docker-compose.yaml really run on this machine, one small DAG run
triggered through Airflow's REST API, its record read from LocalStack (local_platform/compose_stack.py).

A cold run builds every image (10 to 30 minutes on 2 cores); later runs reuse them (docs/benchmarks.md).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from pipeline.config import REPO_ROOT
from pipeline.config_files import load_config

TIMEOUT_S = 3300


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 200)
def test_the_compose_stack_trains_a_run_and_records_it_on_localstack():
    process = subprocess.Popen(
        [sys.executable, "-m", "local_platform.compose_stack"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # the stack is removed before it exits
        output, _ = process.communicate(timeout=180)
        pytest.fail(f"make compose-test did not finish in {TIMEOUT_S} s:\n{output[-8000:]}")
    assert process.returncode == 0, output[-12000:]
    bucket, prefix = load_config().s3.bucket, load_config().s3.prefix
    assert re.search(rf"record: s3://{bucket}/{prefix}/compose-\S+/ \(\d+ objects\); latest: ", output), output
    assert "compose test passed" in output
