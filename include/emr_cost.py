"""What an EMR run's cluster costs, at the on-demand prices of the instance table
(include/emr_cluster.py): its hourly price, the most it can cost, which emr.max_cost_usd bounds
before the cluster exists, and the record collect keeps of its steps and its cost so far.
"""

from __future__ import annotations

from datetime import datetime, timezone

from include.emr_cluster import instance_type, read_template, startup_limits
from include.emr_steps import STEP_RETRIES, sensor_limits
from pipeline.config import ConfigError, PipelineConfig
from pipeline.config_files import defaults_path
from pipeline.stages import EMR_STEP_NAMES


def price_basis(config: PipelineConfig) -> str:
    """What the cost figures are: 'on-demand prices of us-east-1 as of 2026-11-22', and an upper
    bound with spot core nodes (emr.core_spot), whose price varies below the on-demand one."""
    prices = read_template()["prices"]
    basis = f"on-demand prices of {prices['region']} as of {prices['as_of']}"
    if config.emr.core_spot:
        basis += ", an upper bound with spot core nodes"
    return basis


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
    seconds += (1 + STEP_RETRIES) * sum(sensor_limits(stage, limits)["timeout"] for stage in EMR_STEP_NAMES)
    return round(seconds / 3600 + config.emr.idle_timeout_minutes / 60, 2)


def check_budget(config: PipelineConfig, dag_config: PipelineConfig | None = None) -> tuple[float, float]:
    """Stop a run whose cluster could cost more than emr.max_cost_usd, before it exists. The most
    is the on-demand price for the longest the cluster can live, which the DAG's step time limits
    bound. The budget is the DAG's too, a deployment setting no run changes (pipeline/deployment.py),
    and target emr needs one.
    Returns the hourly price and those hours."""
    deployment_budget = (dag_config or config).emr.max_cost_usd
    hourly, hours = hourly_cost_usd(config), max_cluster_hours(config, dag_config)
    if deployment_budget is None:
        raise ConfigError(
            f"emr.max_cost_usd: target emr needs a budget, and {defaults_path().name} sets none (null); the cluster "
            f"may cost up to about ${hourly * hours:,.2f} ({hours:.1f} hours at ${hourly:.2f} per hour, at "
            f"{price_basis(config)}): set emr.max_cost_usd there"
        )
    budget = lowest_budget(config.emr.max_cost_usd, deployment_budget)
    if hourly * hours > budget:
        raise ConfigError(
            f"emr.max_cost_usd: the cluster may cost up to about ${hourly * hours:,.2f}, more than the ${budget:,.2f} "
            f"allowed: {hours:.1f} hours (the start-up allowance, every step at its time limit in both tries, plus the "
            f"idle timeout) at ${hourly:.2f} per hour, at {price_basis(config)}; lower emr.core_instance_count or the "
            "instance types, or train.max_steps, emr.step_timeout_minutes or emr.startup_timeout_minutes in "
            f"{defaults_path().name} (the DAG's time limits come from there), or raise emr.max_cost_usd there"
        )
    return hourly, hours


def lowest_budget(*budgets: float | None) -> float:
    """The strictest of the budgets set (at least one is)."""
    return min(budget for budget in budgets if budget is not None)


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
