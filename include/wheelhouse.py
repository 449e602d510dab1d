"""The EMR nodes' Python dependencies as a wheelhouse on S3, so that no node needs PyPI.

    python -m include.wheelhouse build [--dest DIR] [--find-links DIR] [--code-prefix S3URI] [--no-upload]

`pip download` of spark_jobs/requirements.txt, constrained by requirements.txt, as wheels for the
nodes (CPython 3.11 on x86_64 Amazon Linux 2023), uploaded to
s3://{emr.code_prefix}/wheelhouse/{hash}/, the hash being that of the two files' contents. The
manifest, with each wheel's size and sha256, is uploaded last: a wheelhouse without one is
unfinished and taken as absent.
include/config/bootstrap.sh installs from it offline; the DAG's prepare task builds it when it is
missing (`ensure`). docs/emr.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from botocore.exceptions import ClientError

from include import emr_code
from include.emr_code import split_s3_uri
from pipeline import lake
from pipeline.config import PipelineConfig
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PYTHON_VERSION = "3.11"
ABI = "cp311"
# The nodes' glibc (Amazon Linux 2023: 2.34) bounds the manylinux wheels they run. pip takes the
# platforms literally, so every manylinux_2_N up to it is listed, with the legacy names of 2_17,
# 2_12 and 2_5 (libclang, needed by tensorflow, is tagged manylinux2010 only).
GLIBC_MINOR = 34
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]


def download_argv(dest: Path, find_links: Path | None = None) -> list[str]:
    """pip download for the nodes; `find_links` replaces the index (PyPI, or pip's configured one)."""
    requirements, constraints = emr_code.requirement_files()
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--dest", str(dest)]
    argv += ["-r", str(requirements), "-c", str(constraints), "--only-binary=:all:"]
    argv += ["--implementation", "cp", "--python-version", PYTHON_VERSION, "--abi", ABI]
    argv += [option for platform in PLATFORMS for option in ("--platform", platform)]
    if find_links is not None:
        argv += ["--no-index", "--find-links", str(find_links)]
    return argv


def build(dest: Path, find_links: Path | None = None) -> list[Path]:
    """Download every wheel the nodes need into `dest` (kept there: a second build reuses them)."""
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(download_argv(dest, find_links), capture_output=True, text=True)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()[
            -3:
        ]
        raise PipelineError(f"wheelhouse not built: pip download failed: {' '.join(errors).strip()}")
    return sorted(dest.glob("*.whl"))


def is_complete(s3_client, uri: str) -> bool:
    """A wheelhouse is there once its manifest is: the manifest is uploaded last."""
    bucket, key = split_s3_uri(lake.join(uri, MANIFEST))
    try:
        s3_client.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def upload(wheels: list[Path], uri: str, s3_client) -> None:
    """The wheels, then the manifest naming them."""
    if not wheels:
        raise PipelineError(f"wheelhouse {uri}: no wheels to upload")
    for wheel in wheels:
        bucket, key = split_s3_uri(lake.join(uri, wheel.name))
        s3_client.upload_file(str(wheel), bucket, key)
    manifest = {
        "requirements_hash": uri.rstrip("/").rsplit("/", 1)[-1],
        "python": PYTHON_VERSION,
        "platforms": PLATFORMS,
        "built": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wheels": {wheel.name: wheel.stat().st_size for wheel in wheels},
        # bootstrap.sh checks each wheel against its sha256 before installing any.
        "sha256": {wheel.name: sha256(wheel) for wheel in wheels},
    }
    write_manifest(manifest, uri, s3_client)


def sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def write_manifest(manifest: dict, uri: str, s3_client) -> None:
    """What makes the wheelhouse at `uri` complete."""
    bucket, key = split_s3_uri(lake.join(uri, MANIFEST))
    s3_client.put_object(Bucket=bucket, Key=key, Body=json.dumps(manifest, indent=1).encode("utf-8"))


def ensure(config: PipelineConfig, s3_client) -> str:
    """The run's wheelhouse on S3, built and uploaded first when it is not there (a changed
    requirements file, a new code_prefix). Returns its URI."""
    uri = emr_code.wheelhouse_uri(config.emr.code_prefix)
    if is_complete(s3_client, uri):
        log.info("wheelhouse: %s", uri)
        return uri
    log.info("wheelhouse %s missing: building it with pip download (once per requirements hash)", uri)
    with tempfile.TemporaryDirectory(prefix="gpt-pipeline-wheelhouse-") as folder:
        try:
            wheels = build(Path(folder))
        except PipelineError as error:
            raise PipelineError(
                f"{error}; the EMR nodes install from {uri}: build it with `{emr_code.WHEELHOUSE_BUILD_COMMAND}` "
                "where PyPI (or pip's configured index) is reachable"
            ) from None
        upload(wheels, uri, s3_client)
    log.info("wheelhouse: %s uploaded (%d wheels)", uri, len(wheels))
    return uri


def default_dest() -> Path:
    return Path.home() / ".cache" / "gpt-pipeline" / "wheelhouse" / emr_code.requirements_hash()


def main(argv: list[str] | None = None) -> int:
    from pipeline.config_files import load_config

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["build"])
    parser.add_argument("--dest", type=Path, help="local folder of the wheels (default: ~/.cache/gpt-pipeline/...)")
    parser.add_argument("--find-links", type=Path, help="take the wheels from this folder instead of an index")
    parser.add_argument("--code-prefix", help="emr.code_prefix to upload under (default: pipeline.yaml's)")
    parser.add_argument("--no-upload", action="store_true", help="only download")
    args = parser.parse_args(argv)
    try:
        wheels = build(args.dest or default_dest(), find_links=args.find_links)
        print(f"{len(wheels)} wheels, {sum(wheel.stat().st_size for wheel in wheels) / 1e6:,.0f} MB")
        if not args.no_upload:
            import boto3

            uri = emr_code.wheelhouse_uri(args.code_prefix or load_config().emr.code_prefix)
            upload(wheels, uri, boto3.client("s3"))
            print(f"uploaded to {uri}")
    except PipelineError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
