"""Stage train: the decoder trained by train.num_workers TensorFlow workers in a Spark barrier stage.

Each barrier task picks a port, learns its peers' host:port through allGather (on a cluster, all
stop there when two share a node), builds TF_CONFIG from them and runs one training worker
(spark_jobs/training/trainer.py) under MultiWorkerMirroredStrategy. If any worker fails, Spark retries
the whole barrier stage and the workers resume from the last training-state backup in the run
folder; a failure that a retry would repeat (a diverging loss) fails the stage at once.

Reads tfrecords/, embeddings/, tokenizer/; writes model/, stats/epochs.csv, stats/train.json and
tensorboard/ (the chief's), and keeps checkpoints/ (its backups) until the stage is complete.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline import log, run_folder
from pipeline.config import PipelineConfig
from pipeline.errors import PipelineError
from spark_jobs.spark.nodes import host_of, needs_distinct_hosts, node_host, shared_hosts_error
from spark_jobs.spark.stage_app import run_stage
from spark_jobs.training import input_pipeline, trainer

PR_SET_PDEATHSIG = 1
# By its module's name, also when spark-submit runs this file as __main__: under spark_jobs (lib/log.py).
logger = logging.getLogger("spark_jobs.train")


def train(spark, config: PipelineConfig, run: str) -> dict:
    run_folder.require_inputs(run, "train")
    input_pipeline.read_manifest(run, config)  # bad input fails here, before any worker starts
    warnings = settings_warnings(config)
    for message in warnings:
        logger.warning(message)
    workers = config.train.num_workers
    results = run_workers(spark, run, workers)
    chief = results[0]
    for message in chief["warnings"]:  # e.g. a backup it could not resume
        logger.warning(message)
    warnings += chief["warnings"]
    return {
        "workers": workers,
        "resumed_from_step": chief["resumed_from_step"],
        "steps": config.train.max_steps,
        "steps_this_attempt": chief["steps"],
        "train_wall_s": chief["train_wall_s"],
        "compile_s": chief["compile_s"],
        "tokens_per_s": chief["tokens_per_s"],
        "final_val_loss": chief["final_val_loss"],
        "final_val_nats_per_char": chief["final_val_nats_per_char"],
        "final_val_accuracy": chief["final_val_accuracy"],
        "parameters": chief["parameters"],
        "worker_results": results,
        "warnings": warnings,
    }


def run_workers(spark, run: str, workers: int) -> list[dict]:
    """The training workers' results by worker index, from a barrier stage of one task per worker,
    or a PipelineError with the first worker's error that a retry would repeat."""
    distinct_hosts = needs_distinct_hosts(spark.sparkContext.master)
    results = (
        spark.sparkContext.parallelize(range(workers), workers)
        .barrier()
        .mapPartitions(lambda _: [train_task(run, distinct_hosts)])
        # Spark retries a failed barrier stage only when it is a shuffle-map stage (a failed
        # barrier result stage aborts the job), so the results go through a shuffle.
        .repartition(1)
        .collect()
    )
    results.sort(key=lambda result: result["worker"])
    for result in results:
        if "error" in result:
            raise PipelineError(f"training worker {result['worker']}: {result['error']}")
    return results


def settings_warnings(config: PipelineConfig) -> list[str]:
    """Training settings that are allowed but unlikely to be meant, e.g. a short trial run that
    keeps the default warm-up."""
    train = config.train
    if train.warmup_steps < train.max_steps:
        return []
    return [
        f"train.warmup_steps ({train.warmup_steps}) is not below train.max_steps ({train.max_steps}): the learning "
        f"rate rises for the whole run and never reaches train.learning_rate ({train.learning_rate}); lower "
        "train.warmup_steps for a short run"
    ]


def train_task(run: str, distinct_hosts: bool) -> dict:
    """One barrier task: agree on the cluster with the other tasks, then run a training worker.
    Workers that share a node when they should not stop before TensorFlow starts, every one of
    them (they all see the same addresses), so no worker waits for a peer that never comes."""
    from pyspark import BarrierTaskContext

    log.setup("train")  # in the executor's Python worker: its lines as the driver's
    context = BarrierTaskContext.get()
    index = context.partitionId()
    host = node_host(context, index)
    addresses = context.allGather(f"{host}:{free_port(host)}")  # ordered by partition id
    hosts = [host_of(address) for address in addresses]
    error = shared_hosts_error(hosts) if distinct_hosts else None
    if error:
        return {"worker": index, "error": error}
    tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    workers_on_host = hosts.count(host)
    threads = max(1, (os.cpu_count() or 1) // workers_on_host)
    result = run_worker_process(run, tf_config, threads)
    result["task_attempt"] = context.attemptNumber()
    result["host"] = host
    return result


def free_port(host: str = "") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def run_worker_process(run: str, tf_config: dict, threads: int) -> dict:
    """TensorFlow runs in a fresh process rather than in the forked pyspark worker: its thread pools
    and gRPC server are not fork-safe, each stage attempt gets a clean collective runtime, and a
    worker that dies (or is killed) shows up as an exit code the task turns into a failure. Its
    scratch folder is in Spark's own folder for the executor, which Spark (or YARN) removes even
    when it stops the task's Python worker too abruptly for it to clean up."""
    from pyspark import SparkFiles

    spark_folder = os.path.abspath(SparkFiles.getRootDirectory())
    with tempfile.TemporaryDirectory(prefix="gpt-pipeline-worker-", dir=spark_folder) as scratch:
        result_file = Path(scratch) / "result.json"
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps(tf_config),
            "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
            "TF_CPP_MIN_LOG_LEVEL": "1",
            # The worker leaves without interpreter shutdown, which would skip autograph's removal
            # of the source files it writes to the temporary folder: they go with the scratch folder.
            "TMPDIR": scratch,
        }
        argv = [
            sys.executable,
            "-m",
            "spark_jobs.training.trainer",
            "--run-dir",
            run,
            "--threads",
            str(threads),
            "--result",
            str(result_file),
        ]
        completed = subprocess.run(argv, env=env, preexec_fn=die_with_parent)
        index = tf_config["task"]["index"]
        if completed.returncode == trainer.SETTINGS_FAILURE_EXIT:
            return {"worker": index, **json.loads(result_file.read_text())}
        if completed.returncode != 0:
            raise RuntimeError(f"training worker {index} exited with code {completed.returncode}")
        return json.loads(result_file.read_text())


def die_with_parent() -> None:
    """When Spark kills a task's Python worker (its barrier stage failed or was cancelled), the
    training process must die with it; it would otherwise wait forever for its dead peers."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__main__":
    run_stage("train", train, resume_folder=run_folder.BACKUP_FOLDER)
