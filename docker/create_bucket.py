"""Create the pipeline's S3 bucket through the Airflow AWS connection (`aws_default`).

docker-compose.yaml runs this once, after LocalStack is healthy and before the Airflow services
start. The bucket is `s3.bucket` of include/config/pipeline.yaml; a bucket that already exists
is left as it is.
"""

from __future__ import annotations

import sys

from airflow.providers.amazon.aws.hooks.s3 import S3Hook

from include.record import AWS_CONN_ID
from pipeline.config_files import load_config


def ensure_bucket(bucket: str, aws_conn_id: str = AWS_CONN_ID) -> bool:
    """Create `bucket` unless it exists; True when it was created."""
    hook = S3Hook(aws_conn_id=aws_conn_id)
    if hook.check_for_bucket(bucket):
        return False
    hook.create_bucket(bucket_name=bucket)
    return True


def main() -> int:
    bucket = load_config().s3.bucket
    created = ensure_bucket(bucket)
    print(f"s3://{bucket} {'created' if created else 'already exists'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
