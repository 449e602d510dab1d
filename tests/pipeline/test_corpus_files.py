"""Finding a corpus's files (pipeline/corpus_files.py) on local disk and on S3 (a moto
server): globs in any path component, hidden names, names holding glob characters, and links."""

from __future__ import annotations

import pytest

from pipeline import corpus_files, lake
from pipeline.config import to_uri
from pipeline.config_files import load_config
from pipeline.errors import PipelineError
from tests.lake_fixtures import BUCKET


def test_a_corpus_on_an_s3_that_cannot_be_reached_is_named(monkeypatch, s3):
    for name, value in s3.connection_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # nothing listens there
    monkeypatch.setattr(lake, "S3_ATTEMPTS", 1)  # the retries (tests/pipeline/test_lake.py) would only add a minute
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

    from include import emr_checks

    config = load_config(overrides=[{"corpus": uri}])
    if expected:
        assert emr_checks.corpus_objects(config, S3Hook(aws_conn_id="aws_default")) == expected, uri
    else:
        with pytest.raises(PipelineError, match="matches no object on S3"):
            emr_checks.corpus_objects(config, S3Hook(aws_conn_id="aws_default"))


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
