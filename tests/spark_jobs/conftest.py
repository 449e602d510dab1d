"""The lake fixtures: `s3`, a moto server, and `folder`, a folder on local disk or on it; the export
tests' `model_folder` and `exported_ids`."""

from tests.lake_fixtures import folder, s3  # noqa: F401 (fixtures)
from tests.spark_jobs.exported_model import exported_ids, model_folder  # noqa: F401 (fixtures)
