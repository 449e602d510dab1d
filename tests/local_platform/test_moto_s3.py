"""The local S3 server of the local commands."""

from __future__ import annotations

from local_platform.moto_s3 import LocalS3


def test_every_local_s3_starts_empty():
    """moto keeps state per process: a second server must not show the first one's buckets."""
    with LocalS3(buckets=("gpt-pipeline",)) as s3:
        s3.client().put_object(Bucket="gpt-pipeline", Key="runs/a/report.json", Body=b"{}")
    with LocalS3() as s3:
        assert s3.client().list_buckets()["Buckets"] == []
