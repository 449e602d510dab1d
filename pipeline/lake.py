"""The lake's storage: file I/O over file:// and s3:// URIs (read, write, exists, list, delete,
files written whole, moves, upload and download), and filesystem() for libraries that take a
pyarrow filesystem. What lives where in a run folder is pipeline.run_folder's.

S3 goes through one pyarrow S3FileSystem per process and bucket, with the region set (so pyarrow
never asks S3 where a bucket is) and AWS's standard retries, S3_ATTEMPTS of them: a corpus of many
objects read at once can meet S3's throttling (503 SlowDown), which a retry outlasts.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import uuid
from functools import lru_cache
from pathlib import Path

from pyarrow import fs as pafs

from pipeline.errors import PipelineError

LOCAL_FILESYSTEM = pafs.LocalFileSystem()
COPY_CHUNK_BYTES = 8 * 2**20
S3_COPY_MAX_BYTES = 5 * 10**9  # S3's CopyObject copies at most 5 GB, and a move on S3 is one
S3_ATTEMPTS = 10
# Every EMR node describes itself here, its cluster's region among the rest.
EMR_INSTANCE_DATA = Path("/mnt/var/lib/info/extraInstanceData.json")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a URI. The project's URIs hold paths as they are, the way Hadoop
    (and so Spark) takes them: a space, '#' or 'é' in a file name is itself, never percent-encoded."""
    scheme, separator, path = uri.partition("://")
    if not separator:
        raise ValueError(f"not a URI: {uri!r}")
    if scheme == "file":
        return LOCAL_FILESYSTEM, path
    if scheme != "s3":
        raise ValueError(f"unsupported URI scheme {scheme}:// in {uri!r}")
    return s3_filesystem(path.partition("/")[0]), path.rstrip("/")


def s3_filesystem(bucket: str) -> pafs.S3FileSystem:
    """The S3 filesystem of this process for `bucket`."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return cached_s3_filesystem(bucket, s3_region(), endpoint, os.getpid())


@lru_cache(maxsize=None)
def cached_s3_filesystem(bucket: str, region: str | None, endpoint: str | None, pid: int) -> pafs.S3FileSystem:
    """One per bucket and what it depends on: the process (the AWS SDK's connections are not
    shared with a forked child), the region and the endpoint (moto or LocalStack, which pyarrow's
    S3FileSystem does not read from AWS_ENDPOINT_URL by itself)."""
    return pafs.S3FileSystem(
        region=region,
        endpoint_override=endpoint,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=S3_ATTEMPTS),
    )


def s3_region() -> str | None:
    """The region of the S3 requests: AWS_REGION or AWS_DEFAULT_REGION where set (the AWS
    connection's region for a local run and the rehearsal), else on an EMR node the cluster's own
    (emr.region, or the region of the connection that created it; the lake's bucket should be
    there, docs/emr.md); else None, which leaves it to the AWS SDK."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        return region
    try:
        return json.loads(EMR_INSTANCE_DATA.read_text())["region"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def join(uri: str, *parts: str) -> str:
    return posixpath.join(uri.rstrip("/"), *parts)


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def read_bytes(uri: str) -> bytes:
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError:
        raise PipelineError(f"{uri} does not exist") from None


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def read_json(uri: str):
    return json.loads(read_text(uri))


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole file (an AtomicFile: readers never see half of it)."""
    with AtomicFile(uri) as file:
        file.stream.write(data)


def temporary_name(name: str) -> str:
    """An AtomicFile's name while it is written: hidden (a leading '.'), so Spark and the readers
    of a folder leave it out, and unique, so two writers never share one."""
    return f".{name}.tmp-{uuid.uuid4().hex}"


TEMPORARY_NAME = re.compile(r"\..+\.tmp-[0-9a-f]{32}")


def is_temporary(path: str) -> bool:
    """Whether a path names an AtomicFile that is being written, or that a killed writer left."""
    return TEMPORARY_NAME.fullmatch(posixpath.basename(path)) is not None


class AtomicFile:
    """A file written to the lake whole or not at all: under a temporary name beside it
    (temporary_name), moved to its own name when committed. An aborted file's temporary one is
    deleted, and the file it would have replaced stays as it was. On S3 too, where the move is a
    copy: closing an upload completes it, so an upload to the name itself would put half a file
    there, and deleting that would take the previous good one (a training's last backup) with it."""

    def __init__(self, uri: str):
        self.uri = uri
        self.fs, self.path = filesystem(uri)
        folder, name = posixpath.split(self.path)
        self.fs.create_dir(folder, recursive=True)
        self.target = posixpath.join(folder, temporary_name(name))
        self.stream = self.fs.open_output_stream(self.target)

    def commit(self) -> None:
        self.stream.close()
        move_file(self.fs, self.target, self.path)

    def abort(self) -> None:
        if not self.stream.closed:
            try:
                self.stream.close()
            except OSError:  # e.g. the disk is full: what it holds goes anyway
                pass
        if self.fs.get_file_info(self.target).type == pafs.FileType.File:
            self.fs.delete_file(self.target)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:
            self.abort()
            return
        try:
            self.commit()
        except BaseException:  # a commit that fails (a full disk) leaves no temporary file either
            self.abort()
            raise


def move_file(fs: pafs.FileSystem, source: str, target: str) -> None:
    """Move a file within a filesystem: a rename locally; on S3 a server-side copy, or for a file
    past what S3 copies at once (a TFRecord shard of a large corpus), a streamed copy, which S3
    takes as a multipart upload of any size."""
    if isinstance(fs, pafs.S3FileSystem) and fs.get_file_info(source).size >= S3_COPY_MAX_BYTES:
        with fs.open_input_stream(source) as stream, fs.open_output_stream(target) as copy:
            shutil.copyfileobj(stream, copy, COPY_CHUNK_BYTES)
        fs.delete_file(source)
    else:
        fs.move(source, target)


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def write_json(uri: str, value) -> None:
    write_text(uri, json.dumps(value, indent=2, sort_keys=True) + "\n")


def delete(uri: str) -> None:
    """Remove a file or a whole folder; nothing there is fine."""
    fs, path = filesystem(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)


def list_file_sizes(uri: str) -> dict[str, int]:
    """{URI: size in bytes} of every file below a folder, sorted, from one listing."""
    fs, path = filesystem(uri)
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return {}
    selector = pafs.FileSelector(path, recursive=True)
    base = uri.rstrip("/")
    return dict(
        sorted(
            (join(base, posixpath.relpath(info.path, path)), info.size)
            for info in fs.get_file_info(selector)
            if info.type == pafs.FileType.File
        )
    )


def list_files(uri: str) -> list[str]:
    """URIs of every file below a folder, sorted."""
    return list(list_file_sizes(uri))


def upload_dir(local_dir: str | Path, uri: str) -> None:
    local_dir = Path(local_dir)
    for file in sorted(local_dir.rglob("*")):
        if file.is_file():
            write_bytes(join(uri, file.relative_to(local_dir).as_posix()), file.read_bytes())


def download_file(uri: str, target: str | Path) -> Path:
    """Copy a file to local disk a chunk at a time: a TFRecord shard of gigabytes never sits whole in memory."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as stream, target.open("wb") as copy:
            shutil.copyfileobj(stream, copy, COPY_CHUNK_BYTES)
    except FileNotFoundError:
        raise PipelineError(f"{uri} does not exist") from None
    return target


def local_path(uri: str) -> str:
    """The filesystem path of a file:// URI (for libraries that only take paths)."""
    fs, path = filesystem(uri)
    if not isinstance(fs, pafs.LocalFileSystem):
        raise ValueError(f"{uri} is not on the local filesystem")
    return os.fspath(path)
