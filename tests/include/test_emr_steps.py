"""One EMR step per stage (include/emr_steps.py) without AWS: the same applications and
arguments as the local target, each step's executor settings, and the steps' and sensors' time
limits."""

from __future__ import annotations

from pathlib import Path
from typing import get_args, get_type_hints

import pytest

from include import emr_cluster, emr_code, emr_steps
from include.local_spark import LOOPBACK_CONF, local_argv
from pipeline import run_folder
from pipeline.config import ConfigError
from pipeline.config_files import load_config
from pipeline.stages import CLUSTER_CHECK, EMR_STEP_NAMES, STAGE_NAMES, Stage, by_name
from spark_jobs.training import memory
from tests.include.emr_configs import RUN_ID, emr_config


def test_steps_run_each_stage_with_spark_submit_on_yarn():
    config = emr_config()
    for stage in EMR_STEP_NAMES:
        step = emr_steps.stage_step(stage, config, RUN_ID)
        args = step["HadoopJarStep"]["Args"]
        assert step["Name"] == stage and step["HadoopJarStep"]["Jar"] == "command-runner.jar"
        # The step ends itself at its task's time limit (coreutils' timeout), whether or not Airflow is there.
        limit = emr_steps.step_limit_seconds(stage, config)
        assert args[:3] == ["timeout", "--kill-after=60", str(limit)] and emr_steps.step_time_limit(step) == limit
        args = args[3:]
        assert args[:5] == ["spark-submit", "--master", "yarn", "--deploy-mode", "client"]
        assert args[-3:] == [
            f"{emr_code.code_uri(config, RUN_ID)}/spark_jobs/{by_name(stage).app_file}",
            "--run-dir",
            run_folder.run_dir(config, RUN_ID),
        ]
        # Every core node's vCPUs (2 m5.2xlarge: 8 each), not the executors that happen to be up when a stage plans.
        if not by_name(stage).barrier:  # train and the cluster check: one task per worker node
            assert args[args.index("spark.default.parallelism=16") - 1] == "--conf"


def normalised(argv: list[str], code: str, run_dir: str, resources: dict[str, str]) -> list[str]:
    """argv with master, deploy mode, code location, run folder and executor sizing taken out."""
    kept, skip = [], False
    for index, item in enumerate(argv[1:], start=1):
        if skip:
            skip = False
            continue
        if item in ("--master", "--deploy-mode"):
            skip = True
            continue
        if item == "--conf" and argv[index + 1].split("=", 1)[0] in resources:
            skip = True
            continue
        kept.append(item.replace(code, "<code>").replace(run_dir, "<run>"))
    return kept


def test_local_and_emr_run_the_same_applications_with_the_same_arguments(tmp_path):
    config = emr_config()
    local_config = load_config(overrides=["target=local", f"lake={tmp_path / 'lake'}"])
    local_run, emr_run = run_folder.run_dir(local_config, RUN_ID), run_folder.run_dir(config, RUN_ID)
    code_dir = tmp_path / "code"
    # The targets' own settings: EMR's executor sizing, and locally Spark's loopback addresses.
    resources = emr_steps.train_resources(config) | emr_steps.preprocess_resources(config) | LOOPBACK_CONF
    for stage in STAGE_NAMES:
        local = local_argv(stage, local_config, local_run, code_dir)
        remote = emr_steps.stage_step(stage, config, RUN_ID)["HadoopJarStep"]["Args"][3:]  # after the time limit
        assert Path(local[0]).name == remote[0] == "spark-submit"
        assert normalised(local, str(code_dir), local_run, resources) == normalised(
            remote, emr_code.code_uri(config, RUN_ID), emr_run, resources
        ), stage
        assert local[local.index("--master") + 1].startswith("local[")
        assert remote[remote.index("--master") + 1] == "yarn"


def test_train_gets_one_whole_core_node_per_worker():
    config = emr_config(
        "emr.core_instance_type=m5.4xlarge",
        "emr.core_instance_count=3",
        "train.num_workers=3",
        "data.shards=6",
        "train.batch_size=30",
    )
    node = emr_cluster.instance_type(config, "core_instance_type")
    resources = emr_steps.train_resources(config)
    assert resources["spark.executor.instances"] == "3"
    assert resources["spark.executor.cores"] == resources["spark.task.cpus"] == str(node["vcpus"])
    container_mb = int(resources["spark.executor.memory"].removesuffix("m")) + int(
        resources["spark.executor.memoryOverhead"].removesuffix("m")
    )
    # The whole node but room for the application master, which may land on any core node.
    assert node["yarn_memory_mb"] * 0.8 <= container_mb <= node["yarn_memory_mb"] - 1024
    # The TensorFlow worker learns its memory, the executor's overhead, from the executor's environment.
    budget = resources[f"spark.executorEnv.{memory.WORKER_BUDGET_ENV}"]
    assert (
        budget
        == resources["spark.executor.memoryOverhead"].removesuffix("m")
        == str(emr_steps.train_executor_memory_mb(config)[1])
    )
    args = emr_steps.stage_step("train", config, RUN_ID)["HadoopJarStep"]["Args"]
    assert "spark.dynamicAllocation.enabled=false" in args and "spark.task.cpus=16" in args
    assert not any(
        arg.startswith("spark.task.cpus")
        for arg in emr_steps.stage_step("export", config, RUN_ID)["HadoopJarStep"]["Args"]
    )


def test_train_step_keeps_its_executor_sizes_and_fails_within_a_minute_without_a_node_per_worker():
    args = emr_steps.stage_step("train", emr_config(), RUN_ID)["HadoopJarStep"]["Args"]
    conf = dict(args[index + 1].split("=", 1) for index, arg in enumerate(args) if arg == "--conf")
    # EMR's heterogeneous executors would size them per node instead.
    assert conf["spark.yarn.heterogeneousExecutors.enabled"] == "false"
    interval = conf["spark.scheduler.barrier.maxConcurrentTasksCheck.interval"]
    checks = int(conf["spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures"])
    # Spark's defaults (15 s, 40 checks) give up only after 10 minutes.
    assert interval.endswith("s") and 30 <= int(interval.removesuffix("s")) * checks <= 90


def test_preprocessing_executors_leave_their_python_workers_the_nodes_memory():
    for core_type in ("m5.xlarge", "m5.4xlarge"):
        config = emr_config(f"emr.core_instance_type={core_type}")
        node = emr_cluster.instance_type(config, "core_instance_type")
        heap_mb, overhead_mb = emr_steps.train_executor_memory_mb(config)
        for stage in ("tokenize", "window", "positional_embed", "export"):
            args = emr_steps.stage_step(stage, config, RUN_ID)["HadoopJarStep"]["Args"]
            for setting in (
                f"spark.executor.cores={node['vcpus']}",
                f"spark.executor.memory={heap_mb}m",
                f"spark.executor.memoryOverhead={overhead_mb}m",
                "spark.yarn.heterogeneousExecutors.enabled=false",
            ):
                assert setting in args, (core_type, stage, setting)
        # Not Spark's default overhead, a tenth of the heap: three quarters of the node, near 2 GB per vCPU.
        assert overhead_mb >= 3 * heap_mb and overhead_mb / node["vcpus"] >= 1900
        assert heap_mb + overhead_mb == node["yarn_memory_mb"] - emr_steps.APPLICATION_MASTER_MB
    generate = emr_steps.stage_step("generate", emr_config(), RUN_ID)["HadoopJarStep"]["Args"]
    assert not any(arg.startswith("spark.executor.memoryOverhead") for arg in generate)


def test_train_step_limit_follows_the_training_budget():
    short, long = emr_config("train.max_steps=200"), emr_config("train.max_steps=20000", "emr.poke_interval_seconds=30")
    assert emr_steps.step_limit_seconds("window", short) == short.emr.step_timeout_minutes * 60
    short_train, long_train = emr_steps.step_limit_seconds("train", short), emr_steps.step_limit_seconds("train", long)
    budget = emr_steps.train_budget_steps(long) * long.emr.train_seconds_per_step
    assert long_train == long.emr.step_timeout_minutes * 60 + budget
    assert long_train > 10 * 3600 > short_train


def test_the_cluster_check_asks_for_the_train_steps_executors_within_a_few_minutes():
    """So that it places its tasks as training will, and what it finds of YARN is about them."""
    config = emr_config("emr.core_instance_count=3", "train.num_workers=3", "data.shards=6", "train.batch_size=30")
    check = emr_steps.stage_step(CLUSTER_CHECK.name, config, RUN_ID)["HadoopJarStep"]["Args"]
    train = emr_steps.stage_step("train", config, RUN_ID)["HadoopJarStep"]["Args"]
    settings = [arg for arg in train if arg.startswith("spark.") and "=" in arg]
    assert settings and all(setting in check for setting in settings)
    assert "spark.executor.instances=3" in check and check[-3].endswith("/spark_jobs/smoke.py")
    # Its limit is short and no setting lengthens it; the sensor allows it as any step's.
    for limits in (config, emr_config("train.max_steps=100000", "emr.step_timeout_minutes=120")):
        assert emr_steps.step_limit_seconds(CLUSTER_CHECK.name, limits) == emr_steps.SHORT_STEP_SECONDS <= 5 * 60
    assert (
        emr_steps.sensor_limits(CLUSTER_CHECK.name, config)["timeout"]
        < emr_steps.sensor_limits("window", config)["timeout"]
    )


@pytest.mark.parametrize("stage", EMR_STEP_NAMES)
def test_a_stage_sensor_waits_for_its_step_to_start_run_out_of_time_be_killed_and_be_seen(stage):
    """The sensor's clock starts before its step runs, so it outlasts the step's own limit: a
    step out of time is seen to fail (with its reason) before the sensor gives up."""
    config = emr_config("emr.poke_interval_seconds=45")
    limits = emr_steps.sensor_limits(stage, config)
    assert limits["poke_interval"] == 45
    assert limits["timeout"] == emr_steps.step_limit_seconds(stage, config) + emr_steps.STEP_KILL_AFTER_SECONDS + 2 * 45


def test_a_run_needing_longer_than_the_dags_sensors_is_stopped():
    dag_config = emr_config()
    emr_steps.check_sensor_limits(emr_config("train.max_steps=200"), dag_config)
    with pytest.raises(ConfigError, match="stage train needs a step time limit of .*: raise train.max_steps, "):
        emr_steps.check_sensor_limits(emr_config("train.max_steps=100000"), dag_config)
    # Other stages' limits depend on emr.step_timeout_minutes alone, and the message says so.
    with pytest.raises(ConfigError, match=r"stage tokenize needs .*: raise emr.step_timeout_minutes in pipeline.yaml"):
        emr_steps.check_sensor_limits(emr_config("emr.step_timeout_minutes=120"), dag_config)
    # Every kind of time limit the stage table gives names the settings that lengthen it.
    assert set(emr_steps.LIMIT_SETTINGS) == set(get_args(get_type_hints(Stage)["time_limit"]))


def test_the_train_time_limit_counts_the_last_evaluation_at_its_most():
    config = emr_config("train.max_steps=300", "train.eval_interval=100", "train.eval_batches=10")
    # 300 steps, two evaluations of 10 batches, and the last one over at most 200 batches
    assert emr_steps.train_budget_steps(config) == 300 + 2 * 10 + 200 == 300 + 20 + config.train.final_eval_max_batches
