"""S3 for local runs: a moto server on a free loopback port and the Airflow AWS connection to it.

The connection is handed to Airflow as an environment variable (AIRFLOW_CONN_AWS_DEFAULT) with
the endpoint in its extra and throwaway credentials made up at start, so nothing in code or
config holds a key and nothing can reach real AWS.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import urllib.request

import boto3
from botocore.config import Config
from moto.server import ThreadedMotoServer

from include.record import AWS_CONN_ID

REGION = "us-east-1"
# This machine's AWS settings that would steer a client past the made-up credentials (a profile,
# which the config files pointed at /dev/null do not hold; a role; a session token).
MACHINE_AWS_SETTINGS = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
)
LOOPBACK = ("127.0.0.1", "localhost")


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
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(reset, timeout=30)  # never a proxy
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
            config=Config(proxies={}),  # a loopback server: never through this machine's proxy
        )

    def isolated_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with its AWS clients pointed at the server (connection_env) and this machine's own
        AWS settings left out."""
        kept = {name: value for name, value in env.items() if name not in MACHINE_AWS_SETTINGS}
        return kept | self.connection_env(env)

    def connection_env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """Environment that points Airflow's AWS connection, and any stray AWS client, at the server,
        past any proxy `env` (this process's by default) names."""
        env = os.environ if env is None else env
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
            "NO_PROXY": no_proxy(env.get("NO_PROXY") or env.get("no_proxy")),
            "no_proxy": no_proxy(env.get("no_proxy") or env.get("NO_PROXY")),
        }


def no_proxy(hosts: str | None) -> str:
    """A no-proxy list that holds the loopback names too."""
    names = [name.strip() for name in (hosts or "").split(",") if name.strip()]
    return ",".join(names + [name for name in LOOPBACK if name not in names])
