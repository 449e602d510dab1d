"""The lake's file I/O (pipeline/lake.py) on local disk and on S3 (a moto server) with the
names people give files: spaces, '#', '%' and accents are part of a path, never percent-encoding."""

from __future__ import annotations

import filecmp
import http.client
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pipeline import corpus_files, lake
from pipeline.config import to_uri
from pipeline.errors import PipelineError
from tests.lake_fixtures import BUCKET

NAMES = ["Les Misérables #1.txt", "100% poems.txt", "plain.txt"]
REPO = Path(__file__).resolve().parents[2]


def test_files_with_spaces_hashes_percents_and_accents(folder):
    for number, name in enumerate(NAMES):
        lake.write_text(lake.join(folder, name), f"text {number}\n")

    uris = [lake.join(folder, name) for name in NAMES]
    assert all(lake.exists(uri) for uri in uris)
    assert [lake.read_text(uri) for uri in uris] == ["text 0\n", "text 1\n", "text 2\n"]
    assert corpus_files.expand(lake.join(folder, "*.txt")) == {uri: 7 for uri in sorted(uris)}
    assert corpus_files.expand(lake.join(folder, "Les*")) == {uris[0]: 7}
    assert corpus_files.expand(uris[1]) == {uris[1]: 7}
    assert sorted(lake.list_files(folder)) == sorted(uris)
    assert not lake.exists(lake.join(folder, "Les Misérables %231.txt")), "%23 is not read as '#'"

    lake.delete(folder)
    assert not any(lake.exists(uri) for uri in uris)


def test_a_path_is_not_a_uri():
    with pytest.raises(ValueError, match="not a URI: '/data/books'"):
        lake.filesystem("/data/books")


def test_a_file_is_copied_to_local_disk_whole(folder, tmp_path):
    data = bytes(range(256)) * 5000  # more than a chunk's worth of blocks of pyarrow's reads
    lake.write_bytes(lake.join(folder, "part 1.tfrecord"), data)
    copy = lake.download_file(lake.join(folder, "part 1.tfrecord"), tmp_path / "copies" / "part 1.tfrecord")
    assert copy.read_bytes() == data
    with pytest.raises(PipelineError, match=r"part 2.tfrecord does not exist"):
        lake.download_file(lake.join(folder, "part 2.tfrecord"), tmp_path / "copies" / "part 2.tfrecord")


def test_copying_a_file_takes_a_chunk_of_memory_whatever_its_size(tmp_path):
    """A worker copies TFRecord shards of any size from S3: the copy must not hold one whole."""
    import tracemalloc

    source, size = tmp_path / "part-00000.tfrecord", 64 * 2**20  # 8 chunks
    with source.open("wb") as file:
        for _ in range(size // 2**20):
            file.write(os.urandom(2**20))
    tracemalloc.start()
    try:
        lake.download_file(to_uri(str(source)), tmp_path / "copy.tfrecord")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 3, f"{peak / 2**20:.0f} MB for a {size / 2**20:.0f} MB file"  # a chunk or two
    assert filecmp.cmp(source, tmp_path / "copy.tfrecord", shallow=False)


@pytest.mark.parametrize("limit", [None, 10], ids=["copied-at-once", "past-s3s-copy-limit"])
def test_a_file_is_moved_whole_whatever_its_size(folder, monkeypatch, limit):
    """On S3 a move is a copy, which S3 does at once only up to 5 GB: past that (a lowered limit
    stands in for it) the file is streamed to its new name."""
    if limit is not None:
        monkeypatch.setattr(lake, "S3_COPY_MAX_BYTES", limit)
        monkeypatch.setattr(lake, "COPY_CHUNK_BYTES", 1000)  # several chunks, few requests
    data = bytes(range(256)) * 40
    source, target = lake.join(folder, "_staging/part-0.tfrecord"), lake.join(folder, "tfrecords/part-0.tfrecord")
    lake.write_bytes(source, data)
    fs, source_path = lake.filesystem(source)
    fs.create_dir(lake.filesystem(lake.join(folder, "tfrecords"))[1], recursive=True)
    streamed, copy = [], shutil.copyfileobj
    monkeypatch.setattr(shutil, "copyfileobj", lambda *args: streamed.append(args[2]) or copy(*args))
    lake.move_file(fs, source_path, lake.filesystem(target)[1])
    assert lake.read_bytes(target) == data and not lake.exists(source)
    streamed_on_s3 = limit is not None and folder.startswith("s3://")  # else S3's copy, or a rename
    assert streamed == ([1000] if streamed_on_s3 else [])


def test_a_file_that_cannot_be_written_whole_leaves_the_old_one_and_no_temporary_file(tmp_path):
    """A full disk, met here as the file size limit of the process (RLIMIT_FSIZE), fails the write
    with nothing half-written left behind: no partial temporary file beside the old file."""
    folder = tmp_path / "stats"
    folder.mkdir()
    (folder / "train.json").write_text("old\n")
    script = (
        "import resource, signal, sys\n"
        "from pipeline import lake\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))\n"
        "try:\n"
        f"    lake.write_bytes({to_uri(str(folder / 'train.json'))!r}, b'x' * 200_000)\n"
        "except OSError as error:\n"
        "    sys.exit(f'failed: {error}')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)

    assert "failed:" in result.stderr and "large" in result.stderr, result.stderr
    assert sorted(path.name for path in folder.iterdir()) == ["train.json"]
    assert (folder / "train.json").read_text() == "old\n"


def test_a_write_that_fails_leaves_the_file_it_would_replace_and_no_temporary_file(folder):
    """On S3 too, where closing an upload completes it: the training's last backup outlives a
    failed attempt to replace it."""
    uri = lake.join(folder, "checkpoints", "state.npz")
    lake.write_bytes(uri, b"the last good backup")
    with pytest.raises(RuntimeError, match="stopped mid-way"), lake.AtomicFile(uri) as file:
        file.stream.write(b"half a back")
        raise RuntimeError("stopped mid-way")
    assert lake.read_bytes(uri) == b"the last good backup"
    assert lake.list_files(lake.join(folder, "checkpoints")) == [uri]
    lake.write_bytes(uri, b"a newer backup")
    assert lake.read_bytes(uri) == b"a newer backup"
    assert lake.list_files(lake.join(folder, "checkpoints")) == [uri]


def test_a_bucket_has_one_s3_filesystem_per_process(s3, monkeypatch, tmp_path):
    for name, value in s3.connection_env().items():
        monkeypatch.setenv(name, value)
    folder = f"s3://{BUCKET}/{tmp_path.name}/my books"
    first, path = lake.filesystem(lake.join(folder, "a.txt"))
    second, _ = lake.filesystem(lake.join(folder, "b.txt"))
    assert first is second and path.endswith("my books/a.txt")
    assert lake.filesystem("s3://another-bucket/x")[0] is not first
    lake.write_text(lake.join(folder, "a.txt"), "through the cached filesystem\n")
    assert lake.read_text(lake.join(folder, "a.txt")) == "through the cached filesystem\n"


def test_s3_requests_name_their_region_and_retry_throttling(monkeypatch):
    made = []
    monkeypatch.setattr(lake.pafs, "S3FileSystem", lambda **kwargs: made.append(kwargs) or object())
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    lake.cached_s3_filesystem.cache_clear()

    lake.filesystem("s3://kwargs-bucket/a.txt")
    assert made[0]["region"] == "eu-west-3" and made[0]["endpoint_override"] == "http://127.0.0.1:9"
    retry = made[0]["retry_strategy"]
    assert isinstance(retry, lake.pafs.AwsStandardS3RetryStrategy) and retry.max_attempts == lake.S3_ATTEMPTS >= 10
    lake.cached_s3_filesystem.cache_clear()


def test_on_an_emr_node_the_region_is_the_clusters(monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    instance_data = tmp_path / "extraInstanceData.json"
    monkeypatch.setattr(lake, "EMR_INSTANCE_DATA", instance_data)
    assert lake.s3_region() is None  # not a node: the AWS SDK's own default
    instance_data.write_text('{"instanceRole": "core", "region": "ap-south-1", "jobFlowId": "j-1"}')
    assert lake.s3_region() == "ap-south-1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert lake.s3_region() == "us-west-2"


THROTTLED = 3  # S3 requests answered 503 SlowDown: as many as pyarrow's default strategy attempts


class ThrottlingProxy(ThreadingHTTPServer):
    """S3 on loopback that answers the first THROTTLED requests as S3 does when throttling
    (503 SlowDown) and passes the others to the moto server."""

    def __init__(self, target: str):
        super().__init__(("127.0.0.1", 0), ThrottlingHandler)
        self.target, self.requests = urlsplit(target).netloc, 0
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"


class ThrottlingHandler(BaseHTTPRequestHandler):
    server: ThrottlingProxy

    def handle_request(self) -> None:
        self.server.requests += 1
        if self.server.requests <= THROTTLED:
            body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            self.reply(503, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))], body)
            return
        length = int(self.headers.get("Content-Length") or 0)
        connection = http.client.HTTPConnection(self.server.target, timeout=30)
        connection.request(self.command, self.path, self.rfile.read(length), dict(self.headers))
        response = connection.getresponse()
        self.reply(response.status, response.getheaders(), response.read())
        connection.close()

    def reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_request

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def throttled_object(s3, monkeypatch, tmp_path):
    """An object on the moto server, and S3 reached through a ThrottlingProxy in front of it."""
    for name, value in s3.connection_env().items():
        monkeypatch.setenv(name, value)
    s3.client().put_object(Bucket=BUCKET, Key=f"{tmp_path.name}/a.txt", Body=b"read at last\n")
    proxy = ThrottlingProxy(s3.endpoint_url)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    yield f"s3://{BUCKET}/{tmp_path.name}/a.txt", proxy
    proxy.shutdown()
    proxy.server_close()


def test_a_read_outlasts_s3s_throttling(throttled_object):
    uri, proxy = throttled_object
    assert lake.read_bytes(uri) == b"read at last\n"
    assert proxy.requests > THROTTLED


def test_pyarrows_default_retries_would_not_outlast_it(throttled_object):
    uri, proxy = throttled_object
    default = lake.pafs.S3FileSystem(region=lake.s3_region(), endpoint_override=proxy.endpoint)
    with pytest.raises(OSError, match="HTTP status 503"):
        default.get_file_info(uri.removeprefix("s3://"))
    assert proxy.requests == THROTTLED
