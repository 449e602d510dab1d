"""`make run` and `make airflow` share Airflow's home (a SQLite database): one command at a time."""

from __future__ import annotations

import signal
import subprocess
import sys

from include import airflow_local
from spark_jobs.lib.config import REPO_ROOT

HOLD = """
import sys, time
from pathlib import Path
from include.airflow_local import exclusive_home
with exclusive_home(Path(sys.argv[1]), "make airflow"):
    print("holding", flush=True)
    time.sleep(300)
"""


def test_a_second_command_is_refused_while_another_holds_the_home(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(airflow_local, "AIRFLOW_HOME", tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "holding\n"
        assert airflow_local.main(["run"]) == 2
        error = capsys.readouterr().err
        assert f"ERROR {tmp_path} is in use by `make airflow` (pid {holder.pid})" in error
        assert "trigger runs from its UI" in error
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # A killed holder leaves no stale lock behind (a held lock would raise here).
    with airflow_local.exclusive_home(tmp_path, "make run"):
        assert (tmp_path / "in-use.lock").read_text().startswith("`make run` (pid ")
