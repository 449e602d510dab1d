"""A Spark standalone cluster from the pinned pyspark: one master on 127.0.0.1 and one worker per
core node, each worker on its own loopback address (127.0.0.2, 127.0.0.3, ...), so that the
executors, the barrier tasks and TensorFlow's gRPC talk between distinct node addresses as on
EMR's core nodes.

The master and the workers are `spark-class` child processes in sessions of their own (no sbin
daemons), with their work and log folders in a temporary folder; `stop()` kills each process tree
(the executors and their Python workers included) and removes the folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from contextlib import suppress
from pathlib import Path

import pyspark

from local_platform import process_tree

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
MASTER_HOST = "127.0.0.1"
START_TIMEOUT_S = 90
STOP_GRACE_S = 10


def node_address(index: int) -> str:
    """The loopback address of core node `index` (from 0): 127.0.0.2, 127.0.0.3, ..."""
    return f"127.0.0.{index + 2}"


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class StartError(RuntimeError):
    """The cluster did not come up; the message holds the end of the failing daemon's log."""


class SparkStandaloneCluster:
    """Use as a context manager, or start() and stop(). `master_url` is spark://127.0.0.1:port."""

    def __init__(self, workers: int, cores_per_worker: int = 1, memory_per_worker_mb: int = 2048, env=None):
        self.workers, self.cores, self.memory_mb = workers, cores_per_worker, memory_per_worker_mb
        self.base_env = dict(os.environ if env is None else env)
        self.folder: Path | None = None
        self.processes: list[subprocess.Popen] = []
        self.master_url = ""
        self.webui_url = ""
        self.worker_hosts = [node_address(index) for index in range(workers)]

    def daemon_env(self, host: str) -> dict[str, str]:
        assert self.folder is not None
        env = dict(self.base_env)
        for name in ("SPARK_MASTER_HOST", "SPARK_MASTER_PORT", "SPARK_WORKER_INSTANCES", "SPARK_CONF_DIR"):
            env.pop(name, None)
        env.update(
            {
                "SPARK_HOME": str(SPARK_HOME),
                # The daemons bind their RPC and web UI to this address, and the executors a worker
                # launches inherit it (the train stage's TensorFlow workers advertise it).
                "SPARK_LOCAL_IP": host,
                "SPARK_LOCAL_HOSTNAME": host,
                "SPARK_LOG_DIR": str(self.folder / "logs"),
                "SPARK_PID_DIR": str(self.folder / "pids"),
                "SPARK_DAEMON_MEMORY": "256m",
                "SPARK_WORKER_DIR": str(self.folder / "work" / host),
                "SPARK_LOCAL_DIRS": str(self.folder / "local" / host),
            }
        )
        return env

    def launch(self, name: str, host: str, args: list[str]) -> subprocess.Popen:
        assert self.folder is not None
        log = open(self.folder / "logs" / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        process = subprocess.Popen(
            [str(SPARK_CLASS), *args],
            env=self.daemon_env(host),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() signals the whole tree
        )
        log.close()
        process.log_path = self.folder / "logs" / f"{name}.log"  # type: ignore[attr-defined]
        self.processes.append(process)
        return process

    def start(self) -> SparkStandaloneCluster:
        self.folder = Path(tempfile.mkdtemp(prefix="gpt-pipeline-rehearsal-spark-"))
        for sub in ("logs", "pids", "work", "local"):
            (self.folder / sub).mkdir()
        try:
            port, webui = free_port(MASTER_HOST), free_port(MASTER_HOST)
            self.master_url = f"spark://{MASTER_HOST}:{port}"
            self.webui_url = f"http://{MASTER_HOST}:{webui}"
            master_class = "org.apache.spark.deploy.master.Master"
            master_args = ["--host", MASTER_HOST, "--port", str(port), "--webui-port", str(webui)]
            self.launch("master", MASTER_HOST, [master_class, *master_args])
            self.wait_for(lambda state: state is not None, "the master")
            for index, host in enumerate(self.worker_hosts):
                args = ["org.apache.spark.deploy.worker.Worker", "--host", host, "--port", str(free_port(host))]
                args += ["--webui-port", str(free_port(host)), "--cores", str(self.cores)]
                args += ["--memory", f"{self.memory_mb}m", "--work-dir", str(self.folder / "work" / host)]
                self.launch(f"worker-{index + 1}", host, [*args, self.master_url])
            self.wait_for(lambda state: state is not None and self.alive_workers(state) == self.workers, "the workers")
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict | None:
        """The master's JSON state (workers, applications), None while it does not answer."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"{self.webui_url}/json/", timeout=5) as response:
                return json.loads(response.read())
        except (OSError, ValueError):
            return None

    def alive_workers(self, state: dict) -> int:
        return sum(worker.get("state") == "ALIVE" for worker in state.get("workers", []))

    def wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready(self.state()):
            for process in self.processes:
                if process.poll() is not None:
                    raise StartError(
                        f"{process.log_path.stem} exited with {process.returncode}: {tail(process.log_path)}"
                    )
            if time.monotonic() > deadline:
                raise StartError(f"{what} of the Spark standalone cluster did not start in {START_TIMEOUT_S} s")
            time.sleep(0.5)

    def pids(self) -> list[int]:
        """Every live process of the cluster: the daemons and what they started (executors, Python workers)."""
        tree = process_tree.parents_and_states()
        found = [process.pid for process in self.processes if process.poll() is None]
        todo = list(found)
        while todo:
            parent = todo.pop()
            children = [pid for pid, (ppid, state) in tree.items() if ppid == parent and state != "Z"]
            found += children
            todo += children
        return found

    def stop(self) -> None:
        """Kill every process of the cluster (workers first, so no executor is relaunched) and remove its folder."""
        pids: list[int] = []
        for number in (signal.SIGTERM, signal.SIGKILL):
            pids = sorted(set(pids) | set(self.pids()))
            for process in reversed(self.processes):
                if process.poll() is None:
                    with suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, number)
            for pid in pids:
                with suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, number)
            deadline = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < deadline and any(process.poll() is None for process in self.processes):
                time.sleep(0.2)
            if not any(process.poll() is None for process in self.processes) and not self.pids_of(pids):
                break
        for process in self.processes:
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def pids_of(self, pids: list[int]) -> list[int]:
        alive = process_tree.parents_and_states()
        return [pid for pid in pids if pid in alive and alive[pid][1] != "Z"]

    def __enter__(self) -> SparkStandaloneCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
