"""The pieces of `make compose-test` that need no Docker engine (the whole run:
tests/e2e/test_compose_stack.py)."""

from __future__ import annotations

import yaml

from include.trigger_form import FIELDS, OVERRIDES, overrides
from local_platform.compose_stack import BASES, RUN_CONF, STANDINS, override_services
from pipeline.config import REPO_ROOT
from pipeline.config_files import load_config

OUTPUTS = ("/opt/airflow/lake", "/opt/airflow/logs")


def test_the_override_swaps_the_pulled_images_and_moves_only_the_output_folders(tmp_path):
    services = yaml.safe_load((REPO_ROOT / "docker-compose.yaml").read_text())["services"]
    override = override_services(services, tmp_path)
    assert set(override) <= set(services)
    assert override["postgres"] == {"image": STANDINS["postgres"][0]}
    assert override["localstack"] == {"image": STANDINS["localstack"][0]}
    mounting = {name for name, spec in services.items() if OUTPUTS[0] in str(spec.get("volumes"))}
    assert {name for name, spec in override.items() if "volumes" in spec} == mounting
    assert "airflow-scheduler" in mounting and "create-bucket" not in mounting
    for name in mounting:
        assert override[name]["volumes"] == [f"{tmp_path / 'lake'}:{OUTPUTS[0]}", f"{tmp_path / 'logs'}:{OUTPUTS[1]}"]
    # The service that runs the tasks starts their JVMs with C1 alone, and keeps its mounts.
    assert override["airflow-scheduler"]["environment"] == {"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"}
    assert {name for name, spec in override.items() if "environment" in spec} == {"airflow-scheduler"}


def test_every_standin_is_built_on_its_debootstrap_base():
    for name, (_, suite) in STANDINS.items():
        dockerfile = (REPO_ROOT / "docker" / "standins" / name / "Dockerfile").read_text()
        assert f"ARG STANDIN_BASE={BASES[suite]}\nFROM ${{STANDIN_BASE}}\n" in dockerfile, name


def test_the_triggered_settings_are_form_fields_that_make_a_valid_config():
    assert set(RUN_CONF) - {OVERRIDES} <= set(FIELDS)
    settings = {name: value for name, value in RUN_CONF.items() if name != "corpus"}  # a path in the container
    config = load_config(overrides=overrides(settings))
    assert (config.run_name, config.train.max_steps, config.data.block_size) == ("compose", 40, 32)
    assert not config.local.allow_exposed_workers
