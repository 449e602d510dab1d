"""Why a failed task failed: the exception its traceback ends with."""

from __future__ import annotations

import traceback

import pytest

from include.tracebacks import exception_line, final_exception
from pipeline.config import ConfigError

CHAINED = """Traceback (most recent call last):
  File "/srv/gpt-pipeline/dags/gpt_pipeline.py", line 158, in run_local_stage
    local_spark.submit_stage(stage, config, run_dir, code_dir)
include.local_spark.StageFailed: stage tokenize failed with exit code 2: corpus file x.txt is empty

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/srv/gpt-pipeline/dags/gpt_pipeline.py", line 161, in run_local_stage
    raise AirflowFailException(str(error)) from error
    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
airflow.sdk.exceptions.AirflowFailException: stage tokenize failed with exit code 2: corpus file x.txt is empty
"""


def test_the_last_exception_of_a_chain_is_the_reason_and_airflows_own_name_is_left_out():
    assert final_exception(CHAINED.splitlines()) == "stage tokenize failed with exit code 2: corpus file x.txt is empty"


def test_the_projects_exception_keeps_its_name_without_the_module():
    lines = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "pipeline.config.ConfigError: data.stride: 0",
    ]
    assert final_exception(lines) == "ConfigError: data.stride: 0"


def test_a_message_of_several_lines_is_joined_into_one():
    lines = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "ValueError: two problems:",
        "data.stride: 0",
    ]
    assert final_exception(lines) == "ValueError: two problems: data.stride: 0"


def test_an_exception_without_a_message_is_its_name():
    assert final_exception(["Traceback (most recent call last):", '  File "a.py", line 1', "KeyboardInterrupt"]) == (
        "KeyboardInterrupt"
    )


def test_no_traceback_no_reason():
    assert final_exception([]) is None
    assert final_exception(["Traceback (most recent call last):", '  File "a.py", line 1, in f']) is None


def raised(error: BaseException, cause: BaseException | None = None) -> BaseException:
    """`error` as raised (from `cause`), with its traceback."""
    try:
        raise error from cause
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(
    "error",
    [
        raised(ConfigError("data.stride: 0")),
        raised(RuntimeError("stage tokenize failed"), cause=raised(ValueError("the corpus is empty"))),
        raised(ValueError("two problems:\ndata.stride: 0")),
        raised(KeyboardInterrupt()),
    ],
    ids=["project", "chained", "several-lines", "no-message"],
)
def test_an_exceptions_own_line_is_the_one_its_printed_traceback_ends_with(error):
    """What a failure callback gets (the exception) gives the line the task's log gives `make run`."""
    printed = "".join(traceback.format_exception(error)).splitlines()
    assert exception_line(error) == final_exception(printed)
