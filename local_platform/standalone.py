"""`make airflow` (`python -m local_platform.airflow_runner ui`): `airflow standalone` (API server
with the UI, scheduler, DAG processor, triggerer) on http://127.0.0.1:8080, with a moto S3 server,
until Ctrl-C, so that runs can be triggered from the form and watched."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import socket
from contextlib import closing
from pathlib import Path

from include.airflow_names import DAG_ID
from local_platform import airflow_home, mlflow_local
from local_platform.airflow_command import Stopped, run_stoppable
from local_platform.moto_s3 import LocalS3
from pipeline.config import PipelineConfig
from pipeline.errors import PipelineError

STANDALONE_GRACE_S = 20  # after Ctrl-C, how long `make airflow` waits for Airflow to stop by itself
ADMIN = "admin"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"  # Airflow's own name, in its home

# The scheduler and the triggerer each start a log server on every interface (ports 8793 and 8794;
# Airflow has no setting for its address). On one machine the API server reads the task logs from
# their files, so `airflow standalone`'s components run without them.
AIRFLOW_WITHOUT_LOG_SERVERS = """#!/bin/sh
case "$1" in
  scheduler|triggerer) exec "{airflow}" "$@" --skip-serve-logs ;;
esac
exec "{airflow}" "$@"
"""


def ui(config: PipelineConfig) -> int:
    home = airflow_home.AIRFLOW_HOME
    host, port = os.environ.get("AIRFLOW__API__HOST", "127.0.0.1"), os.environ.get("AIRFLOW__API__PORT", "8080")
    check_loopback(host)
    with airflow_home.exclusive_home(home, "make airflow"):
        check_port_free(host, port)
        with LocalS3(buckets=(config.s3.bucket,)) as s3:
            tracking_uri = mlflow_local.tracking_uri()
            env = airflow_home.prepare(home, s3) | mlflow_local.tracking_env(config, tracking_uri)
            env["AIRFLOW__API__HOST"], env["AIRFLOW__API__PORT"] = host, port
            api = f"http://{host}:{port}"
            env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"{api}/execution/"
            passwords = login_settings(env, home)
            env["PATH"] = os.pathsep.join([str(components_without_log_servers(home)), env["PATH"]])
            print(f"Airflow UI: {api} (DAG {DAG_ID}); S3 (moto): {s3.endpoint_url}; Ctrl-C stops both", flush=True)
            print(f"log in as {ADMIN}, password in {passwords} (readable by you alone)", flush=True)
            print(mlflow_local.describe(tracking_uri), flush=True)
            return serve(env)


def login_settings(env: dict[str, str], home: Path) -> Path:
    """The login page on, as `airflow standalone` has it: one admin user whose password is made up
    on first use and kept in Airflow's home, readable by its owner alone; nobody gets a token
    without it (a local user, or a web page the browser was sent to). Returns the password file."""
    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = "False"
    env.setdefault("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", f"{ADMIN}:admin")
    passwords = Path(env.setdefault("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(home / PASSWORDS_FILE)))
    if not passwords.exists():
        descriptor = os.open(passwords, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            json.dump({ADMIN: secrets.token_urlsafe(16)}, file)
    return passwords


def components_without_log_servers(home: Path) -> Path:
    """A folder whose `airflow` starts the scheduler and the triggerer without their log servers:
    `airflow standalone` starts its components as `airflow ...` from the PATH."""
    folder = home / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "airflow"
    wrapper.write_text(AIRFLOW_WITHOUT_LOG_SERVERS.format(airflow=airflow_home.AIRFLOW))
    wrapper.chmod(0o755)
    return folder


def check_loopback(host: str) -> None:
    """The API server listens on loopback only: with one local user and no login page, whoever
    reached it would be Airflow's admin, and through the DAG run code here (docs/network.md)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as error:
        raise PipelineError(f"AIRFLOW__API__HOST={host}: {error.strerror}") from None
    if not all(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in addresses):
        raise PipelineError(
            f"AIRFLOW__API__HOST={host} is not a loopback address ({', '.join(sorted(addresses))}): `make airflow` "
            "serves its UI and API on this machine only, e.g. AIRFLOW__API__HOST=127.0.0.1 (the default); "
            "to reach it from elsewhere, forward the port over SSH"
        )


def check_port_free(host: str, port: str) -> None:
    """Airflow standalone carries on without its API server when the port is taken: the UI address
    would be another program's, and the tasks would send their state there."""
    with closing(socket.socket()) as probe:
        probe.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as the API server binds: past connections do not count
        try:
            probe.bind((host, int(port)))
        except OSError as error:
            raise PipelineError(
                f"{host}:{port} is taken ({error.strerror}): stop what listens there, or give Airflow another "
                f"port with AIRFLOW__API__PORT, e.g. `AIRFLOW__API__PORT=8081 make airflow`"
            ) from None


def serve(env: dict[str, str]) -> int:
    """`airflow standalone` in the foreground until Ctrl-C (or SIGTERM) makes it stop its components."""
    try:  # standalone stops its components in a few seconds, but its scheduler may hang in the
        # LocalExecutor's shutdown while a task was running.
        return run_stoppable(env, "standalone", grace_s=STANDALONE_GRACE_S)
    except Stopped:
        return 0
