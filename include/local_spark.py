"""Run one stage with spark-submit on this machine's Spark (target: local): used by the DAG's
local target and by the stage runner (local_platform/stage_runner.py)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from include import class_archive, locks, loopback_only
from include.spark_submit import local_master, spark_submit_argv
from pipeline import run_folder, stages
from pipeline.config import PipelineConfig
from pipeline.errors import BAD_INPUT_EXIT, PipelineError

VECTOR_MODULE = "--add-modules=jdk.incubator.vector"
STOP_GRACE_S = 15
LOOPBACK = "127.0.0.1"
# Locally every Spark application listens on loopback only (docs/network.md): its driver's RPC
# endpoint and block manager here, its UI through SPARK_LOCAL_IP (spark_env). Spark's default
# would be this machine's network address, and its UI every interface. EMR's steps keep Spark's
# defaults: there the nodes talk to each other, inside the cluster's security groups.
LOOPBACK_CONF = {"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK}
EXPOSURE_SETTING = "local.allow_exposed_workers"


class StageFailed(RuntimeError):
    """A stage's spark-submit that did not succeed: with the error the stage recorded in its run
    folder when it left one (the line to act on), else with its command."""

    def __init__(self, stage: str, returncode: int, argv: list[str], error: str | None = None):
        why = f": {error}" if error else f" (command: {' '.join(argv)})"
        super().__init__(f"stage {stage} failed with exit code {returncode}{why}")
        self.returncode = returncode

    @property
    def bad_input(self) -> bool:
        """The stage stopped on bad input (its one-line ERROR says what): a retry would fail the same way."""
        return self.returncode == BAD_INPUT_EXIT


def headline(stats: dict) -> dict:
    """The numbers and text at the top of a stage's stats, not the lists that grow with the corpus
    (a window per document, a warning per file): what the stage runner prints, and the DAG's
    task returns as its XCom, which Airflow keeps in its database."""
    return {key: value for key, value in stats.items() if isinstance(value, (int, float, str))}


def spark_env(jvm_options: tuple[str, ...] = ()) -> dict[str, str]:
    import pyspark  # here, not at the top: the DAG imports this module, and on EMR no pyspark is installed

    env = dict(os.environ)
    # Driver and executors run the interpreter of this virtual environment.
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # The pinned pyspark's Spark. Named here, not found by pyspark's find-spark-home script, which
    # breaks on a space in the interpreter's path.
    env["SPARK_HOME"] = str(Path(pyspark.__file__).parent)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    # The address Spark binds its UI to (it has no setting for it), and names the driver by.
    env["SPARK_LOCAL_IP"] = LOOPBACK
    # Locally the driver JVM (spark-submit's own) runs the executors too. With the JDK's vector
    # module, MLlib's BLAS (Word2Vec) uses SIMD instead of plain Java loops: about 1.5x faster here.
    # The JVM's own temporary folders (spark-*) go where this process's do (make run: airflow_home/tmp,
    # emptied by the next command: what a killed stage leaves is not left in /tmp).
    java_tmp = (class_archive.path_option("-Djava.io.tmpdir", Path(env["TMPDIR"])),) if env.get("TMPDIR") else ()
    env["SPARK_SUBMIT_OPTS"] = " ".join(
        filter(None, [env.get("SPARK_SUBMIT_OPTS"), VECTOR_MODULE, *java_tmp, *jvm_options])
    )
    return env


def local_argv(stage: str, config: PipelineConfig, run_dir: str, code_dir: Path) -> list[str]:
    argv = spark_submit_argv(
        stage,
        config,
        code_uri=str(code_dir),
        run_dir=run_dir,
        master=local_master(stages.by_name(stage), config, os.cpu_count() or 2),
        resources=LOOPBACK_CONF,
    )
    argv[0] = str(Path(sys.executable).parent / "spark-submit")
    return argv


def exposure_warning(config: PipelineConfig) -> str | None:
    """None when training on this machine keeps the TensorFlow workers off the network; a warning
    when it cannot and the run accepts that (local.allow_exposed_workers). Raises PipelineError,
    naming the reason and the setting, when it cannot and the run does not accept it: called before
    any stage runs, and again before training starts."""
    reason = loopback_only.unavailable_reason()
    if reason is None:
        return None
    exposure = (
        f"this machine cannot keep the TensorFlow training workers off the network ({reason}): their gRPC "
        "servers, which authenticate no one, would listen on every interface, as TensorFlow's security guidance "
        "says they must not"
    )
    if config.local.allow_exposed_workers:
        return f"{exposure}; training anyway, as {EXPOSURE_SETTING} is true for this run (docs/network.md)"
    raise PipelineError(
        f"{exposure}. Run where private network namespaces are allowed (docs/network.md), or accept the exposure "
        f"for one run with {EXPOSURE_SETTING}=true (make run SET=..., --set, or the trigger form's other settings)"
    )


def launch_argv(stage: str, config: PipelineConfig, argv: list[str]) -> list[str]:
    """`argv` as it runs here: contained in a private network namespace that holds only loopback
    for the stages the stage table marks `contained` (train, whose TensorFlow workers' gRPC servers
    listen on every interface, unauthenticated); see exposure_warning for where that is not possible."""
    if not stages.by_name(stage).contained:
        return argv
    warning = exposure_warning(config)
    if warning is None:
        return loopback_only.contained(argv)
    print(f"WARNING [{stage}] {warning}", file=sys.stderr, flush=True)
    return argv


def submit_stage(stage: str, config: PipelineConfig, run_dir: str, code_dir: Path) -> None:
    argv = local_argv(stage, config, run_dir, code_dir)
    launched = launch_argv(stage, config, argv)
    with class_archive.sharing(stage) as jvm_options:
        if launched != argv:  # contained: Netty finds no hardware address there, and says so; one made up
            jvm_options = (*jvm_options, f"-Dio.netty.machineId={':'.join(secrets.token_hex(1) for _ in range(8))}")
        returncode = run_spark_submit(launched, spark_env(jvm_options))
        if returncode != 0:
            raise StageFailed(stage, returncode, argv, run_folder.recorded_error(run_dir, stage))


def run_spark_submit(argv: list[str], env: dict[str, str]) -> int:
    """spark-submit's exit code. When this process is stopped meanwhile (Ctrl-C, SIGTERM, Airflow
    stopping the task), spark-submit gets SIGTERM first: Spark's shutdown then stops its Python
    workers and removes its temporary folders, which a SIGKILL would leave in /tmp. What still
    runs STOP_GRACE_S later is killed. Should this process be killed outright, spark-submit gets
    SIGTERM all the same (loopback_only.stop_with_parent), and until it has ended it holds the
    locks this process held (the run folder's), so no retry works in the run folder meanwhile."""
    parent = os.getpid()
    process = subprocess.Popen(
        argv, env=env, pass_fds=locks.held_fds(), preexec_fn=lambda: loopback_only.stop_with_parent(parent)
    )
    try:
        return process.wait()
    except BaseException:
        process.terminate()
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise
