"""The EMR target's building blocks: the cluster request, the run's code on S3, one EMR step per
stage and the step sensors' time limits. Plain functions of the config; include/emr_tasks.py
turns them into Airflow tasks.

A run's code lives in s3://{emr.code_prefix}/{run_id}/: the stage entry files and spark_jobs.zip
(include/spark_submit.package_code), bootstrap.sh, and the Python requirements it installs, from
the wheels in s3://{emr.code_prefix}/wheelhouse/{requirements hash}/ (include/wheelhouse.py).
"""

from __future__ import annotations

import hashlib
import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from include.spark_submit import packaged_code, spark_submit_argv
from pipeline import corpus_files, lake, run_folder
from pipeline.config import REPO_ROOT, ConfigError, PipelineConfig
from pipeline.config_files import defaults_path
from pipeline.errors import PipelineError
from pipeline.stages import PREPROCESSING_STAGES, STAGE_NAMES
from spark_jobs.training import memory

CONFIG_DIR = REPO_ROOT / "include" / "config"
TEMPLATE_PATH = CONFIG_DIR / "emr_cluster.yaml"
# Files uploaded next to the code, under these names (bootstrap.sh reads the last two).
RUN_FILES = {
    "bootstrap.sh": CONFIG_DIR / "bootstrap.sh",
    "requirements-jobs.txt": REPO_ROOT / "spark_jobs" / "requirements.txt",
    "constraints.txt": REPO_ROOT / "requirements.txt",
}
WHEELHOUSE_FOLDER = "wheelhouse"
WHEELHOUSE_BUILD_COMMAND = "python -m include.wheelhouse build"
MASTER = "yarn"
# Client mode: the driver runs on the master node, so the core nodes are left whole for the
# training executors, and the driver's output (the stage's "ERROR [stage] ..." line) is the
# step's log in S3 (stdout.gz: spark-submit merges its Python driver's stderr into its stdout).
DEPLOY_MODE = "client"
STEP_KILL_AFTER_SECONDS = 60  # a step still there this long after its time limit's SIGTERM is killed
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")


def read_template() -> dict:
    return yaml.safe_load(TEMPLATE_PATH.read_text())


def code_uri(config: PipelineConfig, run_id: str) -> str:
    return lake.join(config.emr.code_prefix, run_id)


def requirements_hash() -> str:
    """What names a wheelhouse: a change to either requirements file needs another."""
    digest = hashlib.sha256()
    for path in requirement_files():
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def requirement_files() -> tuple[Path, Path]:
    """The jobs' requirements and their constraints, the project's complete pins."""
    return RUN_FILES["requirements-jobs.txt"], RUN_FILES["constraints.txt"]


def wheelhouse_uri(code_prefix: str, digest: str | None = None) -> str:
    """Where the nodes' wheels are: one folder per requirements hash, shared by the runs."""
    return lake.join(code_prefix, WHEELHOUSE_FOLDER, digest or requirements_hash())


def instance_type(config: PipelineConfig, field: str, template: dict | None = None) -> dict:
    """vCPUs, YARN memory and prices of emr.{field}, from the template's instance table."""
    name = getattr(config.emr, field)
    template = template or read_template()
    table = template["instance_types"]
    if name not in table:
        needed = (
            "to size the executors and price the cluster" if field == "core_instance_type" else "to price the cluster"
        )
        prices = template["prices"]
        raise ConfigError(
            f"emr.{field}: {name!r} is not in the instance_types table of {TEMPLATE_PATH.relative_to(REPO_ROOT)} "
            f"(known: {', '.join(table)}), which is needed {needed}: add it there with its vcpus, yarn_memory_mb "
            f"(EMR's yarn.nodemanager.resource.memory-mb for the type), ec2_usd_per_hour and emr_usd_per_hour "
            f"(on demand in {prices['region']}, as the table's prices.region and prices.as_of say)"
        )
    return table[name]


def price_basis(config: PipelineConfig) -> str:
    """What the cost figures are: 'on-demand prices of us-east-1 as of 2026-11-22', and an upper
    bound with spot core nodes (emr.core_spot), whose price varies below the on-demand one."""
    prices = read_template()["prices"]
    basis = f"on-demand prices of {prices['region']} as of {prices['as_of']}"
    if config.emr.core_spot:
        basis += ", an upper bound with spot core nodes"
    return basis


def fill(node: Any, values: dict[str, Any]) -> Any:
    """Replace ${name} placeholders in every string of a YAML tree. A key whose value comes out
    null (an optional setting left unset) is left out: RunJobFlow takes no nulls."""
    if isinstance(node, dict):
        filled = {key: fill(value, values) for key, value in node.items()}
        return {key: value for key, value in filled.items() if value is not None}
    if isinstance(node, list):
        return [fill(item, values) for item in node]
    if not isinstance(node, str):
        return node
    for name in PLACEHOLDER.findall(node):
        if name not in values:
            raise ConfigError(f"{TEMPLATE_PATH.name}: unknown placeholder ${{{name}}}")
    whole = PLACEHOLDER.fullmatch(node)
    if whole:
        return values[whole.group(1)]
    return PLACEHOLDER.sub(lambda match: str(values[match.group(1)]), node)


def job_flow_overrides(config: PipelineConfig, run_id: str) -> dict:
    """The RunJobFlow request for one run: the template filled in from the config."""
    template = read_template()
    instance_type(config, "master_instance_type", template)
    instance_type(config, "core_instance_type", template)
    tags = {**config.emr.tags, "run_id": run_id}
    values = {f"emr.{key}": value for key, value in config.emr.model_dump().items()}
    values |= {
        "run_id": run_id,
        "code_uri": code_uri(config, run_id),
        "venv": template["venv"],
        "wheelhouse_uri": wheelhouse_uri(config.emr.code_prefix),
        "core_market": "SPOT" if config.emr.core_spot else "ON_DEMAND",
        "core_ebs": core_ebs(config),
        "idle_timeout_seconds": config.emr.idle_timeout_minutes * 60,
        "tags": [{"Key": key, "Value": value} for key, value in tags.items()],
    }
    return fill(template["job_flow"], values)


def core_ebs(config: PipelineConfig) -> dict | None:
    """A core node's EBS volume when emr.core_ebs_gb is set. Each training worker copies its
    shards to its node's disk, so a large corpus may need more than the default volumes."""
    if config.emr.core_ebs_gb is None:
        return None
    volume = {"VolumeSpecification": {"VolumeType": "gp3", "SizeInGB": config.emr.core_ebs_gb}, "VolumesPerInstance": 1}
    return {"EbsBlockDeviceConfigs": [volume], "EbsOptimized": True}


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


def train_resources(config: PipelineConfig) -> dict[str, str]:
    """One executor per core node owning all its vCPUs, and one task per executor, so the barrier
    stage gets exactly one TensorFlow worker per node, or fails within about a minute when the
    cluster cannot place them all. TensorFlow runs in the Python worker, outside the JVM heap, so
    most of the container's memory is overhead."""
    _, overhead_mb = train_executor_memory_mb(config)
    return {
        **whole_node_executors(config),
        "spark.executor.instances": str(config.train.num_workers),
        "spark.task.cpus": str(instance_type(config, "core_instance_type")["vcpus"]),
        f"spark.executorEnv.{memory.WORKER_BUDGET_ENV}": str(overhead_mb),
        **BARRIER_SLOTS_CHECK,
    }


def preprocess_resources(config: PipelineConfig) -> dict[str, str]:
    """The preprocessing stages' executors: a whole core node each, as for training, so that the
    overhead holds the node's Python workers (one per vCPU, each reading whole Parquet parts)
    instead of YARN's default of a tenth of the heap, past which YARN kills the container."""
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


def step_resources(stage: str, config: PipelineConfig) -> dict[str, str]:
    """The executor settings of a stage's step, besides its own (include/spark_submit.stage_conf)."""
    if stage == "train":
        return train_resources(config)
    if stage in PREPROCESSING_STAGES:
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
        resources=step_resources(stage, config),
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
    limit = config.emr.step_timeout_minutes * 60
    if stage == "train":
        limit += math.ceil(train_budget_steps(config) * config.emr.train_seconds_per_step)
    return limit


def sensor_limits(stage: str, config: PipelineConfig) -> dict[str, int]:
    """EmrStepSensor's `timeout` and `poke_interval` for a stage's step. The sensor's clock starts
    before the step runs, so it allows a poke for the step to start, the step's own limit and its
    kill, and a poke to see it end: a step that runs out of time is seen to fail, with its reason."""
    poke = config.emr.poke_interval_seconds
    return {"timeout": step_limit_seconds(stage, config) + STEP_KILL_AFTER_SECONDS + 2 * poke, "poke_interval": poke}


def startup_limits(config: PipelineConfig) -> dict[str, int]:
    """The cluster sensor's `timeout` and `poke_interval`: start-up and bootstrap have their own
    allowance, so that no step's limit counts them."""
    return {"timeout": config.emr.startup_timeout_minutes * 60, "poke_interval": config.emr.poke_interval_seconds}


def check_sensor_limits(run_config: PipelineConfig, dag_config: PipelineConfig) -> None:
    """Sensor limits are fixed when the DAG is parsed; a run whose overrides (e.g. a larger
    train.max_steps) need more time is stopped before any cluster is created."""
    for stage in STAGE_NAMES:
        needed = step_limit_seconds(stage, run_config)
        allowed = step_limit_seconds(stage, dag_config)
        if needed > allowed:
            settings = "emr.step_timeout_minutes"
            if stage == "train":
                settings = (
                    "train.max_steps, train.eval_batches, emr.train_seconds_per_step or "
                    "emr.step_timeout_minutes, or lower train.eval_interval,"
                )
            raise ConfigError(
                f"stage {stage} needs a step time limit of {needed} s with this run's settings, but the DAG's "
                f"sensor allows {allowed} s: raise {settings} in {defaults_path().name}, which the DAG's sensors "
                "are set from"
            )


def hourly_cost_usd(config: PipelineConfig) -> float:
    """On-demand price of the cluster per hour (EC2 + EMR fee), its price_basis."""
    template = read_template()
    master, core = (instance_type(config, field, template) for field in ("master_instance_type", "core_instance_type"))
    master_usd = master["ec2_usd_per_hour"] + master["emr_usd_per_hour"]
    core_usd = core["ec2_usd_per_hour"] + core["emr_usd_per_hour"]
    return round(master_usd + config.emr.core_instance_count * core_usd, 4)


def max_cluster_hours(config: PipelineConfig, dag_config: PipelineConfig | None = None) -> float:
    """The longest a cluster can live: its start-up allowance, every step's sensor waiting its
    whole limit in each of its tries, then the idle timeout (in case Airflow is gone and no one
    terminates it). The limits in force are the DAG's (`dag_config`), set when Airflow parsed it;
    a run's own can only be lower."""
    limits = dag_config or config
    seconds = startup_limits(limits)["timeout"]
    seconds += (1 + STEP_RETRIES) * sum(sensor_limits(stage, limits)["timeout"] for stage in STAGE_NAMES)
    return round(seconds / 3600 + config.emr.idle_timeout_minutes / 60, 2)


def check_budget(config: PipelineConfig, dag_config: PipelineConfig | None = None) -> tuple[float, float]:
    """Stop a run whose cluster could cost more than emr.max_cost_usd, before it exists. The most
    is the on-demand price for the longest the cluster can live, which the DAG's step time limits
    bound. The budget is the DAG's too: a run may lower it for itself, not raise or clear it.
    Returns the hourly price and those hours."""
    budget = lowest_budget(config.emr.max_cost_usd, (dag_config or config).emr.max_cost_usd)
    hourly, hours = hourly_cost_usd(config), max_cluster_hours(config, dag_config)
    if budget is not None and hourly * hours > budget:
        raise ConfigError(
            f"emr.max_cost_usd: the cluster may cost up to about ${hourly * hours:,.2f}, more than the ${budget:,.2f} "
            f"allowed: {hours:.1f} hours (the start-up allowance, every step at its time limit in both tries, plus the "
            f"idle timeout) at ${hourly:.2f} per hour, at {price_basis(config)}; lower emr.core_instance_count or the "
            "instance types, or train.max_steps, emr.step_timeout_minutes or emr.startup_timeout_minutes in "
            f"{defaults_path().name} (the DAG's time limits come from there), or raise emr.max_cost_usd there"
        )
    return hourly, hours


def lowest_budget(*budgets: float | None) -> float | None:
    """The strictest of the budgets set (None: no budget)."""
    return min((budget for budget in budgets if budget is not None), default=None)


def cluster_record(emr_client, cluster_id: str, config: PipelineConfig) -> dict:
    """The run's cluster as EMR reports it: its steps (every try, oldest first) with their states
    and durations, and its hours and cost so far at on-demand prices (collect runs just before terminate)."""
    cluster = emr_client.describe_cluster(ClusterId=cluster_id)["Cluster"]
    pages = emr_client.get_paginator("list_steps").paginate(ClusterId=cluster_id)
    steps = [step for page in pages for step in page["Steps"]][::-1]
    timeline = cluster["Status"]["Timeline"]
    created = timeline["CreationDateTime"]
    hours = (datetime.now(timezone.utc) - created).total_seconds() / 3600
    return {
        "cluster_id": cluster_id,
        "release": cluster.get("ReleaseLabel"),
        "created": created.isoformat(),
        "ready": iso_time(timeline.get("ReadyDateTime")),  # start-up and bootstrap done
        "hours_so_far": round(hours, 2),
        "cost_usd_so_far": round(hours * hourly_cost_usd(config), 2),
        "cost_basis": price_basis(config),
        "steps": [step_record(step) for step in steps],
    }


def step_record(step: dict) -> dict:
    timeline = step["Status"].get("Timeline", {})
    started, ended = timeline.get("StartDateTime"), timeline.get("EndDateTime")
    seconds = round((ended - started).total_seconds(), 1) if started and ended else None
    return {
        "name": step["Name"],
        "id": step["Id"],
        "state": step["Status"]["State"],
        "seconds": seconds,
        "started": iso_time(started),
        "ended": iso_time(ended),
    }


def iso_time(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def split_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ConfigError(f"{uri} is not an s3:// URI")
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def corpus_objects(config: PipelineConfig, s3_hook) -> dict[str, int]:
    """Every corpus object on S3 with its size, matched as the tokenize stage matches them
    (corpus_files.expand: an object, a folder's objects, or globs), or a PipelineError naming the pattern
    that matched nothing: checked before a cluster is created."""
    found = {}
    for pattern in config.corpus:
        folder, globs = corpus_files.split_glob(pattern)
        # A name holding a glob's characters ('Hamlet [1603].txt') is taken as it is when it exists.
        matched = matching_objects(s3_hook, pattern, []) if globs else {}
        matched = matched or matching_objects(s3_hook, folder, globs)
        if not matched:
            raise PipelineError(f"corpus {pattern} matches no object on S3")
        found |= matched
    return dict(sorted(found.items()))


def matching_objects(s3_hook, folder: str, globs: list[str]) -> dict[str, int]:
    """{URI: size} of the object `folder` names, else of the objects below it that match `globs`
    (all of them for none)."""
    bucket, prefix = split_s3_uri(folder)
    prefix = prefix.rstrip("/")
    matched = {}
    for item in s3_hook.iter_file_metadata(prefix, bucket_name=bucket):
        key = item["Key"]
        relative = key[len(prefix) + 1 :] if prefix else key
        if key == prefix and not globs:
            return {f"s3://{bucket}/{key}": item["Size"]}
        below = not prefix or key.startswith(prefix + "/")
        if below and not key.endswith("/") and corpus_files.matches(relative.split("/"), globs or ["**"]):
            matched[f"s3://{bucket}/{key}"] = item["Size"]
    return matched


def upload_run(config: PipelineConfig, run_id: str, s3_client) -> None:
    """Upload the code, the bootstrap script and its requirements, then the resolved config
    (config.json in the run folder, written last: it marks the run as created)."""
    code = code_uri(config, run_id)
    with packaged_code() as folder:
        files = {file.relative_to(folder).as_posix(): file for file in folder.rglob("*") if file.is_file()}
        files |= RUN_FILES
        for name, path in sorted(files.items()):
            bucket, key = split_s3_uri(lake.join(code, name))
            s3_client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    bucket, key = split_s3_uri(lake.join(run_folder.run_dir(config, run_id), run_folder.CONFIG_FILE))
    s3_client.put_object(Bucket=bucket, Key=key, Body=config.to_json().encode("utf-8"))
