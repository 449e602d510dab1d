"""What `make run` and `make rehearse` show of `airflow dags test`, whose every line goes to a log file.

The console gets a line as each task starts and one as it ends (its state and seconds), the
training progress, the stages' WARNING and ERROR lines, and the warnings and errors Airflow's tasks
log; Airflow's, Spark's and TensorFlow's other output (a few hundred lines, many of them several
hundred characters wide) goes only to the log, whose path is printed first. Verbose: every line
on the console too. The console gets each line printable (pipeline.log.printable): a stage's
output (a generated sample) cannot drive the terminal.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from pipeline.errors import cut
from pipeline.log import printable

START, END, SHOW = "start", "end", "show"
RESCHEDULED = "up_for_reschedule"  # the state of a sensor between its pokes (reschedule mode)
WIDTH = 200  # Airflow's lines are cut to this on the console; the stages' own lines are not

TASK_START = re.compile(r"\[DAG TEST\] starting task_id=(\S+)")
TASK_END = re.compile(r"\[DAG TEST\] end task task_id=(\S+)")
# The stages' lines (pipeline/log.py): the chief's training progress, and any warning or error.
STAGE_LINE = re.compile(r"(\[train\] step \d|(NOTE|WARNING|ERROR) \[\w+\] )")
# An Airflow line: `<time> [<level>] <event> [<logger>] key=value ...`. An event of several
# lines names its logger on its last; the lines before it stay in the log.
AIRFLOW_LINE = re.compile(r"\S+ \[(?P<level>\w+) *\] (?P<event>.*?) \[(?P<logger>[\w.]+)\](?: .*)?$")
PROBLEM_LEVELS = {"warning", "error", "critical"}
# Python's warnings (a missing graphviz, deprecations) are about the libraries, not the run;
# after a failed task, `dags test` says every second that the tasks after it cannot run.
QUIET_LOGGERS = {"py.warnings"}
QUIET_EVENTS = re.compile(r"No tasks to run\. ")
# The EMR step sensor's progress of a running stage (include/emr_tasks.py describe_progress).
STEP_PROGRESS = re.compile(r"\w+: step [\d,]+ of ")


def classify(line: str) -> tuple[str | None, str]:
    """What the console shows of a line of `airflow dags test`'s output: (START or END, the task's
    id), (SHOW, the text to show), or (None, "") for a line only the log keeps."""
    line = line.rstrip("\n")
    for kind, pattern in ((START, TASK_START), (END, TASK_END)):
        found = pattern.search(line)
        if found:
            return kind, found.group(1)
    if STAGE_LINE.match(line):
        return SHOW, line
    airflow = AIRFLOW_LINE.match(line)
    if not airflow or airflow.group("logger") in QUIET_LOGGERS or QUIET_EVENTS.match(airflow.group("event")):
        return None, ""
    level, event = airflow.group("level"), airflow.group("event").rstrip()
    if level in PROBLEM_LEVELS:
        return SHOW, shortened(f"{level.upper()} {event}")
    if STEP_PROGRESS.match(event):
        return SHOW, shortened(event)
    return None, ""


def shortened(text: str) -> str:
    return cut(text, WIDTH)


class Console:
    """Takes a command's output line by line: every line to the log, what classify keeps (every
    line when verbose) to the console, with each task's state, read when it ends, and its seconds."""

    def __init__(
        self,
        log: TextIO,
        task_state: Callable[[str], str],
        verbose: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log, self.task_state, self.verbose, self.clock = log, task_state, verbose, clock
        self.started: dict[str, float] = {}

    def __call__(self, line: str) -> None:
        if self.log.closed:  # a process that outlived the command, still writing to the pipe
            return
        self.log.write(line if line.endswith("\n") else line + "\n")
        self.log.flush()  # the log is there to be read while the run goes on (tail -f)
        shown = line.rstrip("\n") if self.verbose else self.shown(line)
        if shown is not None:
            print(printable(shown), flush=True)  # sys.stdout at each line: what a test captures

    def shown(self, line: str) -> str | None:
        kind, text = classify(line)
        if kind == START:
            if text in self.started:  # a sensor in reschedule mode, poking again
                return None
            self.started[text] = self.clock()
            return f"task {text:<18} started"
        if kind == END:
            state = self.task_state(text)
            if state == RESCHEDULED:  # one line when it is done, not one a poke
                return None
            now = self.clock()
            seconds = now - self.started.pop(text, now)
            return f"task {text:<18} {state:<14} {seconds:,.0f} s"
        return text if kind == SHOW else None


def log_path(home: Path, command: str) -> Path:
    """logs/<command>-<UTC time>.log in Airflow's home, beside Airflow's own task logs."""
    return home / "logs" / f"{command}-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.log"


@contextmanager
def teed(path: Path, task_state: Callable[[str], str], verbose: bool = False) -> Iterator[Console]:
    """A Console writing to the log file at `path`, whose path it prints first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as log:
        print(f"{'full log:':<18}{path}", flush=True)
        yield Console(log, task_state, verbose)


def print_log_path(path: Path) -> None:
    """The log's path again, after a failure, on stderr with the error line that follows it."""
    print(f"{'full log:':<18}{path}", file=sys.stderr, flush=True)
