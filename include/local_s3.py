"""S3 for local runs: a moto server on a free loopback port and the Airflow AWS connection to it.

The connection is handed to Airflow as an environment variable (AIRFLOW_CONN_AWS_DEFAULT) with
the endpoint in its extra and throwaway credentials made up at start, so nothing in code or
config holds a key and nothing can reach real AWS.
"""

from __future__ import annotations

import json
import logging
import secrets
import urllib.request

import boto3
from moto.server import ThreadedMotoServer

from include.collect import AWS_CONN_ID

REGION = "us-east-1"


class LocalS3:
    """A moto S3 server on 127.0.0.1 with made-up credentials; use as a context manager."""

    def __init__(self, buckets: tuple[str, ...] = ()):
        self.buckets = buckets
        self.access_key = f"local-{secrets.token_hex(8)}"
        self.secret_key = secrets.token_hex(20)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint_url = ""

    def __enter__(self) -> LocalS3:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per S3 request
        self.server.start()
        try:
            host, port = self.server.get_host_and_port()
            self.endpoint_url = f"http://{host}:{port}"
            # moto keeps its state per process, not per server: drop what an earlier server (or a
            # test's moto) in this process left, so that every server starts empty.
            reset = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
            urllib.request.urlopen(reset, timeout=30)
            for bucket in self.buckets:
                self.client().create_bucket(Bucket=bucket)
        except BaseException:
            self.server.stop()  # __exit__ does not run when __enter__ fails
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def connection_env(self) -> dict[str, str]:
        """Environment that points Airflow's AWS connection, and any stray AWS client, at the server."""
        connection = {
            "conn_type": "aws",
            "login": self.access_key,
            "password": self.secret_key,
            "extra": {"endpoint_url": self.endpoint_url, "region_name": REGION},
        }
        return {
            f"AIRFLOW_CONN_{AWS_CONN_ID.upper()}": json.dumps(connection),
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            # No profile or shared credentials file from this machine can leak in.
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        }
