"""Run one stage with spark-submit on this machine's Spark (target: local): used by the DAG's
local target and by the stage runner (local_platform/stage_runner.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from include import class_archive
from include.spark_submit import local_master, spark_submit_argv
from spark_jobs.lib.config import PipelineConfig
from spark_jobs.lib.errors import BAD_INPUT_EXIT

VECTOR_MODULE = "--add-modules=jdk.incubator.vector"
STOP_GRACE_S = 15


class StageFailed(RuntimeError):
    def __init__(self, stage: str, returncode: int, argv: list[str]):
        super().__init__(f"stage {stage} failed with exit code {returncode} (command: {' '.join(argv)})")
        self.returncode = returncode

    @property
    def bad_input(self) -> bool:
        """The stage stopped on bad input (its one-line ERROR says what): a retry would fail the same way."""
        return self.returncode == BAD_INPUT_EXIT


def headline(stats: dict) -> dict:
    """The numbers and text at the top of a stage's stats, not the lists that grow with the corpus
    (a window per document, a warning per file): what the local runner prints, and the DAG's
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
        stage, config, code_uri=str(code_dir), run_dir=run_dir, master=local_master(stage, config, os.cpu_count() or 2)
    )
    argv[0] = str(Path(sys.executable).parent / "spark-submit")
    return argv


def submit_stage(stage: str, config: PipelineConfig, run_dir: str, code_dir: Path) -> None:
    argv = local_argv(stage, config, run_dir, code_dir)
    with class_archive.sharing(stage) as jvm_options:
        returncode = run_spark_submit(argv, spark_env(jvm_options))
        if returncode != 0:
            raise StageFailed(stage, returncode, argv)


def run_spark_submit(argv: list[str], env: dict[str, str]) -> int:
    """spark-submit's exit code. When this process is stopped meanwhile (Ctrl-C, SIGTERM, Airflow
    stopping the task), spark-submit gets SIGTERM first: Spark's shutdown then stops its Python
    workers and removes its temporary folders, which a SIGKILL would leave in /tmp. What still
    runs STOP_GRACE_S later is killed."""
    process = subprocess.Popen(argv, env=env)
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
