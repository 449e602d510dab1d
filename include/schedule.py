"""The retraining schedule of pipeline.yaml's `schedule:` as an Airflow timetable.

Checked by the DAG when Airflow parses it, and by `make run` and `make airflow` before Airflow
starts: a DAG that fails to parse only leaves its reason in the DAG processor's log.
"""

from __future__ import annotations

from datetime import timedelta

from pipeline.config import ConfigError
from pipeline.errors import shown


def cron_timetable(schedule: str):
    """A cron expression or a preset such as @weekly, in UTC; ConfigError names a bad one."""
    from airflow.sdk import CronTriggerTimetable
    from airflow.sdk.exceptions import AirflowTimetableInvalid

    # A zero run_immediately: the first run is the next time, never a past one. Airflow 3.3 takes the
    # default (False) as None, which runs a time up to a tenth of the interval (at least 5 minutes)
    # past at once: with @daily a DAG deployed at 02:00 would start a run (on EMR a cluster) there.
    timetable = CronTriggerTimetable(schedule, timezone="UTC", run_immediately=timedelta(0))
    try:
        timetable.validate()
    except AirflowTimetableInvalid as error:
        raise ConfigError(
            f"invalid configuration: schedule: {error} (got {shown(schedule)}); it takes a cron expression such as "
            "'0 3 * * 1' (UTC), a preset such as @daily or @weekly, or null for none"
        ) from None
    return timetable
