"""`make run` timed task by task: the whole DAG with `airflow dags test`, as the run command runs it.

    .venv/bin/python -m benchmarks.dag_run [--corpus C] [--set section.key=value ...]

Uses a fresh Airflow home in a temporary folder and a moto S3 server, like `make run`, then prints
each task's wall time from Airflow's metadata database, the Airflow start-up before the first task,
the training throughput from stats/train.json, and the whole command's time. Goal: the default
run on the whole tinyshakespeare in <= 5 minutes on 2 cores. Other processes on the machine slow
every figure: the 1-minute load average before and after is printed with them.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from include.airflow_names import DAG_ID
from local_platform import deployment_file
from local_platform.airflow_home import prepare
from local_platform.dag_test import dags_test, read_report
from local_platform.moto_s3 import LocalS3
from pipeline.config_files import defaults_path, load_config, read_yaml
from pipeline.overrides import add_set_argument

GOAL_S = 300


def task_times(db_path: Path) -> tuple[datetime, list[tuple[str, float, datetime]]]:
    """The newest run's start, and (task, seconds, start) for each of its tasks in start order."""
    with sqlite3.connect(db_path) as db:
        run_id, run_start = db.execute(
            "SELECT run_id, start_date FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", (DAG_ID,)
        ).fetchone()
        rows = db.execute(
            "SELECT task_id, start_date, end_date FROM task_instance WHERE run_id = ? ORDER BY start_date", (run_id,)
        ).fetchall()
    parse = datetime.fromisoformat
    return parse(run_start), [
        (task, (parse(end) - parse(start)).total_seconds(), parse(start)) for task, start, end in rows
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus")
    add_set_argument(parser)
    args = parser.parse_args(argv)
    corpus = [{"corpus": args.corpus}] if args.corpus else []
    config = load_config(overrides=args.overrides + corpus)
    deployers, runs = deployment_file.split(args.overrides)

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpt-pipeline-bench-airflow-") as home, LocalS3((config.s3.bucket,)) as s3:
        deployment = deployment_file.write(
            Path(home) / "pipeline.yaml", read_yaml(defaults_path()), args.corpus, deployers
        )
        env = prepare(Path(home), s3) | {"GPT_PIPELINE_CONFIG": str(deployment)}
        if not dags_test(env, {"overrides": runs}):
            print("the DAG run failed", file=sys.stderr)
            return 1
        total_s = time.perf_counter() - started
        report = read_report(s3, config)
        run_start, tasks = task_times(Path(home) / "airflow.db")

    print(f"\n{'task':<18}{'seconds':>9}")
    for task, seconds, _ in tasks:
        print(f"{task:<18}{seconds:>9.1f}")
    print(f"{'tasks':<18}{sum(seconds for _, seconds, _ in tasks):>9.1f}")
    print(f"first task started {(tasks[0][2] - run_start).total_seconds():.1f} s after the run was created")
    train = report["train"]
    print(
        f"train: {train['steps']} steps, {train['tokens_per_s']:,.0f} tokens/s, {train['train_wall_s']:.0f} s "
        "in the loop"
    )
    print(f"final val loss {report['final_val_loss']:.4f} nats/token, {report['val_nats_per_char']:.4f} nats/char")
    print(
        f"whole command (Airflow DB set-up, moto, dags test): {total_s:.0f} s; goal <= {GOAL_S} s: "
        f"{'met' if total_s <= GOAL_S else 'not met'}"
    )
    print(f"load average (1 min) before {load_before:.1f}, after {os.getloadavg()[0]:.1f}, on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
