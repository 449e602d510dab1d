"""The lake's file I/O (spark_jobs/lib/lake.py) on local disk and on S3 (a moto server) with the
names people give files: spaces, '#', '%' and accents are part of a path, never percent-encoding."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.lib import corpus_files, lake
from spark_jobs.lib.config import to_uri
from spark_jobs.lib.errors import PipelineError

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
        monkeypatch.setattr(lake, "COPY_CHUNK_BYTES", 7)
    data = bytes(range(256)) * 40
    source, target = lake.join(folder, "_staging/part-0.tfrecord"), lake.join(folder, "tfrecords/part-0.tfrecord")
    lake.write_bytes(source, data)
    fs, source_path = lake.filesystem(source)
    fs.create_dir(lake.filesystem(lake.join(folder, "tfrecords"))[1], recursive=True)
    streamed, copy = [], shutil.copyfileobj
    monkeypatch.setattr(shutil, "copyfileobj", lambda *args: streamed.append(args[2]) or copy(*args))
    lake.move_file(fs, source_path, lake.filesystem(target)[1])
    assert lake.read_bytes(target) == data and not lake.exists(source)
    assert streamed == ([7] if limit is not None and folder.startswith("s3://") else [])  # else S3's copy, or a rename


def test_a_file_that_cannot_be_written_whole_leaves_the_old_one_and_no_temporary_file(tmp_path):
    """A full disk, met here as the file size limit of the process (RLIMIT_FSIZE), fails the write
    with nothing half-written left behind: no partial temporary file beside the old file."""
    folder = tmp_path / "stats"
    folder.mkdir()
    (folder / "train.json").write_text("old\n")
    script = (
        "import resource, signal, sys\n"
        "from spark_jobs.lib import lake\n"
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
