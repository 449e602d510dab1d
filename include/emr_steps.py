"""One EMR step per stage: the shared spark-submit command (include/spark_submit.py) with the
executor sizes a cluster needs, run by command-runner.jar under its own time limit; and the time
limits of the sensors that wait for the steps. What sets a stage's step apart (a barrier stage's
executors, whole-node executors, a time limit that grows with the training) is its row of the
stage table (pipeline.stages).
"""

from __future__ import annotations

import math

from include.emr_cluster import instance_type
from include.emr_code import code_uri
from include.spark_submit import spark_submit_argv
from pipeline import run_folder
from pipeline.config import ConfigError, PipelineConfig
from pipeline.config_files import defaults_path
from pipeline.stages import EMR_STEP_NAMES, Stage, by_name
from spark_jobs.training import memory

MASTER = "yarn"
# Client mode: the driver runs on the master node, so the core nodes are left whole for the
# training executors, and the driver's output (the stage's "ERROR [stage] ..." line) is the
# step's log in S3 (stdout.gz: spark-submit merges its Python driver's stderr into its stdout).
DEPLOY_MODE = "client"
STEP_KILL_AFTER_SECONDS = 60  # a step still there this long after its time limit's SIGTERM is killed
# A stage's step that fails is added again this many times (not after bad input or its time limit).
STEP_RETRIES = 1
# Left free on each core node for the YARN application master of the step's Spark application.
APPLICATION_MASTER_MB = 2048
# On a barrier stage whose tasks do not all fit in the cluster's task slots, Spark checks again every
# interval, and fails the job after this many checks (its defaults, 15 s x 40, wait 10 minutes).
BARRIER_SLOTS_CHECK = {
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "5s",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "12",
}
# EMR's own setting (on by default in its Spark): off, its executors have the sizes set below
# rather than ones EMR works out for each node's instance type.
FIXED_EXECUTOR_SIZES = {"spark.yarn.heterogeneousExecutors.enabled": "false"}
# The cluster check's step (Stage.time_limit "short") takes about a minute: Spark's start, one
# barrier task per node importing the nodes' packages, a probe object on S3.
SHORT_STEP_SECONDS = 5 * 60
# The settings that make each kind of step time limit (Stage.time_limit) longer, named when a run
# needs a longer one than the DAG's sensors allow.
LIMIT_SETTINGS = {
    "fixed": "emr.step_timeout_minutes",
    "training_budget": (
        "train.max_steps, train.eval_batches, emr.train_seconds_per_step or emr.step_timeout_minutes, or lower "
        "train.eval_interval,"
    ),
    "short": "nothing (a fixed limit; a run's settings cannot lengthen it)",
}


def train_resources(config: PipelineConfig) -> dict[str, str]:
    """The barrier stage's executors: one per core node owning all its vCPUs, and one task per
    executor, so the barrier stage gets exactly one TensorFlow worker per node, or fails within
    about a minute when the cluster cannot place them all. TensorFlow runs in the Python worker,
    outside the JVM heap, so most of the container's memory is overhead."""
    _, overhead_mb = train_executor_memory_mb(config)
    return {
        **whole_node_executors(config),
        "spark.executor.instances": str(config.train.num_workers),
        "spark.task.cpus": str(instance_type(config, "core_instance_type")["vcpus"]),
        f"spark.executorEnv.{memory.WORKER_BUDGET_ENV}": str(overhead_mb),
        **BARRIER_SLOTS_CHECK,
    }


def preprocess_resources(config: PipelineConfig) -> dict[str, str]:
    """The preprocessing stages' executors (Stage.whole_node_executors): a whole core node each, as
    for training, so that the overhead holds the node's Python workers (one per vCPU, each reading
    whole Parquet parts) instead of YARN's default of a tenth of the heap, past which YARN kills
    the container."""
    return {**whole_node_executors(config), **cluster_parallelism(config)}


def whole_node_executors(config: PipelineConfig) -> dict[str, str]:
    """An executor's size when it owns a core node: all its vCPUs and the memory YARN offers."""
    heap_mb, overhead_mb = train_executor_memory_mb(config)
    return {
        "spark.executor.cores": str(instance_type(config, "core_instance_type")["vcpus"]),
        "spark.executor.memory": f"{heap_mb}m",
        "spark.executor.memoryOverhead": f"{overhead_mb}m",
        **FIXED_EXECUTOR_SIZES,
    }


def cluster_parallelism(config: PipelineConfig) -> dict[str, str]:
    """The other stages' parallelism: every core node's vCPUs. Spark's default is the cores of the
    executors registered so far, and with dynamic allocation none are when a stage plans its
    work, so tokenize would cut the corpus for 2 tasks and Word2Vec's partitions would vary."""
    node = instance_type(config, "core_instance_type")
    return {"spark.default.parallelism": str(config.emr.core_instance_count * node["vcpus"])}


def train_executor_memory_mb(config: PipelineConfig) -> tuple[int, int]:
    """(JVM heap, overhead) of an executor owning a core node, for training as for preprocessing;
    the overhead is what its Python workers have (the TensorFlow worker, or one per vCPU)."""
    container_mb = instance_type(config, "core_instance_type")["yarn_memory_mb"] - APPLICATION_MASTER_MB
    heap_mb = container_mb // 4
    return heap_mb, container_mb - heap_mb


def step_resources(stage: Stage, config: PipelineConfig) -> dict[str, str]:
    """The executor settings of a stage's step, besides its own (include/spark_submit.stage_conf)."""
    if stage.barrier:
        return train_resources(config)
    if stage.whole_node_executors:
        return preprocess_resources(config)
    return cluster_parallelism(config)


def stage_step(stage: str, config: PipelineConfig, run_id: str) -> dict:
    """The EMR step running one stage: command-runner.jar + the shared spark-submit argv."""
    argv = spark_submit_argv(
        stage,
        config,
        code_uri=code_uri(config, run_id),
        run_dir=run_folder.run_dir(config, run_id),
        master=MASTER,
        deploy_mode=DEPLOY_MODE,
        resources=step_resources(by_name(stage), config),
    )
    # The step ends itself at its task's time limit, so the cluster's cost stays bounded when Airflow
    # is not there to give up on it: EMR's idle timeout starts only once no step runs.
    limit = ["timeout", f"--kill-after={STEP_KILL_AFTER_SECONDS}", str(step_limit_seconds(stage, config))]
    # CONTINUE: a failed step leaves the cluster to the DAG, whose teardown terminates it.
    return {
        "Name": stage,
        "ActionOnFailure": "CONTINUE",
        "HadoopJarStep": {"Jar": "command-runner.jar", "Args": limit + argv},
    }


def step_time_limit(step: dict) -> int:
    """The seconds a stage_step may run before it ends itself."""
    return int(step["HadoopJarStep"]["Args"][2])


def train_budget_steps(config: PipelineConfig) -> int:
    """Optimizer steps plus validation batches (the last evaluation's at their most): what the
    train step's duration grows with."""
    evaluations = math.ceil(config.train.max_steps / config.train.eval_interval)
    last = config.train.final_eval_max_batches
    return config.train.max_steps + (evaluations - 1) * config.train.eval_batches + last


def step_limit_seconds(stage: str, config: PipelineConfig) -> int:
    """The time limit of a stage's step, counted from when the step starts running."""
    if by_name(stage).time_limit == "short":
        return SHORT_STEP_SECONDS
    limit = config.emr.step_timeout_minutes * 60
    if by_name(stage).time_limit == "training_budget":
        limit += math.ceil(train_budget_steps(config) * config.emr.train_seconds_per_step)
    return limit


def sensor_limits(stage: str, config: PipelineConfig) -> dict[str, int]:
    """EmrStepSensor's `timeout` and `poke_interval` for a stage's step. The sensor's clock starts
    before the step runs, so it allows a poke for the step to start, the step's own limit and its
    kill, and a poke to see it end: a step that runs out of time is seen to fail, with its reason."""
    poke = config.emr.poke_interval_seconds
    return {"timeout": step_limit_seconds(stage, config) + STEP_KILL_AFTER_SECONDS + 2 * poke, "poke_interval": poke}


def check_sensor_limits(run_config: PipelineConfig, dag_config: PipelineConfig) -> None:
    """Sensor limits are fixed when the DAG is parsed; a run whose overrides (e.g. a larger
    train.max_steps) need more time is stopped before any cluster is created."""
    for stage in EMR_STEP_NAMES:
        needed = step_limit_seconds(stage, run_config)
        allowed = step_limit_seconds(stage, dag_config)
        if needed > allowed:
            raise ConfigError(
                f"stage {stage} needs a step time limit of {needed} s with this run's settings, but the DAG's "
                f"sensor allows {allowed} s: raise {LIMIT_SETTINGS[by_name(stage).time_limit]} in "
                f"{defaults_path().name}, which the DAG's sensors are set from"
            )
