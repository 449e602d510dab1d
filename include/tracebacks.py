"""The exception a Python traceback ends with, as a failed Airflow task's log prints it: why the
task failed, in one line (`ConfigError: data.stride: …`). `make run`'s console reads it from the
task's log (local_platform/console.py), the failure alert from the exception itself (include/alerts.py)."""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterable

# Lines between the exceptions of a chain; frames, code and carets are indented.
SEPARATORS = (
    "Traceback (most recent call last):",
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
EXCEPTION = re.compile(r"(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*)(?::\s?(?P<message>.*))?$")
# Airflow's own exceptions only say that the task failed: their message is the reason.
WRAPPERS = {"AirflowFailException", "AirflowException"}


def final_exception(lines: Iterable[str]) -> str | None:
    """'Name: message' of the exception raised last (the lines of a message of several lines
    joined), its module path left out; None when the lines end with no exception."""
    last: list[str] = []
    reading = False
    for line in lines:
        text = line.rstrip("\n")
        if not text.strip() or text.startswith((" ", "\t")) or text.startswith(SEPARATORS):
            reading = False
            continue
        if not reading:
            last, reading = [], True
        last.append(text.strip())
    if not last:
        return None
    found = EXCEPTION.match(last[0])
    if not found:
        return " ".join(last)
    message = " ".join([found.group("message") or "", *last[1:]]).strip()
    if found.group("name") in WRAPPERS and message:
        return message
    return f"{found.group('name')}: {message}" if message else found.group("name")


def exception_line(error: BaseException) -> str:
    """final_exception's line of an exception object, as its traceback would end."""
    return final_exception("".join(traceback.format_exception_only(error)).splitlines()) or type(error).__name__
