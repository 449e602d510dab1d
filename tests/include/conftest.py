"""The moto server and the S3Hook the tests of the record, promote and prune tasks use."""

from __future__ import annotations

import pytest

from local_platform.moto_s3 import LocalS3
from tests.include.records import LAKE_BUCKET, RECORD_BUCKET


@pytest.fixture(scope="module")
def s3():
    with LocalS3(buckets=(RECORD_BUCKET, LAKE_BUCKET)) as server:
        yield server


@pytest.fixture
def hook(s3, monkeypatch):
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    for name, value in s3.connection_env().items():
        monkeypatch.setenv(name, value)
    return S3Hook(aws_conn_id="aws_default")
