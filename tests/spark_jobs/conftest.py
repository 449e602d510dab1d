"""The lake fixtures: `s3`, a moto server, and `folder`, a folder on local disk or on it."""

from tests.lake_fixtures import folder, s3  # noqa: F401 (fixtures)
