"""The names Airflow knows the pipeline by: the DAG's id and the model asset's name. Imported by
the DAG, the local tooling and the tests alike; it imports nothing (no Airflow, Spark or TensorFlow)."""

DAG_ID = "gpt_pipeline"
# The asset promote updates when a run's model becomes latest (its URI: include.promote.latest_folder).
MODEL_ASSET_NAME = "gpt_pipeline_model"
