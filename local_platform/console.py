"""What `make run` and `make rehearse` show of `airflow dags test`, whose every line goes to a log file.

The console gets a line as each task starts and one as it ends (its state and seconds), the
training progress (once per change: a sensor logs it at each poke), the stages' WARNING and ERROR
lines, the warnings and errors Airflow's tasks log, and why a task failed: the exception its
traceback ends with (include/tracebacks.py), which a failed run's last line repeats. Airflow's, Spark's
and TensorFlow's other output (a few hundred lines, many of them several hundred characters wide)
goes only to the log, whose path is printed first. Verbose: every line on the console too. The
console gets each line printable (pipeline.log.printable): a stage's output (a generated sample)
cannot drive the terminal.
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

from include.airflow_names import DAG_ID
from include.tracebacks import final_exception
from pipeline.errors import cut
from pipeline.log import printable

START, END, SHOW, PROGRESS, FAILED = "start", "end", "show", "progress", "failed"
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
# Airflow's error event before a failed task's traceback.
TASK_FAILED = "Task failed with exception"


def classify(line: str) -> tuple[str | None, str]:
    """What the console shows of a line of `airflow dags test`'s output: (START or END, the task's
    id), (SHOW or PROGRESS, the text to show), (FAILED, "") for the event a failed task's traceback
    follows, or (None, "") for a line only the log keeps."""
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
    if level == "error" and event == TASK_FAILED:
        return FAILED, ""
    if level in PROBLEM_LEVELS:
        return SHOW, shortened(f"{level.upper()} {event}")
    if STEP_PROGRESS.match(event):
        return PROGRESS, shortened(event)
    return None, ""


def shortened(text: str) -> str:
    return cut(text, WIDTH)


class Console:
    """Takes a command's output line by line: every line to the log, what classify keeps (every
    line when verbose) to the console, with each task's state, read when it ends, and its seconds.
    Keeps why each task that has not succeeded failed (`failure`)."""

    def __init__(
        self,
        log: TextIO,
        task_state: Callable[[str], str],
        verbose: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log, self.task_state, self.verbose, self.clock = log, task_state, verbose, clock
        self.started: dict[str, float] = {}
        self.running: str | None = None
        self.traceback: list[str] | None = None  # the lines of a failed task's traceback, while they come
        self.reasons: dict[str, str] = {}  # task: why it failed, in the order the tasks failed
        self.last_progress = ""

    def __call__(self, line: str) -> None:
        if self.log.closed:  # a process that outlived the command, still writing to the pipe
            return
        self.log.write(line if line.endswith("\n") else line + "\n")
        self.log.flush()  # the log is there to be read while the run goes on (tail -f)
        shown = self.shown(line)  # read when verbose too: it keeps the reasons
        for text in [line.rstrip("\n")] if self.verbose else shown:
            print(printable(text), flush=True)  # sys.stdout at each line: what a test captures

    def shown(self, line: str) -> list[str]:
        if self.traceback is not None:
            if not AIRFLOW_LINE.match(line.rstrip("\n")):
                self.traceback.append(line)
                return []
            return self.failed() + self.shown(line)
        kind, text = classify(line)
        if kind == FAILED:
            self.traceback = []
            return []
        if kind == START:
            return self.task_started(text)
        if kind == END:
            return self.task_ended(text)
        if kind == PROGRESS:
            if text == self.last_progress:  # the same progress, read again by the next poke
                return []
            self.last_progress = text
        return [text] if kind in (SHOW, PROGRESS) else []

    def failed(self) -> list[str]:
        """The line that says why the running task failed, at the end of its traceback."""
        reason, self.traceback = final_exception(self.traceback or []), None
        if reason is None:
            return [f"ERROR {TASK_FAILED}"]
        task = self.running or "a task"
        self.reasons.pop(task, None)  # a retry's reason goes after the reasons of the tasks failed meanwhile
        self.reasons[task] = reason
        return [shortened(f"ERROR {task} failed: {reason}")]

    def task_started(self, task: str) -> list[str]:
        self.running = task
        if task in self.started:  # a sensor in reschedule mode, poking again
            return []
        self.started[task] = self.clock()
        return [f"task {task:<18} started"]

    def task_ended(self, task: str) -> list[str]:
        state = self.task_state(task)
        if state == "success":
            self.reasons.pop(task, None)  # it failed before and its retry succeeded
        if state == RESCHEDULED:  # one line when it is done, not one a poke
            return []
        now = self.clock()
        seconds = now - self.started.pop(task, now)
        return [f"task {task:<18} {state:<14} {seconds:,.0f} s"]

    def failure(self) -> tuple[str, str] | None:
        """(task, why it failed) of the first task that failed and was not retried with success."""
        return next(iter(self.reasons.items()), None)


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


def print_failure(path: Path, output: Console, command: str) -> None:
    """After a failed DAG run (`command`: run, rehearsal): the log's path, then the reason the first
    failed task gave, the line to act on."""
    print_log_path(path)
    failed = output.failure()
    where = f" in task {failed[0]}: {failed[1]}" if failed else "; see the task logs in the full log"
    print(printable(f"ERROR the {DAG_ID} {command} failed{where}"), file=sys.stderr, flush=True)
