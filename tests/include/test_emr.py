"""The EMR target's building blocks without AWS: cluster request, steps, sensor limits, and the
Python environment the bootstrap script installs."""

from __future__ import annotations

import ast
import subprocess
import sys
from datetime import date
from importlib import metadata
from pathlib import Path

import botocore.session
import pytest
from botocore.validate import validate_parameters
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from include import emr, emr_tasks, report
from include.local_spark import LOOPBACK_CONF, local_argv
from pipeline import run_folder
from pipeline.config import REPO_ROOT, ConfigError
from pipeline.config_files import load_config
from pipeline.stages import STAGE_NAMES, by_name
from spark_jobs.training import memory

EMR_TARGET = ["target=emr", "lake=s3://test-lake/pipeline"]
# As the DAG passes it: Airflow's run id made a folder name once, by form_config (run_folder.safe_run_id).
RUN_ID = "tinyshakespeare-manual__2026-11-22T08_00_00_00_00"


def emr_config(*overrides: str):
    return load_config(overrides=EMR_TARGET + list(overrides))


def test_cluster_request_follows_config():
    config = emr_config(
        "emr.core_instance_type=m5.4xlarge",
        "emr.core_instance_count=3",
        "emr.core_spot=true",
        "emr.idle_timeout_minutes=45",
    )
    request = emr.job_flow_overrides(config, RUN_ID)

    assert request["ReleaseLabel"] == config.emr.release_label and request["ReleaseLabel"].startswith("emr-7.")
    assert [app["Name"] for app in request["Applications"]] == ["Spark"]
    master, core = request["Instances"]["InstanceGroups"]
    assert (master["InstanceRole"], master["InstanceType"], master["InstanceCount"], master["Market"]) == (
        "MASTER",
        "m5.xlarge",
        1,
        "ON_DEMAND",
    )
    assert (core["InstanceRole"], core["InstanceType"], core["InstanceCount"], core["Market"]) == (
        "CORE",
        "m5.4xlarge",
        3,
        "SPOT",
    )
    assert request["AutoTerminationPolicy"] == {"IdleTimeout": 45 * 60}
    assert request["LogUri"] == config.emr.log_uri
    assert (request["JobFlowRole"], request["ServiceRole"]) == (config.emr.job_flow_role, config.emr.service_role)
    code = emr.code_uri(config, RUN_ID)
    assert code == f"s3://gpt-pipeline/code/{RUN_ID}"
    assert request["Name"] == f"gpt-pipeline-{RUN_ID}"
    (bootstrap,) = request["BootstrapActions"]
    assert bootstrap["ScriptBootstrapAction"]["Path"] == f"{code}/bootstrap.sh"
    assert bootstrap["ScriptBootstrapAction"]["Args"][0] == code
    tags = {tag["Key"]: tag["Value"] for tag in request["Tags"]}
    assert tags == {**config.emr.tags, "run_id": RUN_ID}
    assert "${" not in repr(request)


def test_spark_runs_the_bootstrapped_python():
    request = emr.job_flow_overrides(emr_config(), RUN_ID)
    venv = request["BootstrapActions"][0]["ScriptBootstrapAction"]["Args"][1]
    spark_env = next(item for item in request["Configurations"] if item["Classification"] == "spark-env")
    defaults = next(item for item in request["Configurations"] if item["Classification"] == "spark-defaults")
    assert spark_env["Configurations"][0]["Properties"]["PYSPARK_PYTHON"] == f"{venv}/bin/python"
    assert defaults["Properties"]["spark.pyspark.python"] == f"{venv}/bin/python"


def test_on_demand_core_nodes_by_default():
    request = emr.job_flow_overrides(emr_config(), RUN_ID)
    assert request["Instances"]["InstanceGroups"][1]["Market"] == "ON_DEMAND"


def valid_run_job_flow(request: dict) -> None:
    """Raises unless request is a RunJobFlow request by the EMR API's own model (as boto3 checks
    a request before sending it)."""
    model = botocore.session.get_session().get_service_model("emr").operation_model("RunJobFlow")
    validate_parameters(request, model.input_shape)


def test_optional_network_and_disk_settings_are_left_out_until_set():
    request = emr.job_flow_overrides(emr_config(), RUN_ID)
    valid_run_job_flow(request)
    assert not {"Ec2SubnetId", "Ec2KeyName"} & set(request["Instances"])
    assert "SecurityConfiguration" not in request
    assert "EbsConfiguration" not in request["Instances"]["InstanceGroups"][1]
    assert "None" not in repr(request)

    request = emr.job_flow_overrides(
        emr_config(
            "emr.subnet_id=subnet-0123456789abcdef0",
            "emr.key_name=ml-team",
            "emr.core_ebs_gb=200",
            "emr.security_configuration=encrypted-at-rest",
        ),
        RUN_ID,
    )
    assert request["SecurityConfiguration"] == "encrypted-at-rest"
    valid_run_job_flow(request)
    assert (request["Instances"]["Ec2SubnetId"], request["Instances"]["Ec2KeyName"]) == (
        "subnet-0123456789abcdef0",
        "ml-team",
    )
    master, core = request["Instances"]["InstanceGroups"]
    assert core["EbsConfiguration"]["EbsBlockDeviceConfigs"] == [
        {"VolumeSpecification": {"VolumeType": "gp3", "SizeInGB": 200}, "VolumesPerInstance": 1}
    ]
    assert "EbsConfiguration" not in master


def test_a_subnet_that_is_no_subnet_id_is_named():
    with pytest.raises(ConfigError, match=r"emr.subnet_id: String should match pattern .* \(got 'vpc-0123abcd'\)"):
        emr_config("emr.subnet_id=vpc-0123abcd")


def test_unknown_instance_type_is_named_with_how_to_add_it():
    how = (
        r"types table of include/config/emr_cluster.yaml .*: add it there with its vcpus, yarn_memory_mb .*"
        r"ec2_usd_per_hour and emr_usd_per_hour \(on demand in us-east-1, "
        r"as the table's prices.region and prices.as_of say\)"
    )
    # The core nodes' type sizes the executors: needed with or without a budget.
    with pytest.raises(ConfigError, match=rf"emr.core_instance_type: 'x9.huge' is not in the instance_{how}"):
        emr.job_flow_overrides(emr_config("emr.core_instance_type=x9.huge"), RUN_ID)
    with pytest.raises(
        ConfigError, match=r"emr.core_instance_type: 'x9.huge' is not in .*needed to size the executors"
    ):
        emr.stage_step("tokenize", emr_config("emr.core_instance_type=x9.huge"), RUN_ID)
    # The master's prices the cluster, which a budget cannot be checked without.
    unpriced = emr_config("emr.master_instance_type=x9.huge", "emr.max_cost_usd=100")
    with pytest.raises(ConfigError, match=rf"emr.master_instance_type: 'x9.huge' is not in the instance_{how}"):
        emr.check_budget(unpriced)
    with pytest.raises(
        ConfigError, match=r"emr.master_instance_type: 'x9.huge' is not in .*needed to price the cluster"
    ):
        emr_tasks.prepare(unpriced, RUN_ID, unpriced)


def test_unknown_template_placeholder_is_named():
    with pytest.raises(ConfigError, match=r"unknown placeholder \$\{emr.nope\}"):
        emr.fill({"a": ["x-${emr.nope}"]}, {"emr.release_label": "emr-7.12.0"})


def test_emr_target_needs_a_core_node_per_worker_and_an_s3_lake():
    with pytest.raises(ConfigError, match=r"emr.core_instance_count \(1\) must be at least train.num_workers \(2\)"):
        emr_config("emr.core_instance_count=1")
    with pytest.raises(ConfigError, match="lake must be an s3:// URI for target emr"):
        load_config(overrides=["target=emr"])


def test_steps_run_each_stage_with_spark_submit_on_yarn():
    config = emr_config()
    for stage in STAGE_NAMES:
        step = emr.stage_step(stage, config, RUN_ID)
        args = step["HadoopJarStep"]["Args"]
        assert step["Name"] == stage and step["HadoopJarStep"]["Jar"] == "command-runner.jar"
        # The step ends itself at its task's time limit (coreutils' timeout), whether or not Airflow is there.
        limit = emr.step_limit_seconds(stage, config)
        assert args[:3] == ["timeout", "--kill-after=60", str(limit)] and emr.step_time_limit(step) == limit
        args = args[3:]
        assert args[:5] == ["spark-submit", "--master", "yarn", "--deploy-mode", "client"]
        assert args[-3:] == [
            f"{emr.code_uri(config, RUN_ID)}/spark_jobs/{by_name(stage).app_file}",
            "--run-dir",
            run_folder.run_dir(config, RUN_ID),
        ]
        # Every core node's vCPUs (2 m5.2xlarge: 8 each), not the executors that happen to be up when a stage plans.
        if stage != "train":  # train: one task per worker node
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
    resources = emr.train_resources(config) | emr.preprocess_resources(config) | LOOPBACK_CONF
    for stage in STAGE_NAMES:
        local = local_argv(stage, local_config, local_run, code_dir)
        remote = emr.stage_step(stage, config, RUN_ID)["HadoopJarStep"]["Args"][3:]  # after the time limit
        assert Path(local[0]).name == remote[0] == "spark-submit"
        assert normalised(local, str(code_dir), local_run, resources) == normalised(
            remote, emr.code_uri(config, RUN_ID), emr_run, resources
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
    node = emr.instance_type(config, "core_instance_type")
    resources = emr.train_resources(config)
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
        == str(emr.train_executor_memory_mb(config)[1])
    )
    args = emr.stage_step("train", config, RUN_ID)["HadoopJarStep"]["Args"]
    assert "spark.dynamicAllocation.enabled=false" in args and "spark.task.cpus=16" in args
    assert not any(
        arg.startswith("spark.task.cpus") for arg in emr.stage_step("export", config, RUN_ID)["HadoopJarStep"]["Args"]
    )


def test_train_step_keeps_its_executor_sizes_and_fails_within_a_minute_without_a_node_per_worker():
    args = emr.stage_step("train", emr_config(), RUN_ID)["HadoopJarStep"]["Args"]
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
        node = emr.instance_type(config, "core_instance_type")
        heap_mb, overhead_mb = emr.train_executor_memory_mb(config)
        for stage in ("tokenize", "window", "positional_embed", "export"):
            args = emr.stage_step(stage, config, RUN_ID)["HadoopJarStep"]["Args"]
            for setting in (
                f"spark.executor.cores={node['vcpus']}",
                f"spark.executor.memory={heap_mb}m",
                f"spark.executor.memoryOverhead={overhead_mb}m",
                "spark.yarn.heterogeneousExecutors.enabled=false",
            ):
                assert setting in args, (core_type, stage, setting)
        # Not Spark's default overhead, a tenth of the heap: three quarters of the node, near 2 GB per vCPU.
        assert overhead_mb >= 3 * heap_mb and overhead_mb / node["vcpus"] >= 1900
        assert heap_mb + overhead_mb == node["yarn_memory_mb"] - emr.APPLICATION_MASTER_MB
    generate = emr.stage_step("generate", emr_config(), RUN_ID)["HadoopJarStep"]["Args"]
    assert not any(arg.startswith("spark.executor.memoryOverhead") for arg in generate)


def test_train_step_limit_follows_the_training_budget():
    short, long = emr_config("train.max_steps=200"), emr_config("train.max_steps=20000", "emr.poke_interval_seconds=30")
    assert emr.step_limit_seconds("window", short) == short.emr.step_timeout_minutes * 60
    short_train, long_train = emr.step_limit_seconds("train", short), emr.step_limit_seconds("train", long)
    budget = emr.train_budget_steps(long) * long.emr.train_seconds_per_step
    assert long_train == long.emr.step_timeout_minutes * 60 + budget
    assert long_train > 10 * 3600 > short_train


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_a_stage_sensor_waits_for_its_step_to_start_run_out_of_time_be_killed_and_be_seen(stage):
    """The sensor's clock starts before its step runs, so it outlasts the step's own limit: a
    step out of time is seen to fail (with its reason) before the sensor gives up."""
    config = emr_config("emr.poke_interval_seconds=45")
    limits = emr.sensor_limits(stage, config)
    assert limits["poke_interval"] == 45
    assert limits["timeout"] == emr.step_limit_seconds(stage, config) + emr.STEP_KILL_AFTER_SECONDS + 2 * 45


def test_cluster_start_up_has_its_own_allowance_counted_in_the_clusters_longest_life():
    short, long = emr_config("emr.startup_timeout_minutes=10"), emr_config("emr.startup_timeout_minutes=70")
    assert emr.startup_limits(long) == {"timeout": 70 * 60, "poke_interval": long.emr.poke_interval_seconds}
    assert emr.max_cluster_hours(long) == pytest.approx(emr.max_cluster_hours(short) + 1, abs=0.01)
    # no step's limit counts it
    assert emr.step_limit_seconds("tokenize", long) == emr.step_limit_seconds("tokenize", short)


def test_a_run_needing_longer_than_the_dags_sensors_is_stopped():
    dag_config = emr_config()
    emr.check_sensor_limits(emr_config("train.max_steps=200"), dag_config)
    with pytest.raises(ConfigError, match="stage train needs a step time limit of .*: raise train.max_steps, "):
        emr.check_sensor_limits(emr_config("train.max_steps=100000"), dag_config)
    # Other stages' limits depend on emr.step_timeout_minutes alone, and the message says so.
    with pytest.raises(ConfigError, match=r"stage tokenize needs .*: raise emr.step_timeout_minutes in pipeline.yaml"):
        emr.check_sensor_limits(emr_config("emr.step_timeout_minutes=120"), dag_config)


def test_the_train_time_limit_counts_the_last_evaluation_at_its_most():
    config = emr_config("train.max_steps=300", "train.eval_interval=100", "train.eval_batches=10")
    # 300 steps, two evaluations of 10 batches, and the last one over at most 200 batches
    assert emr.train_budget_steps(config) == 300 + 2 * 10 + 200 == 300 + 20 + config.train.final_eval_max_batches


def test_the_emr_docs_state_the_default_cluster_price():
    cost = emr.hourly_cost_usd(load_config())
    docs = (REPO_ROOT / "docs" / "emr.md").read_text()
    assert f"${cost:.2f} per hour" in docs


# --- the Python environment of the EMR nodes ---------------------------------------------------


def pins(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    requirements = [Requirement(line) for line in lines if line]
    return {canonicalize_name(req.name): str(req.specifier) for req in requirements}


def test_jobs_requirements_are_pinned_like_the_project():
    jobs = pins(emr.RUN_FILES["requirements-jobs.txt"])
    project = pins(emr.RUN_FILES["constraints.txt"])
    assert "pyspark" not in jobs, "the cluster's Spark provides pyspark"
    for name, spec in jobs.items():
        assert spec.startswith("=="), f"{name} is not pinned"
        assert project.get(name) == spec, f"{name}{spec} differs from requirements.txt ({project.get(name)})"


def third_party_imports(folder: Path) -> set[str]:
    local = {"spark_jobs", "include"}
    names = set()
    for file in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {name for name in names - local if name not in sys.stdlib_module_names}


def dependency_closure(names: set[str]) -> set[str]:
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return seen


def test_everything_the_jobs_import_is_installed_by_the_bootstrap():
    installed = dependency_closure(set(pins(emr.RUN_FILES["requirements-jobs.txt"]))) | {"pyspark", "py4j"}
    providers = metadata.packages_distributions()
    imports = third_party_imports(REPO_ROOT / "spark_jobs")
    assert {"pyarrow", "pydantic", "yaml"} <= imports
    for module in imports:
        distributions = {canonicalize_name(name) for name in providers.get(module, [])}
        assert distributions, f"spark_jobs imports {module}, which no installed distribution provides"
        assert distributions & installed, (
            f"spark_jobs imports {module} ({distributions}): add it to spark_jobs/requirements.txt"
        )


def test_bootstrap_script_reads_the_files_uploaded_with_the_code():
    """Its run on a node, offline from a wheelhouse, is tests/include/test_wheelhouse.py's."""
    script = emr.RUN_FILES["bootstrap.sh"]
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for name in ("requirements-jobs.txt", "constraints.txt"):
        assert f'"$code_uri/{name}"' in text and name in emr.RUN_FILES
    assert '--no-index --find-links "$work/wheels"' in text
    assert '-r "$work/requirements-jobs.txt" -c "$work/constraints.txt"' in text


def test_longest_cluster_life_grows_with_the_training_budget():
    short, long = emr_config("train.max_steps=200"), emr_config("train.max_steps=20000")
    tries = 1 + emr.STEP_RETRIES  # a step that fails just before its limit runs once more
    extra_hours = (
        tries * (emr.sensor_limits("train", long)["timeout"] - emr.sensor_limits("train", short)["timeout"]) / 3600
    )
    assert emr.max_cluster_hours(long) == pytest.approx(emr.max_cluster_hours(short) + extra_hours, abs=0.01)
    assert emr.max_cluster_hours(short) > tries * len(STAGE_NAMES) * short.emr.step_timeout_minutes / 60


def test_a_run_that_could_cost_more_than_the_budget_stops_before_its_cluster_exists():
    most = emr.hourly_cost_usd(emr_config()) * emr.max_cluster_hours(emr_config())
    emr.check_budget(emr_config(f"emr.max_cost_usd={most + 0.01}"))  # within the budget
    emr.check_budget(emr_config())  # no budget set
    with pytest.raises(
        ConfigError, match=rf"emr.max_cost_usd: the cluster may cost up to about \${most:,.2f}, more than the \$10.00"
    ):
        emr_tasks.prepare(emr_config("emr.max_cost_usd=10"), RUN_ID, emr_config())  # before it uploads anything
    # A run's shorter time limits do not shorten the DAG's sensors, which were set when it was parsed.
    shorter = emr_config("emr.step_timeout_minutes=10", "train.max_steps=100", f"emr.max_cost_usd={most - 1}")
    assert emr.hourly_cost_usd(shorter) * emr.max_cluster_hours(shorter) < most - 1
    with pytest.raises(ConfigError, match=rf"may cost up to about \${most:,.2f}, "):
        emr_tasks.prepare(shorter, RUN_ID, emr_config())
    # The DAG's budget binds every run: a run's form cannot raise or clear it, only lower it.
    capped = emr_config(f"emr.max_cost_usd={most - 1}")
    for raised in (emr_config(f"emr.max_cost_usd={most * 100}"), emr_config("emr.max_cost_usd=null")):
        with pytest.raises(ConfigError, match=rf"more than the \${most - 1:,.2f} allowed"):
            emr_tasks.prepare(raised, RUN_ID, capped)


def test_cost_figures_say_they_are_on_demand_prices_of_the_tables_region_and_date():
    prices = emr.read_template()["prices"]
    assert prices["region"] == "us-east-1" and date.fromisoformat(prices["as_of"])
    basis = f"on-demand prices of us-east-1 as of {prices['as_of']}"
    assert emr.price_basis(emr_config()) == basis
    spot = emr_config("emr.core_spot=true")
    assert emr.price_basis(spot) == f"{basis}, an upper bound with spot core nodes"
    with pytest.raises(ConfigError, match=rf"per hour, at {basis}, an upper bound with spot core nodes; lower "):
        emr.check_budget(emr_config("emr.core_spot=true", "emr.max_cost_usd=1"))
    record = {"cluster_id": "j-1", "release": "emr-7.12.0", "created": "2026-11-22T08:00:00+00:00", "steps": []}
    record |= {"hours_so_far": 0.5, "cost_usd_so_far": 0.6, "cost_basis": emr.price_basis(spot)}
    assert f"about $0.60 at {basis}, an upper bound with spot core nodes when collect ran" in report.emr_text(record)
    docs = (REPO_ROOT / "docs" / "emr.md").read_text()
    assert f"on demand in us-east-1 as of {prices['as_of']}" in docs


def test_pip_resolves_the_jobs_requirements_within_the_pinned_environment():
    """The bootstrap's pip command, offline against this environment: it must resolve (no pin
    conflicts with the constraints) and need nothing this tested environment lacks."""
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--disable-pip-version-check",
            "-r",
            str(emr.RUN_FILES["requirements-jobs.txt"]),
            "-c",
            str(emr.RUN_FILES["constraints.txt"]),
        ],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stderr
    assert "Would install" not in completed.stdout, completed.stdout


class FakeEmr:
    """Just enough of EmrHook for a stage task: the cluster's steps (ListSteps answers newest first,
    in pages) and the steps added."""

    def __init__(self, steps: list[tuple[str, str]]):
        self.steps = [
            {"Id": f"s-{index}", "Name": name, "Status": {"State": state}} for index, (name, state) in enumerate(steps)
        ]
        self.added: list[str] = []
        self.conn = self

    def get_paginator(self, operation: str):
        assert operation == "list_steps"
        return self

    def paginate(self, ClusterId: str):  # noqa: N803 - boto3's name
        newest_first = list(reversed(self.steps))
        return [{"Steps": newest_first[:2]}, {"Steps": newest_first[2:]}]

    def add_job_flow_steps(self, job_flow_id: str, steps: list[dict]) -> list[str]:
        self.added += [step["Name"] for step in steps]
        return [f"s-new-{len(self.added)}"]

    def describe_cluster(self, ClusterId: str) -> dict:  # noqa: N803 - boto3's name
        return {"Cluster": {"Status": {"State": "WAITING"}}}


class FakeStoredRun:
    def __init__(self):
        self.removed: list[str] = []

    def remove(self, relative: str) -> None:
        self.removed.append(relative)


@pytest.mark.parametrize(
    "steps, try_number, waits_on, adds",
    [
        ([], 1, "s-new-1", "window"),  # the first poke of the first try adds the step
        ([("window", "RUNNING")], 1, "s-0", None),  # later pokes wait on it
        ([("window", "FAILED")], 1, "s-0", None),  # ... and see it failed: the try fails
        ([("window", "FAILED")], 2, "s-new-1", "window (try 2)"),  # the retry adds it again
        ([("window", "FAILED"), ("window (try 2)", "PENDING")], 2, "s-1", None),
        ([("window", "RUNNING")], 2, "s-0", None),  # the try's task failed, not its step: wait on it
        ([("window", "COMPLETED")], 2, "s-0", None),
        ([("window", "FAILED"), ("window (try 2)", "FAILED")], 3, "s-new-1", "window (try 3)"),
        (
            [("tokenize", "COMPLETED"), ("window", "RUNNING"), ("export", "FAILED")],
            2,
            "s-1",
            None,
        ),  # other stages' steps do not count
    ],
)
def test_a_stage_task_adds_a_step_only_when_its_try_has_none_to_wait_on(steps, try_number, waits_on, adds):
    sensor = emr_tasks.EmrStageSensor(
        task_id="window",
        stage="window",
        step={"Name": "window", "HadoopJarStep": {}},
        run_dir="s3://lake/runs/r",
        job_flow_id="j-1",
    )
    sensor.__dict__["hook"] = cluster = FakeEmr(steps)  # in place of the cached EmrHook
    run = FakeStoredRun()
    sensor.stored_run = lambda: run
    assert sensor.current_step(emr_tasks.step_name("window", try_number)) == waits_on
    assert cluster.added == ([adds] if adds else [])
    assert run.removed == (
        [run_folder.error_path("window")] if adds else []
    )  # a new step starts without an earlier try's error


def test_training_progress_reads_as_a_line_of_the_task_log():
    progress = {
        "step": 40,
        "max_steps": 300,
        "loss": 4.5,
        "tokens_per_s": 25474,
        "seconds_left": 20,
        "updated_at": "2026-11-22T10:00:00Z",
    }
    assert emr_tasks.describe_progress(progress) == (
        "step 40 of 300 (13%), loss 4.5000, 25,474 tokens/s, under a minute left (at 2026-11-22T10:00:00Z)"
    )
    assert "about 2 min left" in emr_tasks.describe_progress({**progress, "seconds_left": 130})
