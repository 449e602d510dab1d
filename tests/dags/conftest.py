"""The Airflow database a run of the DAG needs (dag.test()): reset once per module, with the dags
folder as its DAG bundle. A test using it is marked airflow (tests/layers.py)."""

from __future__ import annotations

import json

import pytest

from pipeline.config import REPO_ROOT


@pytest.fixture(scope="module")
def airflow_db():
    from airflow.configuration import conf
    from airflow.utils.db import resetdb

    resetdb()
    bundles = [
        {
            "name": "test-dags",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(REPO_ROOT / "dags"), "refresh_interval": 0},
        }
    ]
    previous = conf.get("dag_processor", "dag_bundle_config_list")
    conf.set("dag_processor", "dag_bundle_config_list", json.dumps(bundles))
    yield
    conf.set("dag_processor", "dag_bundle_config_list", previous)
