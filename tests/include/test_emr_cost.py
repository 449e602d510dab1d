"""What a cluster costs (include/emr_cost.py): its price, the longest it can live, the budget
checked before it exists, and the cost figures' basis."""

from __future__ import annotations

from datetime import date

import pytest

from include import emr_cluster, emr_cost, emr_steps, emr_tasks, report
from pipeline.config import REPO_ROOT, ConfigError
from pipeline.config_files import load_config
from pipeline.stages import STAGE_NAMES
from tests.include.emr_configs import RUN_ID, emr_config


def test_cluster_start_up_has_its_own_allowance_counted_in_the_clusters_longest_life():
    short, long = emr_config("emr.startup_timeout_minutes=10"), emr_config("emr.startup_timeout_minutes=70")
    assert emr_cluster.startup_limits(long) == {"timeout": 70 * 60, "poke_interval": long.emr.poke_interval_seconds}
    assert emr_cost.max_cluster_hours(long) == pytest.approx(emr_cost.max_cluster_hours(short) + 1, abs=0.01)
    # no step's limit counts it
    assert emr_steps.step_limit_seconds("tokenize", long) == emr_steps.step_limit_seconds("tokenize", short)


def test_the_emr_docs_state_the_default_cluster_price():
    cost = emr_cost.hourly_cost_usd(load_config())
    docs = (REPO_ROOT / "docs" / "emr.md").read_text()
    assert f"${cost:.2f} per hour" in docs


def test_longest_cluster_life_grows_with_the_training_budget():
    short, long = emr_config("train.max_steps=200"), emr_config("train.max_steps=20000")
    tries = 1 + emr_steps.STEP_RETRIES  # a step that fails just before its limit runs once more
    extra_hours = (
        tries
        * (emr_steps.sensor_limits("train", long)["timeout"] - emr_steps.sensor_limits("train", short)["timeout"])
        / 3600
    )
    assert emr_cost.max_cluster_hours(long) == pytest.approx(emr_cost.max_cluster_hours(short) + extra_hours, abs=0.01)
    assert emr_cost.max_cluster_hours(short) > tries * len(STAGE_NAMES) * short.emr.step_timeout_minutes / 60


def test_a_run_that_could_cost_more_than_the_budget_stops_before_its_cluster_exists():
    most = emr_cost.hourly_cost_usd(emr_config()) * emr_cost.max_cluster_hours(emr_config())
    emr_cost.check_budget(emr_config(f"emr.max_cost_usd={most + 0.01}"))  # within the budget
    emr_cost.check_budget(emr_config())  # the default budget
    with pytest.raises(
        ConfigError, match=rf"emr.max_cost_usd: the cluster may cost up to about \${most:,.2f}, more than the \$10.00"
    ):
        emr_tasks.prepare(emr_config("emr.max_cost_usd=10"), RUN_ID, emr_config())  # before it uploads anything
    # A run's shorter time limits do not shorten the DAG's sensors, which were set when it was parsed.
    shorter = emr_config("emr.step_timeout_minutes=10", "train.max_steps=100", f"emr.max_cost_usd={most - 1}")
    assert emr_cost.hourly_cost_usd(shorter) * emr_cost.max_cluster_hours(shorter) < most - 1
    with pytest.raises(ConfigError, match=rf"may cost up to about \${most:,.2f}, "):
        emr_tasks.prepare(shorter, RUN_ID, emr_config())
    # The DAG's budget binds every run: a run's form cannot raise or clear it, only lower it.
    capped = emr_config(f"emr.max_cost_usd={most - 1}")
    for raised in (emr_config(f"emr.max_cost_usd={most * 100}"), emr_config("emr.max_cost_usd=null")):
        with pytest.raises(ConfigError, match=rf"more than the \${most - 1:,.2f} allowed"):
            emr_tasks.prepare(raised, RUN_ID, capped)


def test_target_emr_needs_a_budget_and_a_run_cannot_clear_it():
    unbounded = emr_config("emr.max_cost_usd=null")
    with pytest.raises(ConfigError, match=r"^emr.max_cost_usd: target emr needs a budget, and pipeline.yaml sets none"):
        emr_tasks.prepare(unbounded, RUN_ID, unbounded)  # before it uploads anything
    emr_cost.check_budget(unbounded, emr_config())  # a run's null: the DAG's budget applies


def test_core_nodes_and_idle_timeout_are_bounded():
    with pytest.raises(
        ConfigError, match=r"emr.core_instance_count \(100\) exceeds emr.max_core_instances \(10\), the deployment"
    ):
        emr_config("emr.core_instance_count=100")
    assert emr_config("emr.max_core_instances=100", "emr.core_instance_count=100").emr.core_instance_count == 100
    with pytest.raises(ConfigError, match=r"emr.idle_timeout_minutes: Input should be less than or equal to 120"):
        emr_config("emr.idle_timeout_minutes=10080")


def test_cost_figures_say_they_are_on_demand_prices_of_the_tables_region_and_date():
    prices = emr_cluster.read_template()["prices"]
    assert prices["region"] == "us-east-1" and date.fromisoformat(prices["as_of"])
    basis = f"on-demand prices of us-east-1 as of {prices['as_of']}"
    assert emr_cost.price_basis(emr_config()) == basis
    spot = emr_config("emr.core_spot=true")
    assert emr_cost.price_basis(spot) == f"{basis}, an upper bound with spot core nodes"
    with pytest.raises(ConfigError, match=rf"per hour, at {basis}, an upper bound with spot core nodes; lower "):
        emr_cost.check_budget(emr_config("emr.core_spot=true", "emr.max_cost_usd=1"))
    record = {"cluster_id": "j-1", "release": "emr-7.12.0", "created": "2026-11-22T08:00:00+00:00", "steps": []}
    record |= {"hours_so_far": 0.5, "cost_usd_so_far": 0.6, "cost_basis": emr_cost.price_basis(spot)}
    assert f"about $0.60 at {basis}, an upper bound with spot core nodes when collect ran" in report.emr_text(record)
    docs = (REPO_ROOT / "docs" / "emr.md").read_text()
    assert f"on demand in us-east-1 as of {prices['as_of']}" in docs
