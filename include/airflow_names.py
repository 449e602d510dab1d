"""The names Airflow knows the pipeline by: the DAG's id and the model asset's name. Imported by
the DAG, the local tooling and the tests alike; it imports nothing (no Airflow, Spark or TensorFlow)."""

DAG_ID = "gpt_pipeline"


def model_asset_name(latest_uri: str) -> str:
    """The name of the asset promote updates when a run's model becomes latest, at latest_uri
    (include.promote.latest_folder). The URI is part of the name: Airflow keeps an asset inactive
    while another active one has its name, so one name for two buckets (make run's, the rehearsal's,
    a deployment's new s3.bucket) would fail promote in whichever DAG parse came second."""
    return f"gpt_pipeline_model {latest_uri}"
