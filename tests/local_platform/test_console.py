"""The console of `make run` and `make rehearse`: which lines of `airflow dags test` it shows, and
the log file that keeps them all, and why a failed run failed. dags_test_failed.txt is a real
transcript (a run whose corpus looks binary), trimmed, its paths shortened; so are
dags_test_corpus_refused.txt and dags_test_setting_refused.txt, from `make rehearse` runs whose
validate_config refused a corpus that is not UTF-8 text and a setting a run cannot change."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from local_platform import console, run_summary
from local_platform.airflow_command import run_stoppable
from local_platform.airflow_home import airflow_env
from local_platform.moto_s3 import LocalS3

TRANSCRIPT = Path(__file__).with_name("dags_test_failed.txt")
CORPUS_REFUSED = Path(__file__).with_name("dags_test_corpus_refused.txt")
SETTING_REFUSED = Path(__file__).with_name("dags_test_setting_refused.txt")
AIRFLOW = "2026-11-25T23:21:37.490529Z [info     ] "
AIRFLOW_FAIL = "airflow.sdk.exceptions.AirflowFailException: "


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            f"{AIRFLOW}[DAG TEST] starting task_id=tokenize map_index=-1 [airflow.sdk.definitions.dag] loc=dag.py:1\n",
            (console.START, "tokenize"),
        ),
        (
            f"{AIRFLOW}[DAG TEST] end task task_id=prune_runs map_index=-1 [airflow.sdk.definitions.dag] loc=dag.py:2",
            (console.END, "prune_runs"),
        ),
        (
            "[train] step 20/40 loss 5.1234 12,345 tokens/s\n",
            (console.SHOW, "[train] step 20/40 loss 5.1234 12,345 tokens/s"),
        ),
        (
            "[train] step 20: val loss 5.2000, 2.1000 nats/char",
            (console.SHOW, "[train] step 20: val loss 5.2000, 2.1000 nats/char"),
        ),
        ("WARNING [window] 3 windows dropped", (console.SHOW, "WARNING [window] 3 windows dropped")),
        ("NOTE [window] read from disk", (console.SHOW, "NOTE [window] read from disk")),
        ("ERROR [tokenize] corpus file x is empty", (console.SHOW, "ERROR [tokenize] corpus file x is empty")),
        ('[tokenize] done: {"duration_s": 6.5}', (None, "")),  # a stage's INFO line
        ("[train] worker 1 of 2 started", (None, "")),
        ("26/11/25 23:22:47 WARN Utils: Service 'SparkUI' could not bind on port 4040.", (None, "")),
        ("WARNING: Using incubator modules: jdk.incubator.vector", (None, "")),
        (
            f"{AIRFLOW}Task instance state updated    [airflow.api_fastapi.execution_api.routes.task_instances] x=1",
            (None, ""),
        ),
        (
            "2026-11-25T23:24:56.236577Z [error    ] Task failed with exception     [task] loc=task_runner.py:1639",
            (console.FAILED, ""),
        ),
        (
            "2026-11-25T23:24:56.236577Z [warning  ] keep_runs: left s3://b/r alone: denied [include.prune] loc=p:5",
            (console.SHOW, "WARNING keep_runs: left s3://b/r alone: denied"),
        ),
        (
            f"{AIRFLOW}train: step 1,200 of 3,000 (40%), loss 3.2100, 25,000 tokens/s, about 12 min left "
            "(at 2026-11-25T23:21:37Z) [airflow.task.operators.include.emr_tasks.StageSensor] loc=emr_tasks.py:118",
            (
                console.PROGRESS,
                "train: step 1,200 of 3,000 (40%), loss 3.2100, 25,000 tokens/s, about 12 min left "
                "(at 2026-11-25T23:21:37Z)",
            ),
        ),
        (
            "2026-11-25T23:24:56.496688Z [warning  ] No tasks to run. unrunnable tasks: {<TaskInstance: x>} "
            "[airflow.sdk.definitions.dag] loc=dag.py:1424",
            (None, ""),
        ),
        (  # the first line of a warning of several lines; the last names py.warnings
            "2026-11-25T23:20:18.856061Z [warning  ] Could not import graphviz. Rendering graph to the graphical",
            (None, ""),
        ),
        (
            "2026-11-25T23:20:18.856061Z [warning  ] Could not import graphviz. [py.warnings] category=UserWarning",
            (None, ""),
        ),
    ],
)
def test_classify_keeps_task_starts_and_ends_progress_warnings_and_errors(line, expected):
    assert console.classify(line) == expected


def test_airflow_lines_are_cut_to_the_width_and_the_stages_own_are_not():
    event = "x" * 300
    kind, text = console.classify(f"{AIRFLOW.replace('info    ', 'error   ')}{event} [task] loc=a.py:1")
    assert kind == console.SHOW and len(text) == console.WIDTH and text.endswith("…")
    assert console.classify(f"ERROR [train] {event}") == (console.SHOW, f"ERROR [train] {event}")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 7
        return self.now


def fed(transcript: Path, verbose: bool = False) -> tuple[console.Console, io.StringIO]:
    """A Console that read the transcript, and its log."""
    log = io.StringIO()
    states = {"validate_config": "failed" if transcript != TRANSCRIPT else "success", "tokenize": "failed"}
    output = console.Console(log, states.__getitem__, verbose, clock=Clock())
    for line in transcript.read_text().splitlines(keepends=True):
        output(line)
    return output, log


def feed(verbose: bool, capsys) -> tuple[str, str]:
    """The transcript through a Console: (what the log got, what the console got)."""
    _, log = fed(TRANSCRIPT, verbose)
    return log.getvalue(), capsys.readouterr().out


def test_the_log_gets_every_line_and_the_console_the_tasks_and_the_stages_error(capsys):
    log, shown = feed(False, capsys)
    assert log == TRANSCRIPT.read_text()
    (raised,) = [line for line in log.splitlines() if line.startswith(AIRFLOW_FAIL)]
    assert shown.splitlines() == [
        "task validate_config    started",
        "task validate_config    success        7 s",
        "task tokenize           started",
        "ERROR [tokenize] corpus file file:///tmp/runs/bad.txt looks binary (NUL byte at offset 10000); "
        "set data.bad_files=skip to leave such files out",
        console.shortened(f"ERROR tokenize failed: {raised.removeprefix(AIRFLOW_FAIL)}"),  # the traceback's end
        "task tokenize           failed         7 s",
    ]
    assert "Traceback" not in shown and "File " not in shown


CORPUS_REASON = (
    "PipelineError: corpus file s3://gpt-pipeline-rehearsal/corpus/latin1.txt is not UTF-8 text (byte 0xe7 at offset "
    "6); convert it first, from its encoding (iconv -f WINDOWS-1252 -t UTF-8 for most Western European text); set "
    "data.bad_files=skip to leave such files out"
)
SETTING_REASON = (
    "ConfigError: s3.prefix: this DAG's s3.prefix is 'runs', read from pipeline-rehearsal.yaml when Airflow parses "
    "the DAG; a run cannot change it (got 'elsewhere'): edit pipeline-rehearsal.yaml"
)


@pytest.mark.parametrize("transcript, reason", [(CORPUS_REFUSED, CORPUS_REASON), (SETTING_REFUSED, SETTING_REASON)])
def test_a_task_that_raised_shows_its_exception_and_keeps_it_for_the_last_line(transcript, reason, capsys):
    output, _ = fed(transcript)
    shown = capsys.readouterr().out.splitlines()
    assert shown[-2:] == [
        console.shortened(f"ERROR validate_config failed: {reason}"),
        "task validate_config    failed         7 s",
    ]
    assert "Traceback (most recent call last):" not in shown and "ERROR Task failed with exception" not in shown
    assert output.failure() == ("validate_config", reason)


def test_verbose_keeps_the_reason_too(capsys):
    output, _ = fed(SETTING_REFUSED, verbose=True)
    assert output.failure() == ("validate_config", SETTING_REASON)


def test_a_failed_run_ends_with_the_log_and_the_first_failed_tasks_reason(tmp_path, capsys):
    output, _ = fed(CORPUS_REFUSED)
    capsys.readouterr()
    console.print_failure(tmp_path / "rehearse.log", output, "rehearsal")
    assert capsys.readouterr().err == (
        f"full log:         {tmp_path / 'rehearse.log'}\n"
        f"ERROR the gpt_pipeline rehearsal failed in task validate_config: {CORPUS_REASON}\n"
    )


def test_without_a_reason_the_last_line_points_at_the_log(tmp_path, capsys):
    console.print_failure(tmp_path / "run.log", console.Console(io.StringIO(), lambda task: "failed"), "run")
    assert capsys.readouterr().err.endswith("ERROR the gpt_pipeline run failed; see the task logs in the full log\n")


def test_a_task_that_failed_and_then_succeeded_on_its_retry_is_not_the_reason(capsys):
    states = iter(["up_for_retry", "success"])
    output = console.Console(io.StringIO(), lambda task: next(states))
    for _ in range(2):
        output(f"{AIRFLOW}[DAG TEST] starting task_id=collect map_index=-1 [airflow.sdk.definitions.dag] loc=dag.py:1")
        output("2026-11-25T23:24:56.236577Z [error    ] Task failed with exception     [task] loc=task_runner.py:1639")
        output("Traceback (most recent call last):\n")
        output('  File "/srv/include/record.py", line 3, in collect\n')
        output("botocore.exceptions.EndpointConnectionError: Could not connect to the endpoint URL\n")
        output(f"{AIRFLOW}[DAG TEST] end task task_id=collect map_index=-1 [airflow.sdk.definitions.dag] loc=dag.py:2")
    assert "ERROR collect failed: EndpointConnectionError: Could not connect" in capsys.readouterr().out
    assert output.failure() is None


def test_the_step_sensors_progress_is_shown_once_per_change(capsys):
    output = console.Console(io.StringIO(), lambda task: "up_for_reschedule")
    logger = "[airflow.task.operators.include.emr_tasks.EmrStageSensor] loc=emr_tasks.py:234"
    progress = [
        "train: step 100 of 300 (33%), loss 5.1000, 900 tokens/s, about 2 min left (at 2026-11-25T23:21:37Z)",
        "train: step 100 of 300 (33%), loss 5.1000, 900 tokens/s, about 2 min left (at 2026-11-25T23:21:37Z)",
        "train: step 100 of 300 (33%), loss 5.1000, 900 tokens/s, about 2 min left (at 2026-11-25T23:21:37Z)",
        "train: step 200 of 300 (67%), loss 4.2000, 900 tokens/s, about 1 min left (at 2026-11-25T23:22:37Z)",
        "train: step 200 of 300 (67%), loss 4.2000, 900 tokens/s, about 1 min left (at 2026-11-25T23:22:37Z)",
    ]
    for event in progress:  # one poke each
        output(f"{AIRFLOW}[DAG TEST] starting task_id=train map_index=-1 [airflow.sdk.definitions.dag] loc=dag.py:1")
        output(f"{AIRFLOW}{event} {logger}")
        output(f"{AIRFLOW}[DAG TEST] end task task_id=train map_index=-1 [airflow.sdk.definitions.dag] loc=dag.py:2")
    assert capsys.readouterr().out.splitlines() == ["task train              started", progress[0], progress[3]]


def test_a_sensor_poking_again_gets_one_start_and_one_end_line_and_a_retry_two(capsys):
    states = iter(["up_for_reschedule", "up_for_reschedule", "success", "up_for_retry", "success"])
    now = [0.0]
    output = console.Console(io.StringIO(), lambda task: next(states), clock=lambda: now[0])
    for number, task in enumerate(["wait_train"] * 3 + ["collect"] * 2):
        now[0] = 10.0 * number
        output(f"{AIRFLOW}[DAG TEST] starting task_id={task} map_index=-1 [airflow.sdk.definitions.dag] loc=dag.py:1")
        now[0] += 5
        output(f"{AIRFLOW}[DAG TEST] end task task_id={task} map_index=-1 [airflow.sdk.definitions.dag] loc=dag.py:2")
    assert capsys.readouterr().out.splitlines() == [
        "task wait_train         started",
        "task wait_train         success        25 s",  # from its first start to its last end
        "task collect            started",
        "task collect            up_for_retry   5 s",
        "task collect            started",
        "task collect            success        5 s",
    ]


def test_verbose_shows_every_line_on_the_console_too(capsys):
    log, shown = feed(True, capsys)
    assert shown == log == TRANSCRIPT.read_text()


def test_teed_names_its_log_first_and_closes_it(tmp_path, capsys):
    path = console.log_path(tmp_path / "home", "run")
    assert path.parent == tmp_path / "home" / "logs" and path.name.startswith("run-") and path.suffix == ".log"
    with console.teed(path, lambda task: "success") as output:
        assert capsys.readouterr().out == f"full log:         {path}\n"
        output("26/11/25 23:22:21 INFO SparkContext: Running Spark version 3.5.9\n")
        output("[train] step 1/2 loss 6.0000 10 tokens/s\n")
    assert capsys.readouterr().out == "[train] step 1/2 loss 6.0000 10 tokens/s\n"
    assert path.read_text() == (
        "26/11/25 23:22:21 INFO SparkContext: Running Spark version 3.5.9\n[train] step 1/2 loss 6.0000 10 tokens/s\n"
    )
    output("a line from a process that outlived the command\n")  # dropped, not an error


@pytest.mark.slow
def test_airflows_output_reaches_the_output_line_by_line_through_the_pipe(tmp_path, capfd):
    """run_stoppable with an output: the real `airflow` command's stdout and stderr, each line to
    it, none to this command's."""
    lines: list[str] = []
    with LocalS3() as s3:
        env = airflow_env(tmp_path / "home", s3)
        (tmp_path / "home" / "tmp").mkdir(parents=True)
        assert run_stoppable(env, "no-such-command", grace_s=5, output=lines.append) != 0
    assert any("invalid choice: 'no-such-command'" in line for line in lines), lines  # argparse's, on stderr
    assert all(line.endswith("\n") for line in lines)
    assert capfd.readouterr() == ("", "")


# A sample a model could write: a new window title, a cleared screen, a C1 colour, a line overwritten.
HOSTILE = "ROMEO: \x1b]0;owned\x07\x1b[2J\x9b31mhark\rthee,\tJuliet"
HARMLESS = "ROMEO: \\x1b]0;owned\\x07\\x1b[2J\\x9b31mhark\\x0dthee,\tJuliet"


@pytest.mark.parametrize("verbose", [False, True])
def test_the_console_shows_control_characters_as_escapes_and_the_log_keeps_them(capsys, verbose):
    log = io.StringIO()
    console.Console(log, lambda task: "success", verbose)(f"WARNING [generate] {HOSTILE}\n")
    assert capsys.readouterr().out == f"WARNING [generate] {HARMLESS}\n"
    assert log.getvalue() == f"WARNING [generate] {HOSTILE}\n"


def test_the_run_summary_prints_the_sample_with_control_characters_as_escapes(capsys):
    report = {
        "run_folder": "s3://lake/runs/r",
        "s3_uri": "s3://b/runs/r/",
        "final_val_loss": 4.4,
        "val_nats_per_char": 1.7,
        "warnings": [],
        "sample": f"{HOSTILE}\nJULIET: ay me",
    }
    run_summary.print_report(report, "s3://b/runs/latest/r.json", {"model": "s3://b/runs/r/model/"})
    assert capsys.readouterr().out.endswith(f"generated sample:\n{HARMLESS}\nJULIET: ay me\n")
