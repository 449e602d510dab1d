"""Airflow on this machine, with S3 served by a moto server that lives as long as the command.

    python -m local_platform.airflow_runner run [--corpus C] [--set section.key=value ...]   (make run)
    python -m local_platform.airflow_runner ui                                               (make airflow)

`run` executes the whole DAG once with `airflow dags test` and prints where the record went, the
final validation loss and the generated sample. `ui` starts `airflow standalone` (API server
with the UI, scheduler, DAG processor, triggerer) on http://127.0.0.1:8080 so runs can be
triggered from the form and watched. Airflow's home is airflow_home/ in the checkout (SQLite).
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import closing
from pathlib import Path

from include import locks, preflight
from include.airflow_names import DAG_ID
from include.promote import latest_key
from include.schedule import cron_timetable
from local_platform import console, process_tree
from local_platform.moto_s3 import LocalS3
from pipeline import corpus_files, lake, run_folder
from pipeline.config import REPO_ROOT, ConfigError, PipelineConfig
from pipeline.config_files import defaults_path, load_config, read_yaml
from pipeline.errors import PipelineError, name_some
from pipeline.overrides import DAG_SETTINGS, add_set_argument, apply_overrides, setting
from pipeline.stages import STAGE_NAMES
from spark_jobs.text import corpus

# Tests give the command a home of their own through this variable.
AIRFLOW_HOME = Path(os.environ.get("GPT_PIPELINE_AIRFLOW_HOME") or REPO_ROOT / "airflow_home")
AIRFLOW = Path(sys.executable).parent / "airflow"


def airflow_env(home: Path, s3: LocalS3) -> dict[str, str]:
    """Environment for Airflow commands: this checkout's DAG, a SQLite DB in `home`, the moto S3."""
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            # The DAG imports include/, pipeline/ and spark_jobs/ from the repository root.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            # `airflow standalone` starts its components as `airflow ...` from the PATH.
            "PATH": os.pathsep.join(filter(None, [str(AIRFLOW.parent), os.environ.get("PATH")])),
            # The tasks' temporary files and Spark's folders, in the home rather than /tmp: what a
            # stopped command leaves there goes when the next one starts (fresh_scratch).
            "TMPDIR": str(scratch_dir(home)),
            "SPARK_LOCAL_DIRS": str(scratch_dir(home)),
        }
    )
    return s3.isolated_env(env)


def scratch_dir(home: Path) -> Path:
    return home / "tmp"


def fresh_scratch(home: Path) -> None:
    """An empty scratch folder in the home. Called while holding the home, so no command uses it."""
    shutil.rmtree(scratch_dir(home), ignore_errors=True)
    scratch_dir(home).mkdir(parents=True)


Output = Callable[[str], None]  # takes a command's output line by line (a console.Console)


def prepare(home: Path, s3: LocalS3, output: Output | None = None) -> dict[str, str]:
    """The environment for Airflow commands on `home`, whose database is migrated and holds no
    run an interrupted command left unfinished. Called while holding the home. The migration's
    output goes to `output` if given, else to this command's."""
    home.mkdir(parents=True, exist_ok=True)
    fresh_scratch(home)
    env = airflow_env(home, s3)
    piped = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True} if output else {}
    migrated = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, cwd=REPO_ROOT, **piped)
    for line in (migrated.stdout or "").splitlines():
        output(line)
    migrated.check_returncode()
    fail_unfinished_runs(home, env)
    return env


def unfinished_runs(home: Path) -> list[str]:
    """Runs of the DAG still running in the home's database. (Queued runs have not started: the
    scheduler of `make airflow` starts them as usual.)"""
    with closing(sqlite3.connect(home / "airflow.db")) as db:
        query = "SELECT run_id FROM dag_run WHERE dag_id = ? AND state = 'running' ORDER BY id"
        return [run_id for (run_id,) in db.execute(query, (DAG_ID,))]


def task_state(home: Path) -> Callable[[str], str]:
    """The state of a task in the newest run of the DAG in the home's database, as `dags test`
    left it when the task ended."""

    def state(task_id: str) -> str:
        query = (
            "SELECT task_instance.state FROM task_instance JOIN dag_run USING (dag_id, run_id) "
            "WHERE task_instance.dag_id = ? AND task_id = ? ORDER BY dag_run.id DESC LIMIT 1"
        )
        try:
            with closing(sqlite3.connect(home / "airflow.db", timeout=30)) as db:
                found = db.execute(query, (DAG_ID, task_id)).fetchone()
        except sqlite3.Error as error:
            return f"state unread ({error})"
        return found[0] if found and found[0] else "ended"

    return state


def fail_unfinished_runs(home: Path, env: dict[str, str]) -> None:
    """Mark failed the runs an interrupted command left behind (Ctrl-C, a killed process): nothing
    runs them now that this command holds the home, and Airflow would otherwise resume them."""
    runs = unfinished_runs(home)
    if runs:
        print(f"marking as failed {len(runs)} run(s) an interrupted command left unfinished: {', '.join(runs)}")
        subprocess.run(
            [sys.executable, "-m", "local_platform.unfinished_runs", DAG_ID, *runs], env=env, cwd=REPO_ROOT, check=True
        )


STANDALONE_GRACE_S = 20  # after Ctrl-C, how long `make airflow` waits for Airflow to stop by itself
READER_WAIT_S = 10  # after Airflow ends, how long its last lines may take to reach the output


def pass_lines(stream, output: Output) -> None:
    for line in stream:
        output(line)


class Stopped(Exception):
    """The command was asked to stop (Ctrl-C or SIGTERM) and has stopped Airflow."""


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


def dags_test(env: dict[str, str], conf: dict, output: Output | None = None) -> bool:
    """Run the DAG once; True when the run succeeded. On Ctrl-C its stage dies at once, but `dags
    test` itself would only mark the task for a retry and wait for it: it is killed 2 s later."""
    return run_stoppable(env, "dags", "test", DAG_ID, "--conf", json.dumps(conf), grace_s=2, output=output) == 0


def read_report(s3: LocalS3, config: PipelineConfig) -> dict:
    """The report of the run collected to this server (each `run` starts with an empty server)."""
    client = s3.client()
    prefix = config.s3.prefix.strip("/")
    listing = client.list_objects_v2(Bucket=config.s3.bucket, Prefix=f"{prefix}/" if prefix else "")
    reports = [
        item["Key"] for item in listing.get("Contents", []) if item["Key"].endswith("/" + run_folder.REPORT_JSON)
    ]
    if len(reports) != 1:
        location = f"s3://{config.s3.bucket}/{config.s3.prefix}/"
        raise PipelineError(f"expected one {run_folder.REPORT_JSON} in {location}, found {reports}")
    return json.loads(client.get_object(Bucket=config.s3.bucket, Key=reports[0])["Body"].read())


def latest_pointer(s3: LocalS3, config: PipelineConfig) -> tuple[str, dict]:
    """The URI and content of the run name's latest pointer, which promote wrote."""
    key = latest_key(config)
    body = s3.client().get_object(Bucket=config.s3.bucket, Key=key)["Body"].read()
    return f"s3://{config.s3.bucket}/{key}", json.loads(body)


def run_folders(config: PipelineConfig) -> set[str]:
    """The names of the local lake's run folders, to tell which ones prune_runs removed."""
    runs = Path(lake.local_path(run_folder.runs_folder(config.lake)))
    return {path.name for path in runs.iterdir()} if runs.is_dir() else set()


def stage_error(config: PipelineConfig, new_folders: set[str]) -> str:
    """Where a failed run stopped, from the error a stage left in its run folder (the line to act
    on, far up in the task logs), else where to look."""
    for name in new_folders:
        folder = lake.join(run_folder.runs_folder(config.lake), name)
        for stage in STAGE_NAMES:
            uri = lake.join(folder, run_folder.error_path(stage))
            if lake.exists(uri):
                return f" in stage {stage}: {lake.read_json(uri)['error']}"
    return "; see the task logs in the full log"


def print_report(report: dict, pointer_uri: str, pointer: dict, removed: Iterable[str] = ()) -> None:
    print(f"\nrun folder:       {report['run_folder']}")
    print(f"report:           {report['run_folder']}/{run_folder.REPORT_TEXT}")
    print(f"report page:      {report['run_folder']}/{run_folder.REPORT_HTML}")
    print(f"S3 record:        {report['s3_uri']} (served by the moto server, gone when this command ends)")
    print(f"latest model:     {pointer_uri} -> {pointer['model']}")
    print(f"final val loss:   {report['final_val_loss']:.4f} nats/token")
    print(f"val nats/char:    {report['val_nats_per_char']:.4f}")
    for message in report["warnings"]:
        print(f"warning:          {message}")
    if removed:
        print(
            f"keep_runs:        removed {len(removed)} older run folder(s), their only copy (the S3 records of "
            f"earlier make runs ended with them): {name_some(sorted(removed))}"
        )
    print(f"generated sample:\n{console.printable(report['sample'])}")
    if report["run_folder"].startswith("s3://"):  # the EMR rehearsal's lake is on the moto server
        return
    model = shlex.quote(lake.local_path(lake.join(report["run_folder"], run_folder.MODEL_FOLDER)))
    prompt = shlex.quote(lake.read_json(lake.join(report["run_folder"], run_folder.CONFIG_FILE))["generate"]["prompt"])
    print(f"\nmore samples:     .venv/bin/python -m spark_jobs.generate --model-dir {model} --prompt {prompt}")


def exclusive_home(home: Path, command: str):
    """Hold Airflow's home for one command: its SQLite database takes one `airflow dags test` or
    `airflow standalone` at a time."""
    return locks.held(
        home / "in-use.lock",
        f"`{command}`",
        lambda holder: (
            f"{home} is in use by {holder}; Airflow's SQLite database there takes one command at a time: "
            "wait for it or stop it (while `make airflow` runs, trigger runs from its UI)"
        ),
    )


def run(config: PipelineConfig, conf: dict, verbose: bool = False) -> int:
    log = console.log_path(AIRFLOW_HOME, "run")
    with (
        exclusive_home(AIRFLOW_HOME, "make run"),
        LocalS3(buckets=(config.s3.bucket,)) as s3,
        console.teed(log, task_state(AIRFLOW_HOME), verbose) as output,
    ):
        env = prepare(AIRFLOW_HOME, s3, output)
        before = run_folders(config)
        try:
            succeeded = dags_test(env, conf, output)
        except Stopped:
            print(f"\ninterrupted: the {DAG_ID} run stops here", file=sys.stderr)
            fail_unfinished_runs(AIRFLOW_HOME, env)
            console.print_log_path(log)
            return 130
        if not succeeded:
            console.print_log_path(log)
            print(f"ERROR the {DAG_ID} run failed{stage_error(config, run_folders(config) - before)}", file=sys.stderr)
            return 1
        print_report(read_report(s3, config), *latest_pointer(s3, config), before - run_folders(config))
    return 0


def ui(config: PipelineConfig) -> int:
    host, port = os.environ.get("AIRFLOW__API__HOST", "127.0.0.1"), os.environ.get("AIRFLOW__API__PORT", "8080")
    check_loopback(host)
    with exclusive_home(AIRFLOW_HOME, "make airflow"):
        check_port_free(host, port)
        with LocalS3(buckets=(config.s3.bucket,)) as s3:
            env = prepare(AIRFLOW_HOME, s3)
            env["AIRFLOW__API__HOST"], env["AIRFLOW__API__PORT"] = host, port
            api = f"http://{host}:{port}"
            env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"{api}/execution/"
            # One local user: no login page; the API server listens on loopback only. Setting the
            # variable to False brings back the login page (user admin, password in airflow_home/).
            env.setdefault("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True")
            env["PATH"] = os.pathsep.join([str(components_without_log_servers(AIRFLOW_HOME)), env["PATH"]])
            print(f"Airflow UI: {api} (DAG {DAG_ID}); S3 (moto): {s3.endpoint_url}; Ctrl-C stops both", flush=True)
            return serve(env)


# The scheduler and the triggerer each start a log server on every interface (ports 8793 and 8794;
# Airflow has no setting for its address). On one machine the API server reads the task logs from
# their files, so `airflow standalone`'s components run without them.
AIRFLOW_WITHOUT_LOG_SERVERS = """#!/bin/sh
case "$1" in
  scheduler|triggerer) exec "{airflow}" "$@" --skip-serve-logs ;;
esac
exec "{airflow}" "$@"
"""


def components_without_log_servers(home: Path) -> Path:
    """A folder whose `airflow` starts the scheduler and the triggerer without their log servers:
    `airflow standalone` starts its components as `airflow ...` from the PATH."""
    folder = home / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "airflow"
    wrapper.write_text(AIRFLOW_WITHOUT_LOG_SERVERS.format(airflow=AIRFLOW))
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("run", "ui"))
    parser.add_argument("--corpus", help="run: corpus path, glob or URI (empty: the one in pipeline.yaml)")
    add_settings_arguments(parser, help_prefix="run: ")
    add_verbose_argument(parser, help_prefix="run: ")
    return parser.parse_args(argv)


def add_verbose_argument(parser: argparse.ArgumentParser, help_prefix: str = "") -> None:
    parser.add_argument(
        "--verbose",
        action="store_true",
        help=f"{help_prefix}all of Airflow's, Spark's and TensorFlow's output on the console too, not only in the log",
    )


def add_settings_arguments(parser: argparse.ArgumentParser, help_prefix: str = "") -> None:
    """--set, repeatable, and make's way in: SET reaches the command through the environment, as
    typed, named by --set-from-env (see settings)."""
    add_set_argument(parser, help_prefix=help_prefix)
    parser.add_argument(
        "--set-from-env",
        metavar="NAME",
        help=argparse.SUPPRESS,  # the settings in variable NAME, split as a shell would, each one --set
    )


def settings(args: argparse.Namespace) -> list[str]:
    """The settings of --set-from-env's variable, then those of each --set."""
    from_env = args.set_from_env
    return (split_overrides(os.environ.get(from_env, ""), from_env) if from_env else []) + args.overrides


def split_overrides(words: str, name: str = "SET") -> list[str]:
    """make's SET (environment variable `name`) as settings, one per --set:
    `train.max_steps=50 generate.prompt='To be'` holds two."""
    try:
        return shlex.split(words)
    except ValueError as error:  # an unmatched quote
        raise ConfigError(
            f"{name} {words!r}: {error}; put a value holding a quote in the other kind of quotes, "
            'as in generate.prompt="O\'er the hill"'
        ) from None


def check_dag_settings(overrides: list[str]) -> None:
    """Refuse what a run cannot change, before validation (whose complaints about an emr config,
    such as its s3:// lake, would miss the point)."""
    defaults = read_yaml(defaults_path())
    settings = apply_overrides(copy.deepcopy(defaults), overrides)
    target = settings.get("target")
    if target == "emr":  # any other value than local is the config model's to name
        origin = defaults_path() if target == defaults.get("target") else "SET"
        raise PipelineError(
            f"target: {target!r} (from {origin}): `make run` and `make airflow` run the DAG with "
            "target 'local', their S3 a moto server on this machine; run target 'emr' from an Airflow with "
            "an AWS connection (README: Running on AWS EMR)"
        )
    for name in DAG_SETTINGS:
        if name != "target" and setting(settings, name) != setting(defaults, name):  # any target but emr: the model's
            raise PipelineError(
                f"{name}: {setting(settings, name)!r} (from SET): the DAG's {name} is read from "
                f"{defaults_path().name} when Airflow parses the DAG, so a run cannot change it; set it there, and "
                "`make airflow` follows it"
            )


def warn_unusable_corpus(config: PipelineConfig) -> None:
    """Say so when the default corpus would fail a run: the UI still starts, for runs that name
    another corpus in the trigger form."""
    try:
        corpus.check_fits(config, corpus_files.corpus_files(config))
    except PipelineError as error:
        print(
            f"WARNING {error}: a run needs another corpus in the trigger form, or {defaults_path().name}'s",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        overrides = settings(args)
        conf: dict = {"overrides": overrides}
        if args.corpus:
            conf["corpus"] = args.corpus
        check_dag_settings(overrides)
        # Checked here too so that a bad value stops before Airflow starts; the DAG checks it again.
        # In the DAG's order (include/trigger_form.py): the form's corpus, then the overrides.
        config = load_config(overrides=([{"corpus": args.corpus}] if args.corpus else []) + overrides)
        if config.schedule is not None:
            cron_timetable(config.schedule)  # the DAG would not parse
        on_s3 = [uri for uri in config.corpus if uri.startswith("s3://")]
        if on_s3:
            raise PipelineError(
                f"corpus {name_some(on_s3)}: the S3 of `make run` and `make airflow` is a moto server on this machine "
                "that starts empty; give a local path or file:// URI, or read the corpus from S3 with the local "
                "runner (`.venv/bin/python -m local_platform.stage_runner`, with your AWS credentials) or target 'emr'"
            )
        # The DAG's first task checks all again; `make airflow` leaves the corpus, memory and disk
        # checks to it, since each triggered run's form may change the corpus, the model and the windows.
        if args.command == "ui":
            warn_unusable_corpus(config)
            return ui(config)
        checked = preflight.check_run(config, corpus_files.corpus_files(config))
        if checked.exposure:
            print(f"WARNING {checked.exposure}", file=sys.stderr)
        return run(config, conf, args.verbose)
    except PipelineError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
