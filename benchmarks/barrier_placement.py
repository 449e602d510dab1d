"""How long the train step takes to fail when its cluster cannot place one worker per node: the train
stage's barrier stage (spark_jobs/train.run_workers) of three workers, submitted to the rehearsal's
Spark standalone cluster of two one-core nodes, with the EMR train step's barrier-slots settings
(include/emr_steps.BARRIER_SLOTS_CHECK) or, with --spark-defaults, Spark's own (10 minutes).

    .venv/bin/python -m benchmarks.barrier_placement [--spark-defaults]

Prints the seconds from the stage's submission to its failure, as the driver measured them, and
spark-submit's whole wall time (the JVM and the cluster's executors starting included).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from include import emr_steps
from local_platform.rehearsal.cluster import SparkStandaloneCluster
from tests.local_platform.barrier_jobs import submit_train_tasks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spark-defaults", action="store_true", help="Spark's own check settings instead")
    args = parser.parse_args(argv)
    conf = {} if args.spark_defaults else emr_steps.BARRIER_SLOTS_CHECK
    with (
        tempfile.TemporaryDirectory() as folder,
        SparkStandaloneCluster(workers=2, memory_per_worker_mb=1024) as cluster,
    ):
        started = time.monotonic()
        done = submit_train_tasks(cluster, Path(folder), 3, conf, timeout_s=900)
        wall = time.monotonic() - started
    failed = re.search(r"STAGE FAILED after ([0-9.]+) s: ", done.stdout)
    if not failed or "BarrierJobSlotsNumberCheckFailed" not in done.stdout:
        print(f"the stage did not fail as expected (exit {done.returncode}):\n{done.stdout[-3000:]}", file=sys.stderr)
        return 1
    print(f"settings: {conf or 'Spark defaults'}")
    print(f"stage failed after {failed.group(1)} s (BarrierJobSlotsNumberCheckFailed); spark-submit took {wall:.1f} s")
    print(f"load average (1 min) {os.getloadavg()[0]:.1f}, on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
