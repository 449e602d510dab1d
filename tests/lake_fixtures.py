"""An S3 (a moto server) and a folder on local disk or on it, for the tests of the lake, corpus
files and the stages that use both."""

from __future__ import annotations

import pytest

from local_platform.moto_s3 import LocalS3
from pipeline.config import to_uri

BUCKET = "lake-names"


@pytest.fixture(scope="module")
def s3():
    with LocalS3(buckets=(BUCKET,)) as server:
        yield server


@pytest.fixture(params=["local", "s3"])
def folder(request, tmp_path, s3, monkeypatch) -> str:
    if request.param == "local":
        return to_uri(str(tmp_path / "my books"))
    for name, value in s3.connection_env().items():
        monkeypatch.setenv(name, value)
    return f"s3://{BUCKET}/{tmp_path.name}/my books"
