"""The stage applications' log lines, set up once per process by `setup(stage)`:

    [tokenize] done: {...}                      INFO, on stdout
    NOTE [tokenize] window read this stage's…   NOTE (between INFO and WARNING), on stderr
    WARNING [tokenize] skipping corpus file …   WARNING, on stderr
    ERROR [tokenize] corpus file … is empty     ERROR, on stderr

One line per record, the stage's name in each. The ERROR line is what a failed stage leaves in an
EMR step's stderr and what people read locally, so its shape does not change.

Modules log through `logging.getLogger(__name__)` (loggers under "spark_jobs" or "pipeline"); the stage comes
from setup, or from a record's own `extra={"stage": ...}`. The handlers look up sys.stdout and
sys.stderr at each line, not once, so that a test capturing them (capsys) sees the lines.
"""

from __future__ import annotations

import logging
import re
import sys

# The loggers whose records are the stage applications' lines: those of every module they run.
ROOTS = ("spark_jobs", "pipeline")
NOTE = logging.INFO + 5
logging.addLevelName(NOTE, "NOTE")


# The characters a terminal takes as commands (C0 but tab and line ends, DEL, C1): printed as
# they are, a model's or a file's text could clear the screen, retitle or recolour the terminal,
# or hide what it printed before (a carriage return not ending a line) or after.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]|\r(?!\n)")


def printable(text: str) -> str:
    """text as a terminal shows it harmlessly: each control character as its escape (ESC as \\x1b),
    tabs and line ends (\\n, \\r\\n) as they are."""
    return CONTROL_CHARACTERS.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


class CurrentStream(logging.StreamHandler):
    """A StreamHandler writing to whatever sys.stdout or sys.stderr is at the time of each line."""

    def __init__(self, name: str):
        self.stream_name = name
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self.stream_name)

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__ sets it: the current one is used instead
        pass


class StageName(logging.Filter):
    """Gives each record the stage it belongs to: its own `stage` extra, else the process's."""

    def __init__(self, stage: str):
        super().__init__()
        self.stage = stage

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "stage"):
            record.stage = self.stage
        return True


def setup(stage: str) -> logging.Logger:
    """Send the records of the spark_jobs and pipeline loggers to stdout (INFO) and stderr (NOTE and
    above) with the stage's name. Once per process; a later call (tests run several stages in one
    process) only names another stage. Returns the spark_jobs logger."""
    for root in ROOTS:
        install(logging.getLogger(root), stage)
    return logging.getLogger(ROOTS[0])


def install(logger: logging.Logger, stage: str) -> None:
    installed = [handler for handler in logger.handlers if isinstance(handler, CurrentStream)]
    if installed:
        for handler in installed:
            for name in handler.filters:
                if isinstance(name, StageName):
                    name.stage = stage
        return
    info = CurrentStream("stdout")
    info.addFilter(lambda record: record.levelno <= logging.INFO)
    info.setFormatter(logging.Formatter("[%(stage)s] %(message)s"))
    problems = CurrentStream("stderr")
    problems.setLevel(NOTE)
    problems.setFormatter(logging.Formatter("%(levelname)s [%(stage)s] %(message)s"))
    for handler in (info, problems):
        handler.addFilter(StageName(stage))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # The lines are the application's output: not again through a handler someone put on the root
    # logger (pyspark, TensorFlow's absl).
    logger.propagate = False
