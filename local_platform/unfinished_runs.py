"""Fail the runs an interrupted `make run` or `make airflow` left unfinished in this checkout's
Airflow home, so that Airflow neither resumes them later nor queues new runs behind them
(the DAG allows one active run).

    AIRFLOW_HOME=... python -m local_platform.unfinished_runs DAG_ID [RUN_ID ...]

local_platform/airflow_home.py runs it, with the home's environment, while it holds the home, so no
other command can be running them. It marks each run failed as the UI's "Mark as failed" does:
unfinished task instances become failed or skipped.
"""

from __future__ import annotations

import sys


def fail_runs(dag_id: str, run_ids: list[str]) -> None:
    from airflow.api.common.mark_tasks import set_dag_run_state_to_failed
    from airflow.models.dagbag import DBDagBag
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from sqlalchemy import select

    with create_session() as session:
        for run in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id.in_(run_ids))):
            dag = DBDagBag().get_dag_for_run(run, session=session)
            if dag is None:  # its DAG is no longer serialized: only the run's own state can change
                run.set_state(DagRunState.FAILED)
            else:
                set_dag_run_state_to_failed(dag=dag, run_id=run.run_id, commit=True, session=session)


if __name__ == "__main__":
    fail_runs(sys.argv[1], sys.argv[2:])
