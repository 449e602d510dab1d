"""The run's code on S3, where the EMR nodes get it: the stage entry files and spark_jobs.zip
(include/spark_submit.package_code), bootstrap.sh and the Python requirements it installs, in
s3://{emr.code_prefix}/{run_id}/, from the wheels in s3://{emr.code_prefix}/wheelhouse/{requirements
hash}/ (include/wheelhouse.py). upload_run puts them there, with the run's resolved config.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from include.spark_submit import packaged_code
from pipeline import lake, run_folder
from pipeline.config import REPO_ROOT, ConfigError, PipelineConfig

# Files uploaded next to the code, under these names (bootstrap.sh reads the last two).
RUN_FILES = {
    "bootstrap.sh": REPO_ROOT / "include" / "config" / "bootstrap.sh",
    "requirements-jobs.txt": REPO_ROOT / "spark_jobs" / "requirements.txt",
    "constraints.txt": REPO_ROOT / "requirements.txt",
}
WHEELHOUSE_FOLDER = "wheelhouse"
WHEELHOUSE_BUILD_COMMAND = "python -m include.wheelhouse build"


def code_uri(config: PipelineConfig, run_id: str) -> str:
    return lake.join(config.emr.code_prefix, run_id)


WHEELHOUSE_FORMAT = b"manifest with each wheel's sha256\0"


def requirements_hash() -> str:
    """What names a wheelhouse: a change to either requirements file needs another, and so does
    one to its manifest's format (a wheelhouse without the sha256s bootstrap.sh checks is another)."""
    digest = hashlib.sha256(WHEELHOUSE_FORMAT)
    for path in requirement_files():
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def requirement_files() -> tuple[Path, Path]:
    """The jobs' requirements and their constraints, the project's complete pins."""
    return RUN_FILES["requirements-jobs.txt"], RUN_FILES["constraints.txt"]


def wheelhouse_uri(code_prefix: str, digest: str | None = None) -> str:
    """Where the nodes' wheels are: one folder per requirements hash, shared by the runs."""
    return lake.join(code_prefix, WHEELHOUSE_FOLDER, digest or requirements_hash())


def split_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ConfigError(f"{uri} is not an s3:// URI")
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def upload_run(config: PipelineConfig, run_id: str, s3_client) -> None:
    """Upload the code, the bootstrap script and its requirements, then the resolved config
    (config.json in the run folder, written last: it marks the run as created)."""
    code = code_uri(config, run_id)
    with packaged_code() as folder:
        files = {file.relative_to(folder).as_posix(): file for file in folder.rglob("*") if file.is_file()}
        files |= RUN_FILES
        for name, path in sorted(files.items()):
            bucket, key = split_s3_uri(lake.join(code, name))
            s3_client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    bucket, key = split_s3_uri(lake.join(run_folder.run_dir(config, run_id), run_folder.CONFIG_FILE))
    s3_client.put_object(Bucket=bucket, Key=key, Body=config.to_json().encode("utf-8"))
