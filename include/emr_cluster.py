"""The EMR cluster of a run: the RunJobFlow request, which is the template
include/config/emr_cluster.yaml filled in from the config; the template's instance table (each
type's vCPUs, YARN memory and prices), which sizes the executors (include/emr_steps.py), sets the
core nodes' YARN memory in the request, and prices the cluster (include/emr_cost.py); the allowance
for the cluster to start and bootstrap; and the run's clusters, found again by their tag.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from include.emr_code import code_uri, wheelhouse_uri
from pipeline.config import REPO_ROOT, ConfigError, PipelineConfig

TEMPLATE_PATH = REPO_ROOT / "include" / "config" / "emr_cluster.yaml"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")
RUN_TAG = "run_id"  # the cluster's tag naming its run, which finds the run's cluster again
ACTIVE_STATES = ("STARTING", "BOOTSTRAPPING", "RUNNING", "WAITING")
YARN_SITE = "yarn-site"
# The memory a node's YARN offers containers, and the largest container it grants: both set to the
# core type's yarn_memory_mb, which the executors are sized from, so that the two cannot disagree.
YARN_MEMORY_PROPERTIES = ("yarn.nodemanager.resource.memory-mb", "yarn.scheduler.maximum-allocation-mb")


def read_template() -> dict:
    return yaml.safe_load(TEMPLATE_PATH.read_text())


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
    """The RunJobFlow request for one run: the template filled in from the config, with the core
    nodes' YARN memory set in its Configurations."""
    template = read_template()
    instance_type(config, "master_instance_type", template)
    core = instance_type(config, "core_instance_type", template)
    tags = {**config.emr.tags, RUN_TAG: run_id}
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
    request = fill(template["job_flow"], values)
    request["Configurations"] = with_yarn_memory(request.get("Configurations", []), config.emr.core_instance_type, core)
    return request


def yarn_memory(node: dict) -> dict[str, str]:
    """yarn-site's memory properties for nodes of a type of the instance table (RunJobFlow takes
    strings only)."""
    return dict.fromkeys(YARN_MEMORY_PROPERTIES, str(node["yarn_memory_mb"]))


def with_yarn_memory(configurations: list[dict], core_type: str, node: dict) -> list[dict]:
    """`configurations` with the core type's YARN memory merged into the template's yarn-site
    classification (added when it has none). The template setting one of those properties to
    another value is refused: the executors are sized from the instance table, and YARN would
    refuse containers larger than it grants, or leave memory no executor uses."""
    pinned = yarn_memory(node)
    sites = [item for item in configurations if item.get("Classification") == YARN_SITE]
    for site in sites:
        refuse_other_yarn_memory(site.get("Properties", {}), pinned, core_type)
    if not sites:
        return [*configurations, {"Classification": YARN_SITE, "Properties": pinned}]
    first = sites[0]
    merged = {**first, "Properties": {**first.get("Properties", {}), **pinned}}
    return [merged if item is first else item for item in configurations]


def refuse_other_yarn_memory(properties: dict, pinned: dict[str, str], core_type: str) -> None:
    for name, value in pinned.items():
        if name in properties and str(properties[name]) != value:
            raise ConfigError(
                f"{TEMPLATE_PATH.name}: job_flow.Configurations sets {YARN_SITE} {name} to {properties[name]!r}, "
                f"but the executors are sized from the instance_types table's yarn_memory_mb of {core_type} "
                f"({value}), which the cluster is set to: change yarn_memory_mb there and leave {name} out"
            )


def core_ebs(config: PipelineConfig) -> dict | None:
    """A core node's EBS volume when emr.core_ebs_gb is set. Each training worker copies its
    shards to its node's disk, so a large corpus may need more than the default volumes."""
    if config.emr.core_ebs_gb is None:
        return None
    volume = {"VolumeSpecification": {"VolumeType": "gp3", "SizeInGB": config.emr.core_ebs_gb}, "VolumesPerInstance": 1}
    return {"EbsBlockDeviceConfigs": [volume], "EbsOptimized": True}


def startup_limits(config: PipelineConfig) -> dict[str, int]:
    """The cluster sensor's `timeout` and `poke_interval`: start-up and bootstrap have their own
    allowance, so that no step's limit counts them."""
    return {"timeout": config.emr.startup_timeout_minutes * 60, "poke_interval": config.emr.poke_interval_seconds}


def run_tag(request: dict) -> str | None:
    """The value of the run's tag in a RunJobFlow request."""
    return next((tag["Value"] for tag in request.get("Tags", []) if tag["Key"] == RUN_TAG), None)


def request_run_clusters(emr_client, request) -> list[str]:
    """The active clusters tagged with the run of a RunJobFlow request; none when there is no
    request (its XCom missing) or it names no run."""
    tag_value = run_tag(request) if isinstance(request, dict) else None
    return active_run_clusters(emr_client, tag_value) if tag_value else []


def active_run_clusters(emr_client, tag_value: str) -> list[str]:
    """The ids of the active clusters (starting to waiting) tagged with this run."""
    pages = emr_client.get_paginator("list_clusters").paginate(ClusterStates=list(ACTIVE_STATES))
    found = []
    for summary in (cluster for page in pages for cluster in page["Clusters"]):
        tags = emr_client.describe_cluster(ClusterId=summary["Id"])["Cluster"].get("Tags", [])
        if {"Key": RUN_TAG, "Value": tag_value} in tags:
            found.append(summary["Id"])
    return found
