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

from local_platform.moto_s3 import LocalS3
from spark_jobs.lib import corpus_files, lake
from spark_jobs.lib.config import load_config, to_uri
from spark_jobs.lib.errors import PipelineError

NAMES = ["Les Misérables #1.txt", "100% poems.txt", "plain.txt"]
BUCKET = "lake-names"
REPO = Path(__file__).resolve().parents[2]


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


def test_a_corpus_on_an_s3_that_cannot_be_reached_is_named(monkeypatch, s3):
    for name, value in s3.connection_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # nothing listens there
    config = load_config(overrides=[{"corpus": f"s3://{BUCKET}/books/*.txt"}])
    with pytest.raises(
        PipelineError, match=rf"^corpus s3://{BUCKET}/books/\*.txt cannot be listed: .*Could not connect"
    ):
        corpus_files.corpus_files(config)


TREE = ["a.txt", "notes.md", "austen/emma.txt", "austen/notes.md", "bronte/vol1/jane.txt", "bronte/vol2/jane.txt"]
HIDDEN = [".DS_Store", "_SUCCESS", ".git/objects/ab", "austen/.emma.txt.crc", "_temporary/0/part-0.txt"]


@pytest.mark.parametrize(
    "pattern, wanted",
    [
        ("", TREE),
        ("a.txt", ["a.txt"]),
        ("*.txt", ["a.txt"]),
        ("*/*.txt", ["austen/emma.txt"]),
        ("**/*.txt", ["a.txt", "austen/emma.txt", "bronte/vol1/jane.txt", "bronte/vol2/jane.txt"]),
        ("**", TREE),
        ("bronte/vol?/*.txt", ["bronte/vol1/jane.txt", "bronte/vol2/jane.txt"]),
        ("[ab]*/**/*.md", ["austen/notes.md"]),
        ("*/vol1/*", ["bronte/vol1/jane.txt"]),
        ("austen", TREE[2:4]),
        ("nothing/*.txt", []),
        ("**/*.pdf", []),
        # Hidden names (as Hadoop hides them) only where the glob names them so.
        (".*", [".DS_Store"]),
        ("_*", ["_SUCCESS"]),
        ("austen/.*.crc", ["austen/.emma.txt.crc"]),
        ("_temporary/**/*.txt", ["_temporary/0/part-0.txt"]),
    ],
)
def test_a_corpus_glob_matches_in_any_path_component(folder, pattern, wanted):
    for name in TREE + HIDDEN:
        lake.write_text(lake.join(folder, name), "text\n")
    lake.write_text(lake.join(folder + "2", "a.txt"), "text\n")  # a sibling whose name starts like this one's
    uri = lake.join(folder, pattern) if pattern else folder
    expected = {lake.join(folder, name): 5 for name in sorted(wanted)}
    assert corpus_files.expand(uri) == expected
    if folder.startswith("s3://"):  # the EMR target's check before the cluster: the same objects
        assert_emr_lists(uri, expected)


def assert_emr_lists(uri: str, expected: dict[str, int]) -> None:
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    from include import emr

    config = load_config(overrides=[{"corpus": uri}])
    if expected:
        assert emr.corpus_objects(config, S3Hook(aws_conn_id="aws_default")) == expected, uri
    else:
        with pytest.raises(PipelineError, match="matches no object on S3"):
            emr.corpus_objects(config, S3Hook(aws_conn_id="aws_default"))


@pytest.mark.parametrize(
    "pattern, wanted",
    [
        ("Hamlet [1603].txt", ["Hamlet [1603].txt"]),
        ("what?.txt", ["what?.txt"]),
        ("drafts [old]", ["drafts [old]/a.txt"]),
        ("Hamlet [12].txt", ["Hamlet 1.txt"]),  # no such file: a glob
        ("Hamlet [[]1603].txt", ["Hamlet [1603].txt"]),
    ],  # '[[]' matches a '['
)
def test_a_name_holding_glob_characters_is_taken_as_it_is_when_it_exists(folder, pattern, wanted):
    # As globs, 'Hamlet [1603].txt' would match 'Hamlet 1.txt' and not itself, 'what?.txt' also 'whatX.txt'.
    for name in ["Hamlet [1603].txt", "Hamlet 1.txt", "what?.txt", "whatX.txt", "drafts [old]/a.txt", "drafts o/a.txt"]:
        lake.write_text(lake.join(folder, name), "text\n")
    uri = lake.join(folder, pattern)
    expected = {lake.join(folder, name): 5 for name in wanted}
    assert corpus_files.expand(uri) == expected
    if folder.startswith("s3://"):
        assert_emr_lists(uri, expected)


def test_links_in_a_local_corpus_count_each_file_once(tmp_path):
    """A folder linked in from elsewhere is read; a link back up the tree (a loop) and a second name
    for the same file do not put the same text in the training data twice."""
    books, elsewhere = tmp_path / "books", tmp_path / "elsewhere"
    (books / "austen").mkdir(parents=True)
    elsewhere.mkdir()
    (books / "austen" / "emma.txt").write_text("emma\n")
    (elsewhere / "jane.txt").write_text("jane eyre\n")
    (books / "bronte").symlink_to(elsewhere)
    (books / "austen" / "again").symlink_to(books)
    (books / "favourite.txt").symlink_to(books / "austen" / "emma.txt")
    (books / "copy.txt").hardlink_to(elsewhere / "jane.txt")
    emma, jane = lake.join(to_uri(str(books)), "austen/emma.txt"), lake.join(to_uri(str(books)), "copy.txt")
    wanted = {emma: 5, jane: 10}  # jane.txt is also bronte/jane.txt, a name through a link
    for pattern in (books, books / "**" / "*.txt"):
        assert corpus_files.corpus_files(load_config(overrides=[{"corpus": str(pattern)}])) == wanted, pattern
    # Through the loop, austen/ reaches the whole of books/; each file keeps the name without a link.
    assert corpus_files.corpus_files(load_config(overrides=[{"corpus": str(books / "austen")}])) == {
        lake.join(to_uri(str(books)), "austen/again/bronte/jane.txt"): 10,
        emma: 5,
    }
    both = load_config(overrides=[{"corpus": [str(books / "favourite.txt"), str(books / "austen" / "emma.txt")]}])
    assert corpus_files.corpus_files(both) == {emma: 5}

    # A hidden link to a folder of the corpus (walked first: '_' sorts before letters) and a
    # hidden dangling link (an editor's lock file) change nothing.
    (books / "_latest").symlink_to(books / "austen")
    (books / ".#emma.txt").symlink_to("someone@host.1234:1700000000")
    for pattern in (books, books / "**" / "*.txt"):
        assert corpus_files.corpus_files(load_config(overrides=[{"corpus": str(pattern)}])) == wanted, pattern

    (books / "gone.txt").symlink_to(tmp_path / "deleted.txt")
    with pytest.raises(
        PipelineError, match=r"cannot be listed: .*gone.txt is a link to .*deleted.txt, which does not exist"
    ):
        corpus_files.corpus_files(load_config(overrides=[{"corpus": str(books)}]))


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
