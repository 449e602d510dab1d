"""Airflow's home on this machine, shared by the local commands (`make run`, `make airflow`,
`make rehearse`): one command at a time holds it (its SQLite database takes one), and each starts
with a migrated database, an empty scratch folder and no run an interrupted command left running.

Airflow's home is airflow_home/ in the checkout; tests give the commands one of their own through
GPT_PIPELINE_AIRFLOW_HOME.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from include import locks
from include.airflow_names import DAG_ID
from local_platform.moto_s3 import LocalS3
from pipeline.config import REPO_ROOT

AIRFLOW_HOME = Path(os.environ.get("GPT_PIPELINE_AIRFLOW_HOME") or REPO_ROOT / "airflow_home")
AIRFLOW = Path(sys.executable).parent / "airflow"

Output = Callable[[str], None]  # takes a command's output line by line (a console.Console)


def airflow_env(home: Path, s3: LocalS3) -> dict[str, str]:
    """Environment for Airflow commands: this checkout's DAG, a SQLite DB in `home`, the moto S3."""
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            # The DAG imports include/, pipeline/ and spark_jobs/ from the repository root.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            # `airflow standalone` starts its components as `airflow ...` from the PATH.
            "PATH": os.pathsep.join(filter(None, [str(AIRFLOW.parent), os.environ.get("PATH")])),
            # The tasks' temporary files and Spark's folders, in the home rather than /tmp: what a
            # stopped command leaves there goes when the next one starts (fresh_scratch).
            "TMPDIR": str(scratch_dir(home)),
            "SPARK_LOCAL_DIRS": str(scratch_dir(home)),
        }
    )
    return s3.isolated_env(env)


def scratch_dir(home: Path) -> Path:
    return home / "tmp"


def fresh_scratch(home: Path) -> None:
    """An empty scratch folder in the home. Called while holding the home, so no command uses it."""
    shutil.rmtree(scratch_dir(home), ignore_errors=True)
    scratch_dir(home).mkdir(parents=True)


def exclusive_home(home: Path, command: str):
    """Hold Airflow's home for one command: its SQLite database takes one `airflow dags test` or
    `airflow standalone` at a time."""
    return locks.held(
        home / "in-use.lock",
        f"`{command}`",
        lambda holder: (
            f"{home} is in use by {holder}; Airflow's SQLite database there takes one command at a time: "
            "wait for it or stop it (while `make airflow` runs, trigger runs from its UI)"
        ),
    )


def prepare(home: Path, s3: LocalS3, output: Output | None = None) -> dict[str, str]:
    """The environment for Airflow commands on `home`, whose database is migrated and holds no
    run an interrupted command left unfinished. Called while holding the home. The migration's
    output goes to `output` if given, else to this command's."""
    home.mkdir(parents=True, exist_ok=True)
    fresh_scratch(home)
    env = airflow_env(home, s3)
    piped = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True} if output else {}
    migrated = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, cwd=REPO_ROOT, **piped)
    for line in (migrated.stdout or "").splitlines():
        output(line)
    migrated.check_returncode()
    fail_unfinished_runs(home, env)
    return env


def unfinished_runs(home: Path) -> list[str]:
    """Runs of the DAG still running in the home's database. (Queued runs have not started: the
    scheduler of `make airflow` starts them as usual.)"""
    with closing(sqlite3.connect(home / "airflow.db")) as db:
        query = "SELECT run_id FROM dag_run WHERE dag_id = ? AND state = 'running' ORDER BY id"
        return [run_id for (run_id,) in db.execute(query, (DAG_ID,))]


def fail_unfinished_runs(home: Path, env: dict[str, str]) -> None:
    """Mark failed the runs an interrupted command left behind (Ctrl-C, a killed process): nothing
    runs them now that this command holds the home, and Airflow would otherwise resume them."""
    runs = unfinished_runs(home)
    if runs:
        print(f"marking as failed {len(runs)} run(s) an interrupted command left unfinished: {', '.join(runs)}")
        subprocess.run(
            [sys.executable, "-m", "local_platform.unfinished_runs", DAG_ID, *runs], env=env, cwd=REPO_ROOT, check=True
        )


def task_state(home: Path) -> Callable[[str], str]:
    """The state of a task in the newest run of the DAG in the home's database, as `dags test`
    left it when the task ended."""

    def state(task_id: str) -> str:
        query = (
            "SELECT task_instance.state FROM task_instance JOIN dag_run USING (dag_id, run_id) "
            "WHERE task_instance.dag_id = ? AND task_id = ? ORDER BY dag_run.id DESC LIMIT 1"
        )
        try:
            with closing(sqlite3.connect(home / "airflow.db", timeout=30)) as db:
                found = db.execute(query, (DAG_ID, task_id)).fetchone()
        except sqlite3.Error as error:
            return f"state unread ({error})"
        return found[0] if found and found[0] else "ended"

    return state
