"""The model asset stays active whichever of several configurations Airflow parsed the DAG with first
(make run's bucket, the rehearsal's, a deployment's new s3.bucket) in one Airflow database: an
inactive outlet fails promote with AirflowInactiveAssetInInletOrOutletException."""

from __future__ import annotations

import pytest
from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
from airflow.models.asset import AssetActive
from airflow.utils.session import create_session

from include.airflow_names import DAG_ID
from pipeline.config import REPO_ROOT
from tests.deployments import deploy

pytestmark = pytest.mark.airflow  # a reset Airflow database


def parse_into_db(tmp_path, monkeypatch, bucket: str):
    """Parse the DAG with s3.bucket = bucket as Airflow's DAG processor does, into its database."""
    deploy(monkeypatch, tmp_path / f"{bucket}.yaml", {"s3": {"bucket": bucket}})
    dagbag = DagBag(dag_folder=str(REPO_ROOT / "dags"))
    assert dagbag.import_errors == {}
    sync_bag_to_db(dagbag, "dags-folder", None)
    (asset,) = dagbag.dags[DAG_ID].get_task("promote").outlets
    return asset


def is_active(asset) -> bool:
    with create_session() as session:
        return session.get(AssetActive, (asset.name, asset.uri)) is not None


def test_the_model_asset_of_each_bucket_is_active_in_one_airflow(tmp_path, monkeypatch):
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.utils.db import resetdb

    resetdb()
    DagBundlesManager().sync_bundles_to_db()
    first = parse_into_db(tmp_path, monkeypatch, "gpt-pipeline")
    second = parse_into_db(tmp_path, monkeypatch, "gpt-pipeline-rehearsal")
    assert first.uri == "s3://gpt-pipeline/runs/latest" and second.uri == "s3://gpt-pipeline-rehearsal/runs/latest"
    assert is_active(first) and is_active(second)
