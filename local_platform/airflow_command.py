"""One Airflow command (`airflow dags test`, `airflow standalone`) run in the foreground by a
local command, and stopped with everything below it when that command is asked to stop."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

from local_platform import process_tree
from local_platform.airflow_home import AIRFLOW, Output
from pipeline.config import REPO_ROOT

READER_WAIT_S = 10  # after Airflow ends, how long its last lines may take to reach the output


class Stopped(Exception):
    """The command was asked to stop (Ctrl-C or SIGTERM) and has stopped Airflow."""


def pass_lines(stream, output: Output) -> None:
    for line in stream:
        output(line)


def run_stoppable(env: dict[str, str], *args: str, grace_s: float, output: Output | None = None) -> int:
    """`airflow *args`, stopped with everything below it when this command is asked to stop.

    Ctrl-C in a terminal reaches every process of the command at once; SIGTERM (`kill`, a CI job's
    time-out) reaches this one alone, which passes it on as SIGINT, the same Ctrl-C. Whatever is
    still running `grace_s` later, or at a second Ctrl-C, is killed: Airflow's scheduler can hang in
    its executor's shutdown, and its workers would outlive it. This process is their subreaper, so
    orphans are found too. Raises Stopped after a stop; returns Airflow's exit code otherwise.
    With `output`, Airflow's stdout and stderr go to it line by line instead of this command's."""
    process_tree.become_subreaper()
    piped = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace"}
    process = subprocess.Popen(
        [str(AIRFLOW), *args],
        env=env,
        cwd=REPO_ROOT,
        # Started from a script, SIGINT may arrive ignored; Airflow needs it to shut down cleanly.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **(piped if output else {}),
    )
    # Read in a thread: this one waits for the process and takes the signals.
    reader = threading.Thread(target=pass_lines, args=(process.stdout, output), daemon=True) if output else None
    if reader:
        reader.start()
    asked: list[float] = []

    def stop(number, _frame) -> None:
        if asked:
            process_tree.kill_all()
        elif number == signal.SIGTERM:
            process_tree.signal_all(signal.SIGINT)
        asked.append(time.monotonic())

    handlers = {number: signal.signal(number, stop) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        while process.poll() is None:
            time.sleep(0.5)
            process_tree.reap_orphans(keep=process.pid)
            if asked and time.monotonic() - asked[0] > grace_s:
                process_tree.kill_all()
        if asked:
            process_tree.kill_all()  # what outlived Airflow, e.g. idle executor workers
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    if reader:
        # Until the pipe's end; a process that outlived Airflow may hold it open, so not for ever.
        reader.join(timeout=READER_WAIT_S)
    if asked:
        raise Stopped
    return process.returncode
