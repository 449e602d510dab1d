"""Plays EMR's part on moto's EMR backend, in the process that serves moto: each cluster the DAG
creates goes through EMR's states on a real Spark standalone cluster (cluster.py), and each step's
`command-runner.jar` arguments are run as they are, but for the substitutions below (docs/rehearsal.md).

States: STARTING -> BOOTSTRAPPING (each bootstrap action's script fetched from S3 and checked with
`bash -n`, not run) -> WAITING, RUNNING while a step runs; TERMINATING -> TERMINATED on a
TerminateJobFlows call or after the AutoTerminationPolicy's IdleTimeout; TERMINATED_WITH_ERRORS,
with the reason, when the bootstrap or Spark fails to start. Steps run one at a time in order;
a step's state comes from its command's exit status and its stdout and stderr go where EMR puts
step logs, {LogUri}{cluster id}/steps/{step id}/stdout.gz and stderr.gz.

Substitutions in a step's arguments (`substitute`), and nothing else:
  --master yarn (or spark.master=yarn)       -> the rehearsal cluster's spark://127.0.0.1:port
  s3:// application file and --py-files      -> fetched from S3 into the step's folder (local Spark reads no s3://)
  executor memory, memory overhead, cores     -> scaled down to the rehearsal's workers where larger
and in the step's surroundings: the cluster's spark-defaults and spark-env Configurations are the
step's Spark defaults and environment, with the nodes' Python (the bootstrap's virtual environment)
replaced by this project's; `spark-submit` is the pinned pyspark's; the stages reach S3 (moto)
through AWS_ENDPOINT_URL and the server's made-up credentials.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path

from moto.core import DEFAULT_ACCOUNT_ID
from moto.emr.models import emr_backends
from moto.emr.responses import ElasticMapReduceResponse

from local_platform.rehearsal.cluster import SPARK_HOME, SparkStandaloneCluster

ENDED = ("TERMINATED", "TERMINATED_WITH_ERRORS")
POLL_S = 0.5
STEP_STOP_GRACE_S = 10
# What a rehearsal worker holds at most, whatever the step asks for (this machine is not a core node).
EXECUTOR_MEMORY_MB = 1024
MEMORY_OVERHEAD_MB = 512
MEMORY_SETTINGS = {"spark.executor.memory": EXECUTOR_MEMORY_MB, "spark.executor.memoryOverhead": MEMORY_OVERHEAD_MB}
CORE_SETTINGS = ("spark.executor.cores", "spark.task.cpus")


def now() -> datetime:
    return datetime.now(timezone.utc)


def memory_mb(value: str) -> int:
    """A Spark memory setting ('5632m', '4g', '512') in MB."""
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    text = value.strip().lower().removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text) // (1024 * 1024)  # plain bytes


def substitute(
    args: list[str], master_url: str, fetch: Callable[[str], str], worker_cores: int
) -> tuple[list[str], list[str]]:
    """A step's command-runner arguments as the rehearsal runs them, and the list of what was changed
    ("--master yarn -> spark://..."). Only spark-submit's own options are touched; the arguments
    before spark-submit (`timeout ...`) and the application's arguments are kept as they are."""
    args, changes = list(args), []
    if "spark-submit" not in args:
        return args, changes
    index = args.index("spark-submit") + 1
    while index < len(args) and args[index].startswith("--"):
        option = args[index]
        if index + 1 >= len(args):
            break
        value = args[index + 1]
        new = value
        if option == "--master" and value.startswith("yarn"):
            new = master_url
        elif option == "--py-files":
            new = ",".join(fetch(item) if item.startswith("s3://") else item for item in value.split(","))
        elif option == "--conf" and "=" in value:
            key, setting = value.split("=", 1)
            if key == "spark.master" and setting.startswith("yarn"):
                new = f"{key}={master_url}"
            elif key in MEMORY_SETTINGS and memory_mb(setting) > MEMORY_SETTINGS[key]:
                new = f"{key}={MEMORY_SETTINGS[key]}m"
            elif key in CORE_SETTINGS and int(setting) > worker_cores:
                new = f"{key}={worker_cores}"
        elif option in ("--executor-memory",) and memory_mb(value) > EXECUTOR_MEMORY_MB:
            new = f"{EXECUTOR_MEMORY_MB}m"
        elif option in ("--executor-cores",) and int(value) > worker_cores:
            new = str(worker_cores)
        if new != value:
            changes.append(f"{option} {value} -> {new}")
            args[index + 1] = new
        index += 2
    if index < len(args) and args[index].startswith("s3://"):  # the application file
        local = fetch(args[index])
        changes.append(f"{args[index]} -> {local}")
        args[index] = local
    return args, changes


def spark_settings(configurations: list[dict], venv_python: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """(spark-defaults properties, spark-env exports) of a RunJobFlow request's Configurations, the
    nodes' Python (`venv_python`, the bootstrap's virtual environment) replaced by this project's."""

    def local(value: str) -> str:
        return sys.executable if venv_python and value == venv_python else value

    defaults, exports = {}, {}
    for item in configurations or []:
        if item.get("Classification") == "spark-defaults":
            defaults |= {key: local(value) for key, value in item.get("Properties", {}).items()}
        if item.get("Classification") == "spark-env":
            for inner in item.get("Configurations", []):
                if inner.get("Classification") == "export":
                    exports |= {key: local(value) for key, value in inner.get("Properties", {}).items()}
    return defaults, exports


def nodes_python(request: dict) -> str | None:
    """The Python the cluster's Spark is pointed at (the bootstrap's virtual environment)."""
    defaults, _ = spark_settings(request.get("Configurations", []), None)
    return defaults.get("spark.pyspark.python")


def core_node_count(request: dict) -> int:
    groups = request.get("Instances", {}).get("InstanceGroups", [])
    return sum(group.get("InstanceCount", 0) for group in groups if group.get("InstanceRole") == "CORE") or 1


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


class EmrRehearsalRunner:
    """Start it in the process that serves moto (before clusters are created), stop it at the end:
    stop() terminates any cluster still running. `s3_client` is a function returning a boto3 S3
    client on the moto server, `step_env` the environment a step's command gets on top of this
    process's (AWS_ENDPOINT_URL and credentials)."""

    def __init__(
        self,
        s3_client: Callable,
        step_env: dict[str, str],
        region: str,
        account: str = DEFAULT_ACCOUNT_ID,
        cores_per_worker: int = 1,
        worker_memory_mb: int = EXECUTOR_MEMORY_MB + 1024,
    ):
        self.s3_client, self.step_env, self.region, self.account = s3_client, step_env, region, account
        self.cores_per_worker, self.worker_memory_mb = cores_per_worker, worker_memory_mb
        self.lock = threading.RLock()
        self.plays: dict[str, ClusterPlay] = {}
        self.originals: dict[str, Callable] = {}

    @property
    def backend(self):
        return emr_backends[self.account][self.region]

    def start(self) -> EmrRehearsalRunner:
        runner = self
        original_run = ElasticMapReduceResponse.run_job_flow
        original_add = ElasticMapReduceResponse.add_job_flow_steps
        original_terminate = ElasticMapReduceResponse.terminate_job_flows

        def run_job_flow(response):
            # moto keeps no AutoTerminationPolicy and starts a cluster WAITING: the request is
            # kept whole, and the cluster starts as EMR's does.
            with runner.lock:
                before = set(runner.backend.clusters)
                result = original_run(response)
                for cluster_id in set(runner.backend.clusters) - before:
                    runner.created(runner.backend.clusters[cluster_id], json.loads(response.body))
            return result

        def add_job_flow_steps(response):
            with runner.lock:
                cluster_id = json.loads(response.body)["JobFlowId"]
                cluster = runner.backend.clusters.get(cluster_id)
                state = cluster.state if cluster else None
                result = original_add(response)
                if cluster_id in runner.plays:  # moto runs the first step at once: EMR queues it
                    for step in cluster.steps:
                        if step.id not in runner.plays[cluster_id].started and step.state == "RUNNING":
                            step.state = "PENDING"
                    cluster.state = state
            return result

        def terminate_job_flows(response):
            with runner.lock:
                result = original_terminate(response)
                for cluster_id in json.loads(response.body).get("JobFlowIds", []):
                    play = runner.plays.get(cluster_id)
                    if play and not play.ended:
                        play.request_termination("Terminated by user request", "TERMINATED")
            return result

        self.originals = {
            "run_job_flow": original_run,
            "add_job_flow_steps": original_add,
            "terminate_job_flows": original_terminate,
        }
        ElasticMapReduceResponse.run_job_flow = run_job_flow
        ElasticMapReduceResponse.add_job_flow_steps = add_job_flow_steps
        ElasticMapReduceResponse.terminate_job_flows = terminate_job_flows
        return self

    def created(self, cluster, request: dict) -> None:
        cluster.state = "STARTING"
        cluster.ready_datetime = None
        play = ClusterPlay(self, cluster, request)
        self.plays[cluster.id] = play
        play.start()

    def stop(self) -> None:
        """Terminate every cluster still running, wait for them to end, and give moto back its own handlers."""
        for play in list(self.plays.values()):
            if not play.ended:
                play.request_termination("The rehearsal ended", "TERMINATED")
        for play in list(self.plays.values()):
            play.join()
        for name, original in self.originals.items():
            setattr(ElasticMapReduceResponse, name, original)
        self.originals = {}

    def wait_ended(self, cluster_id: str, timeout_s: float = 120) -> None:
        play = self.plays.get(cluster_id)
        if play:
            play.join(timeout_s)

    def __enter__(self) -> EmrRehearsalRunner:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ClusterPlay(threading.Thread):
    """One cluster's life: bootstrap, Spark, its steps in order, its end."""

    def __init__(self, runner: EmrRehearsalRunner, cluster, request: dict):
        super().__init__(name=f"emr-rehearsal-{cluster.id}", daemon=True)
        self.runner, self.cluster, self.request = runner, cluster, request
        self.started: set[str] = set()
        self.ended = False
        self.termination: tuple[str, str] | None = None
        self.spark: SparkStandaloneCluster | None = None
        self.folder = Path(tempfile.mkdtemp(prefix=f"gpt-pipeline-rehearsal-{cluster.id}-"))
        self.step_seconds: dict[str, float] = {}

    # -- states ------------------------------------------------------------------------------
    def set_state(self, state: str, reason: str | None = None) -> None:
        with self.runner.lock:
            if self.cluster.state in ENDED and self.ended:
                return
            self.cluster.state = state
            if reason is not None:
                self.cluster.last_state_change_reason = reason

    def request_termination(self, reason: str, final_state: str) -> None:
        with self.runner.lock:
            if self.termination is None:
                self.termination = (reason, final_state)
            self.cluster.state = "TERMINATING"
            self.cluster.last_state_change_reason = reason
            self.cluster.end_datetime = None

    def run(self) -> None:
        try:
            self.bootstrap()
            self.serve_steps()
        except Exception as error:  # a failed bootstrap or Spark start: the cluster ends with errors
            traceback.print_exc()
            self.request_termination(f"{error}", "TERMINATED_WITH_ERRORS")
        finally:
            self.end()

    def bootstrap(self) -> None:
        self.set_state("STARTING")
        self.set_state("BOOTSTRAPPING")
        for number, action in enumerate(self.request.get("BootstrapActions", []), 1):
            path = action["ScriptBootstrapAction"]["Path"]
            script = self.folder / f"bootstrap-{number}.sh"
            try:
                bucket, key = split_s3(path)
                script.write_bytes(self.runner.s3_client().get_object(Bucket=bucket, Key=key)["Body"].read())
            except Exception as error:
                raise RuntimeError(
                    f"bootstrap action {number} ({action.get('Name')}): {path} not read: {error}"
                ) from None
            checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
            if checked.returncode != 0:
                raise RuntimeError(f"bootstrap action {number} ({action.get('Name')}) failed: {checked.stderr.strip()}")
            if self.termination:
                return
        env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"} | self.runner.step_env
        self.spark = SparkStandaloneCluster(
            core_node_count(self.request), self.runner.cores_per_worker, self.runner.worker_memory_mb, env=env
        )
        self.spark.start()
        with self.runner.lock:
            self.cluster.ready_datetime = now()
        self.set_state("WAITING")

    def next_step(self):
        with self.runner.lock:
            for step in self.cluster.steps:
                if step.id not in self.started and step.state in ("PENDING", "RUNNING"):
                    return step
        return None

    def serve_steps(self) -> None:
        idle_timeout = self.request.get("AutoTerminationPolicy", {}).get("IdleTimeout")
        idle_since = time.monotonic()
        while self.termination is None:
            step = self.next_step()
            if step is not None:
                self.run_step(step)
                idle_since = time.monotonic()
                continue
            if idle_timeout and time.monotonic() - idle_since >= idle_timeout:
                self.request_termination(
                    f"Idle for {idle_timeout} s: terminated by the AutoTerminationPolicy", "TERMINATED"
                )
                break
            time.sleep(POLL_S)

    def end(self) -> None:
        with self.runner.lock:
            for step in self.cluster.steps:
                if step.state in ("PENDING", "RUNNING"):
                    step.state = "CANCELLED"
        if self.spark is not None:
            self.spark.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
        reason, final = self.termination or ("The rehearsal ended", "TERMINATED")
        with self.runner.lock:
            self.cluster.state, self.cluster.last_state_change_reason = final, reason
            self.cluster.end_datetime = now()
            self.ended = True

    # -- steps -------------------------------------------------------------------------------
    def run_step(self, step) -> None:
        with self.runner.lock:
            self.started.add(step.id)
            step.state, step.start_date_time = "RUNNING", now()
            self.cluster.state = "RUNNING"
        folder = self.folder / "steps" / step.id
        (folder / "files").mkdir(parents=True)
        stdout, stderr = folder / "stdout", folder / "stderr"
        started = time.monotonic()
        try:
            argv, changes = substitute(
                step.args, self.spark.master_url, lambda uri: self.fetch(uri, folder), self.runner.cores_per_worker
            )
            code = self.execute(argv, folder, stdout, stderr, changes)
        except Exception as error:  # a file not fetched: the step fails as command-runner would
            with open(stderr, "a") as log:
                log.write(f"{error}\n")
            code = 1
        self.step_seconds[step.id] = time.monotonic() - started
        self.upload_logs(step.id, stdout, stderr)
        with self.runner.lock:
            if self.termination is not None:
                step.state = "CANCELLED"
            else:
                step.state = "COMPLETED" if code == 0 else "FAILED"
                self.cluster.state = "WAITING"
            step.end_date_time = now()

    def fetch(self, uri: str, folder: Path) -> str:
        bucket, key = split_s3(uri)
        local = folder / "files" / Path(key).name
        local.write_bytes(self.runner.s3_client().get_object(Bucket=bucket, Key=key)["Body"].read())
        return str(local)

    def execute(self, argv: list[str], folder: Path, stdout: Path, stderr: Path, changes: list[str]) -> int:
        defaults, exports = spark_settings(self.request.get("Configurations", []), nodes_python(self.request))
        conf_dir = folder / "conf"
        conf_dir.mkdir()
        (conf_dir / "spark-defaults.conf").write_text("".join(f"{key} {value}\n" for key, value in defaults.items()))
        env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
        env |= self.runner.step_env | exports
        env |= {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",  # the driver runs on the master node (client mode)
            "PATH": os.pathsep.join([str(SPARK_HOME / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")]),
            "TMPDIR": str(folder),
        }
        # The exit status goes through a file: the command that runs the rehearsal may reap this
        # process's ended children itself (airflow_command, as a subreaper, collects orphans).
        exit_file = folder / "exit-status"
        wrapped = ["sh", "-c", f'"$@"; echo $? > {exit_file}', "command-runner", *argv]
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            err.write("".join(f"rehearsal: {change}\n" for change in changes).encode())
            err.flush()
            process = subprocess.Popen(
                wrapped, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
            )
            while process.poll() is None:
                if self.termination is not None:
                    self.kill(process)
                    break
                time.sleep(POLL_S)
            with suppress(ChildProcessError):
                process.wait()
        try:
            return int(exit_file.read_text().strip())
        except (OSError, ValueError):
            return 137  # killed before it could say

    def kill(self, process: subprocess.Popen) -> None:
        for number in (signal.SIGTERM, signal.SIGKILL):
            with suppress(ProcessLookupError):
                os.killpg(process.pid, number)
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STEP_STOP_GRACE_S)
                return

    def upload_logs(self, step_id: str, *logs: Path) -> None:
        log_uri = self.request.get("LogUri")
        if not log_uri:
            return
        bucket, prefix = split_s3(log_uri)
        for log in logs:
            body = gzip.compress(log.read_bytes() if log.exists() else b"")
            key = f"{prefix}{self.cluster.id}/steps/{step_id}/{log.name}.gz"
            with suppress(Exception):
                self.runner.s3_client().put_object(Bucket=bucket, Key=key, Body=body)
