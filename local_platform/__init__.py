"""Tooling that runs Airflow, S3 (moto) and the pipeline's stages on this machine. Never imported
by what Airflow deploys (dags/, include/, pipeline/, spark_jobs/)."""
