"""The cluster request (include/emr_cluster.py) without AWS: the template filled in from the
config, the EMR API's own validation of it, and the instance table."""

from __future__ import annotations

import botocore.session
import pytest
from botocore.validate import validate_parameters

from include import emr_cluster, emr_code, emr_cost, emr_steps, emr_tasks
from pipeline.config import ConfigError
from pipeline.config_files import load_config
from tests.include.emr_configs import RUN_ID, emr_config


def test_cluster_request_follows_config():
    config = emr_config(
        "emr.core_instance_type=m5.4xlarge",
        "emr.core_instance_count=3",
        "emr.core_spot=true",
        "emr.idle_timeout_minutes=45",
    )
    request = emr_cluster.job_flow_overrides(config, RUN_ID)

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
    code = emr_code.code_uri(config, RUN_ID)
    assert code == f"s3://gpt-pipeline/code/{RUN_ID}"
    assert request["Name"] == f"gpt-pipeline-{RUN_ID}"
    (bootstrap,) = request["BootstrapActions"]
    assert bootstrap["ScriptBootstrapAction"]["Path"] == f"{code}/bootstrap.sh"
    assert bootstrap["ScriptBootstrapAction"]["Args"][0] == code
    tags = {tag["Key"]: tag["Value"] for tag in request["Tags"]}
    assert tags == {**config.emr.tags, "run_id": RUN_ID}
    assert "${" not in repr(request)


def test_spark_runs_the_bootstrapped_python():
    request = emr_cluster.job_flow_overrides(emr_config(), RUN_ID)
    venv = request["BootstrapActions"][0]["ScriptBootstrapAction"]["Args"][1]
    spark_env = next(item for item in request["Configurations"] if item["Classification"] == "spark-env")
    defaults = next(item for item in request["Configurations"] if item["Classification"] == "spark-defaults")
    assert spark_env["Configurations"][0]["Properties"]["PYSPARK_PYTHON"] == f"{venv}/bin/python"
    assert defaults["Properties"]["spark.pyspark.python"] == f"{venv}/bin/python"


def test_on_demand_core_nodes_by_default():
    request = emr_cluster.job_flow_overrides(emr_config(), RUN_ID)
    assert request["Instances"]["InstanceGroups"][1]["Market"] == "ON_DEMAND"


def valid_run_job_flow(request: dict) -> None:
    """Raises unless request is a RunJobFlow request by the EMR API's own model (as boto3 checks
    a request before sending it)."""
    model = botocore.session.get_session().get_service_model("emr").operation_model("RunJobFlow")
    validate_parameters(request, model.input_shape)


def test_optional_network_and_disk_settings_are_left_out_until_set():
    request = emr_cluster.job_flow_overrides(emr_config(), RUN_ID)
    valid_run_job_flow(request)
    assert not {"Ec2SubnetId", "Ec2KeyName"} & set(request["Instances"])
    assert "SecurityConfiguration" not in request
    assert "EbsConfiguration" not in request["Instances"]["InstanceGroups"][1]
    assert "None" not in repr(request)

    request = emr_cluster.job_flow_overrides(
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


def test_emr_managed_security_groups_reach_the_request_when_set():
    groups = {
        "master_security_group": "sg-0123456789abcdef0",
        "slave_security_group": "sg-0123456789abcdef1",
        "service_access_security_group": "sg-0123456789abcdef2",
    }
    request = emr_cluster.job_flow_overrides(emr_config(*(f"emr.{k}={v}" for k, v in groups.items())), RUN_ID)
    valid_run_job_flow(request)
    instances = request["Instances"]
    assert (
        instances["EmrManagedMasterSecurityGroup"],
        instances["EmrManagedSlaveSecurityGroup"],
        instances["ServiceAccessSecurityGroup"],
    ) == tuple(groups.values())
    assert not {"EmrManagedMasterSecurityGroup", "ServiceAccessSecurityGroup"} & set(
        emr_cluster.job_flow_overrides(emr_config(), RUN_ID)["Instances"]
    )
    with pytest.raises(ConfigError, match=r"emr.master_security_group: String should match pattern"):
        emr_config("emr.master_security_group=default")


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
        emr_cluster.job_flow_overrides(emr_config("emr.core_instance_type=x9.huge"), RUN_ID)
    with pytest.raises(
        ConfigError, match=r"emr.core_instance_type: 'x9.huge' is not in .*needed to size the executors"
    ):
        emr_steps.stage_step("tokenize", emr_config("emr.core_instance_type=x9.huge"), RUN_ID)
    # The master's prices the cluster, which a budget cannot be checked without.
    unpriced = emr_config("emr.master_instance_type=x9.huge", "emr.max_cost_usd=100")
    with pytest.raises(ConfigError, match=rf"emr.master_instance_type: 'x9.huge' is not in the instance_{how}"):
        emr_cost.check_budget(unpriced)
    with pytest.raises(
        ConfigError, match=r"emr.master_instance_type: 'x9.huge' is not in .*needed to price the cluster"
    ):
        emr_tasks.prepare(unpriced, RUN_ID, unpriced)


def test_unknown_template_placeholder_is_named():
    with pytest.raises(ConfigError, match=r"unknown placeholder \$\{emr.nope\}"):
        emr_cluster.fill({"a": ["x-${emr.nope}"]}, {"emr.release_label": "emr-7.12.0"})


def test_emr_target_needs_a_core_node_per_worker_and_an_s3_lake():
    with pytest.raises(ConfigError, match=r"emr.core_instance_count \(1\) must be at least train.num_workers \(2\)"):
        emr_config("emr.core_instance_count=1")
    with pytest.raises(ConfigError, match="lake must be an s3:// URI for target emr"):
        load_config(overrides=["target=emr"])


def yarn_site(request: dict) -> dict:
    (site,) = [item for item in request["Configurations"] if item["Classification"] == "yarn-site"]
    return site["Properties"]


@pytest.mark.parametrize("core_type, yarn_mb", [("m5.2xlarge", "24576"), ("m5.4xlarge", "57344")])
def test_the_cluster_sets_the_yarn_memory_the_executors_are_sized_from(core_type, yarn_mb):
    config = emr_config(f"emr.core_instance_type={core_type}")
    request = emr_cluster.job_flow_overrides(config, RUN_ID)
    valid_run_job_flow(request)

    assert yarn_site(request) == {
        "yarn.nodemanager.resource.memory-mb": yarn_mb,
        "yarn.scheduler.maximum-allocation-mb": yarn_mb,
    }
    heap_mb, overhead_mb = emr_steps.train_executor_memory_mb(config)
    assert heap_mb + overhead_mb + emr_steps.APPLICATION_MASTER_MB == int(yarn_mb)
    classifications = [item["Classification"] for item in request["Configurations"]]
    assert classifications == ["spark-env", "spark-defaults", "yarn-site"]  # the template's kept


def test_a_yarn_site_of_the_template_keeps_its_properties_and_gets_the_memory():
    template_site = {"Classification": "yarn-site", "Properties": {"yarn.log-aggregation-enable": "true"}}
    spark_defaults = {"Classification": "spark-defaults", "Properties": {"spark.ui.enabled": "false"}}
    node = {"yarn_memory_mb": 24576}

    merged = emr_cluster.with_yarn_memory([template_site, spark_defaults], "m5.2xlarge", node)

    assert merged == [
        {
            "Classification": "yarn-site",
            "Properties": {
                "yarn.log-aggregation-enable": "true",
                "yarn.nodemanager.resource.memory-mb": "24576",
                "yarn.scheduler.maximum-allocation-mb": "24576",
            },
        },
        spark_defaults,
    ]
    same = {"Classification": "yarn-site", "Properties": {"yarn.scheduler.maximum-allocation-mb": "24576"}}
    assert yarn_site({"Configurations": emr_cluster.with_yarn_memory([same], "m5.2xlarge", node)}) == {
        "yarn.scheduler.maximum-allocation-mb": "24576",
        "yarn.nodemanager.resource.memory-mb": "24576",
    }


def test_a_template_yarn_memory_other_than_the_instance_tables_is_refused_naming_it():
    other = {"Classification": "yarn-site", "Properties": {"yarn.nodemanager.resource.memory-mb": "20000"}}
    with pytest.raises(
        ConfigError,
        match=r"emr_cluster.yaml: job_flow.Configurations sets yarn-site yarn.nodemanager.resource.memory-mb to "
        r"'20000', but the executors are sized from the instance_types table's yarn_memory_mb of m5.2xlarge "
        r"\(24576\)",
    ):
        emr_cluster.with_yarn_memory([other], "m5.2xlarge", {"yarn_memory_mb": 24576})
