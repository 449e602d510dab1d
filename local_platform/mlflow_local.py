"""MLflow on this machine: the store in mlflow/ of the checkout, the server `make mlflow` starts on
it, and the tracking URI the local commands (`make run`, `make rehearse`, `make airflow`) give the
DAG's collect and promote tasks.

    python -m local_platform.mlflow_local [--port 5000] [--mlflow .venv-mlflow/bin/mlflow]    (make mlflow)

The server listens on 127.0.0.1 alone, its backend store a SQLite database, mlflow/mlflow.db, its
artifacts under mlflow/artifacts. A local command logs to the server when it answers there, else to
the same SQLite store directly (the server shows those runs once it starts); GPT_PIPELINE_MLFLOW_URI
names another tracking URI, and set empty turns tracking off.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from include.tracking import check_reachable, shown_uri
from local_platform import process_tree
from pipeline.config import REPO_ROOT, PipelineConfig

STORE = REPO_ROOT / "mlflow"
HOST, PORT = "127.0.0.1", 5000
URI_SETTING = "GPT_PIPELINE_MLFLOW_URI"
# MLflow with its UI, in an environment of its own (`make mlflow-venv`): .venv's mlflow-skinny has no UI.
MLFLOW = REPO_ROOT / ".venv-mlflow" / "bin" / "mlflow"
STOP_GRACE_S = 10


def store_uri(store: Path = STORE) -> str:
    return f"sqlite:///{store / 'mlflow.db'}"


def server_uri(port: int = PORT) -> str:
    return f"http://{HOST}:{port}"


def tracking_uri(port: int = PORT, store: Path = STORE) -> str:
    """GPT_PIPELINE_MLFLOW_URI when set; else `make mlflow`'s server if it answers; else its store."""
    if URI_SETTING in os.environ:
        return os.environ[URI_SETTING]
    try:
        check_reachable(server_uri(port))
    except OSError:
        return store_uri(store)
    return server_uri(port)


def tracking_env(config: PipelineConfig, uri: str) -> dict[str, str]:
    """The Airflow variable the DAG reads the tracking URI from (tracking.uri_variable), as Airflow
    takes a variable from the environment."""
    return {f"AIRFLOW_VAR_{config.tracking.uri_variable.upper()}": uri}


def describe(uri: str) -> str:
    """The console's line on where runs are tracked."""
    if not uri:
        return f"MLflow:           off ({URI_SETTING} is empty)"
    if uri == store_uri():
        return f"MLflow:           {uri} (`make mlflow` shows it on {server_uri()})"
    return f"MLflow:           {shown_uri(uri)}"


def server_command(mlflow: Path, store: Path, port: int) -> list[str]:
    return [
        str(mlflow),
        "server",
        "--host",
        HOST,
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        store_uri(store),
        "--artifacts-destination",
        str(store / "artifacts"),
    ]


def interrupted(_number, _frame) -> None:
    raise KeyboardInterrupt


def serve(mlflow: Path, store: Path, port: int) -> int:
    """Run the server until Ctrl-C or SIGTERM, then stop it with every process it started (its
    web server and job runner, which it leaves behind when killed alone)."""
    if not mlflow.is_file():
        print(f"ERROR {mlflow} is missing: `make mlflow` builds its environment (make mlflow-venv)", file=sys.stderr)
        return 2
    store.mkdir(parents=True, exist_ok=True)
    print(f"MLflow: {server_uri(port)} (store: {store}); Ctrl-C stops it", flush=True)
    process_tree.become_subreaper()
    signal.signal(signal.SIGTERM, interrupted)
    try:
        return subprocess.Popen(server_command(mlflow, store, port), cwd=store).wait()
    except KeyboardInterrupt:
        return 130
    finally:
        stop_everything_below()


def stop_everything_below() -> None:
    process_tree.signal_all(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while process_tree.descendants() and time.monotonic() < deadline:
        time.sleep(0.2)
    process_tree.kill_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--store", type=Path, default=STORE, help="the folder of the SQLite store and artifacts")
    parser.add_argument("--mlflow", type=Path, default=MLFLOW, help="the mlflow command of an MLflow with its UI")
    args = parser.parse_args(argv)
    return serve(args.mlflow, args.store, args.port)


if __name__ == "__main__":
    sys.exit(main())
