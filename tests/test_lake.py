"""The lake's file I/O (spark_jobs/lib/lake.py) on local disk and on S3 (a moto server) with the
names people give files: spaces, '#', '%' and accents are part of a path, never percent-encoding."""

from __future__ import annotations

import pytest

from include.local_s3 import LocalS3
from spark_jobs.lib import lake
from spark_jobs.lib.config import load_config, to_uri
from spark_jobs.lib.errors import PipelineError

NAMES = ["Les Misérables #1.txt", "100% poems.txt", "plain.txt"]
BUCKET = "lake-names"


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
    assert lake.expand(lake.join(folder, "*.txt")) == {uri: 7 for uri in sorted(uris)}
    assert lake.expand(lake.join(folder, "Les*")) == {uris[0]: 7}
    assert lake.expand(uris[1]) == {uris[1]: 7}
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
    with pytest.raises(PipelineError, match=rf"^corpus s3://{BUCKET}/books/\*.txt cannot be listed: .*Could not connect"):
        lake.corpus_files(config)
