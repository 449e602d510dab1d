"""The tokenize stage on corpora as people bring them. Bad ones: every case stops the application
with exit code 2 and one line naming the file (or is skipped with a warning under
data.bad_files=skip). Many small files: validation takes whole files. A re-run clears what read
the earlier outputs. The stage runs in this process on a local Spark session;
tests/e2e/test_preprocess.py runs it through spark-submit."""

from __future__ import annotations

import logging
import os
import re
import sys

import pyarrow.parquet as pq
import pytest

from pipeline import lake, run_folder
from pipeline.config import REPO_ROOT
from spark_jobs import export_tfrecord, positional_embed, tokenize_corpus, window
from spark_jobs.spark import parts, spark_metrics
from spark_jobs.spark.stage_app import run_stage
from spark_jobs.text import bpe
from tests.conftest import new_run, small_config

pytestmark = pytest.mark.slow


def shut_down_jvm() -> None:
    """pyspark keeps its gateway JVM (some 200 MB) after stop() for a next session: end it, so that
    it does not sit beside the later tests' Spark and TensorFlow processes."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    gateway.proc.stdin.close()
    gateway.proc.wait(timeout=60)
    SparkContext._gateway = SparkContext._jvm = None


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        # Python workers: this interpreter, and the repository importable (the stage modules).
        patch.setenv("PYSPARK_PYTHON", sys.executable)
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        from pyspark.sql import SparkSession

        builder = (
            SparkSession.builder.master("local[2]")
            .appName("test-bad-input")
            .config("spark.ui.enabled", "false")
            .config("spark.log.level", "WARN")
        )
        # As a stage's own session does: the first stage run here records its Spark metrics from it.
        for key, value in spark_metrics.event_log_conf(tmp_path_factory.mktemp("spark-events")).items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        yield session
        session.stop()
        shut_down_jvm()
        # py4j logs from __del__ at interpreter exit, after pytest has closed the captured streams.
        logging.getLogger("py4j").setLevel(logging.CRITICAL)


def run_tokenize(config, name="run"):
    run = new_run(config, name)
    try:
        run_stage("tokenize", tokenize_corpus.body, ["--run-dir", run])
    except SystemExit as stop:
        return run, stop.code
    return run, 0


def error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR")]
    assert len(lines) == 1, lines
    return lines[0]


def test_missing_corpus(spark, tmp_path, capsys):
    config = small_config(tmp_path, tmp_path / "nothing-here.txt")
    run, code = run_tokenize(config)
    assert code == 2
    assert error_line(capsys) == f"ERROR [tokenize] corpus {(tmp_path / 'nothing-here.txt').as_uri()} matches no file"
    assert not lake.exists(run_folder.stats_uri(run, "tokenize"))


def test_empty_corpus(spark, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    run, code = run_tokenize(small_config(tmp_path, tmp_path / "empty.txt"))
    assert code == 2
    assert error_line(capsys) == f"ERROR [tokenize] corpus file {(tmp_path / 'empty.txt').as_uri()} is empty"


def test_corpus_shorter_than_one_window(spark, tmp_path, capsys):
    (tmp_path / "short.txt").write_text("To be, or not to be, that is the question:\n" * 3)
    run, code = run_tokenize(small_config(tmp_path, tmp_path / "short.txt"))
    assert code == 2
    line = error_line(capsys)
    assert line.startswith(
        f"ERROR [tokenize] corpus file {(tmp_path / 'short.txt').as_uri()} is shorter than one window"
    )
    assert "data.block_size + 1 = 33" in line
    assert not lake.exists(run_folder.stats_uri(run, "tokenize"))


@pytest.mark.parametrize(
    "content, problem",
    [
        (
            b"plain text\n" * 20 + b"\xff\xfe broken\n",
            "is not UTF-8 text (byte 0xff at offset 220); convert it first, from its encoding (iconv -f "
            "WINDOWS-1252 -t UTF-8 for most Western European text)",
        ),
        (
            b"\x89PNG\r\n\x1a\n" + bytes(range(256)),
            "is not UTF-8 text (byte 0x89 at offset 0); convert it first, from its encoding (iconv -f "
            "WINDOWS-1252 -t UTF-8 for most Western European text)",
        ),
        (
            "To be, or not to be\n".encode("utf-16"),
            "is UTF-16 text, not UTF-8 (convert it first: iconv -f UTF-16 -t UTF-8)",
        ),
        (b"almost text\x00with a NUL\n", "looks binary (NUL byte at offset 11)"),
    ],
)
def test_bad_file_fails_by_default(spark, tmp_path, capsys, shakespeare_slice, content, problem):
    (shakespeare_slice.parent / "bad.dat").write_bytes(content)
    run, code = run_tokenize(small_config(tmp_path, shakespeare_slice.parent))
    assert code == 2
    bad_file = (shakespeare_slice.parent / "bad.dat").as_uri()
    message = f"corpus file {bad_file} {problem}; set data.bad_files=skip to leave such files out"
    assert error_line(capsys) == f"ERROR [tokenize] {message}"
    # The error also stays in the run folder, for a DAG task watching the stage from elsewhere.
    assert lake.read_json(lake.join(run, run_folder.error_path("tokenize"))) == {
        "stage": "tokenize",
        "error": message,
        "bad_input": True,
    }


def test_a_stage_that_crashes_leaves_its_error_and_a_later_success_removes_it(spark, tmp_path, shakespeare_slice):
    run = new_run(small_config(tmp_path, shakespeare_slice), "crash")

    def crashing_body(session, config, run_dir):
        raise RuntimeError("executor lost " + "x" * 3000)

    with pytest.raises(RuntimeError, match="executor lost"):
        run_stage("tokenize", crashing_body, ["--run-dir", run])
    error = lake.read_json(lake.join(run, run_folder.error_path("tokenize")))
    assert error["bad_input"] is False and error["error"].startswith("RuntimeError: executor lost xxx")
    assert len(error["error"]) < 2100  # a Java stack trace in a message is cut

    run_stage("tokenize", tokenize_corpus.body, ["--run-dir", run])
    assert not lake.exists(lake.join(run, run_folder.error_path("tokenize")))
    assert lake.exists(run_folder.stats_uri(run, "tokenize"))


def test_no_error_file_outside_a_run_folder(spark, tmp_path):
    with pytest.raises(SystemExit):
        run_stage("tokenize", tokenize_corpus.body, ["--run-dir", f"file://{tmp_path / 'typo'}"])
    assert not (tmp_path / "typo").exists()


def test_bad_file_is_skipped_with_a_warning(spark, tmp_path, capsys, shakespeare_slice):
    bad = shakespeare_slice.parent / "bad.dat"
    bad.write_bytes(b"\x00\x01\x02 binary")
    (shakespeare_slice.parent / "empty.txt").write_text("")
    run, code = run_tokenize(small_config(tmp_path, shakespeare_slice.parent, ["data.bad_files=skip"]))
    assert code == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("WARNING")]
    assert (
        f"WARNING [tokenize] skipping corpus file {bad.as_uri()}: it looks binary (NUL byte at offset 0) "
        "(data.bad_files=skip)" in warnings
    )
    stats = lake.read_json(run_folder.stats_uri(run, "tokenize"))
    assert [item["path"] for item in stats["skipped"]] == [
        bad.as_uri(),
        (shakespeare_slice.parent / "empty.txt").as_uri(),
    ]
    assert stats["files"] == 3 and stats["splits"]["train"]["documents"] == 1
    text = shakespeare_slice.read_text(encoding="utf-8")
    assert stats["splits"]["train"]["chars"] + stats["splits"]["val"]["chars"] == len(text)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("data.shards=1000", r"the val split has \d+ windows, fewer than its 1000 shards, so some of the 2 workers"),
        ("train.batch_size=20000", r"the train split has \d+ windows, fewer than train.batch_size 20000"),
    ],
)
def test_too_few_windows_for_the_shards_or_a_batch_stop_the_window_stage(
    spark, tmp_path, capsys, shakespeare_slice, setting, message
):
    """Before anything is written, not at train after the embeddings and the export."""
    run, code = run_tokenize(small_config(tmp_path, shakespeare_slice, [setting]))
    assert code == 0
    with pytest.raises(SystemExit) as stop:
        run_stage("window", window.body, ["--run-dir", run])
    assert stop.value.code == 2
    assert re.fullmatch(f"ERROR \\[window\\] window: {message}.*", error_line(capsys))
    assert not lake.exists(lake.join(run, run_folder.WINDOWS_FOLDER)) and not lake.exists(
        run_folder.stats_uri(run, "window")
    )


def test_a_word2vec_min_count_no_token_reaches_is_named(spark, tmp_path, capsys, shakespeare_slice):
    config = small_config(tmp_path, shakespeare_slice, ["embedding.word2vec.min_count=100000"])
    run, code = run_tokenize(config)
    run_stage("window", window.body, ["--run-dir", run])
    with pytest.raises(SystemExit) as stop:
        run_stage("positional_embed", positional_embed.body, ["--run-dir", run])
    assert stop.value.code == 2, "bad input: no retry"
    assert re.fullmatch(
        r"ERROR \[positional_embed\] embedding.word2vec.min_count \(100000\): no token occurs that often in the "
        r"[\d,]+ training windows Word2Vec reads \(at most embedding.word2vec.max_sentences, 2,000\); lower "
        r"min_count or "
        r"raise max_sentences",
        error_line(capsys),
    )
    assert lake.read_json(lake.join(run, run_folder.error_path("positional_embed")))["bad_input"] is True


def test_windows_line_ends_and_a_byte_order_mark_are_read_as_plain_text(spark, tmp_path, shakespeare_slice):
    """A file saved on Windows (BOM, \\r\\n, the odd bare \\r) gives the tokenizer, tokens and counts
    of the same text saved with \\n."""
    text = shakespeare_slice.read_text(encoding="utf-8")
    windows = tmp_path / "windows" / "slice.txt"
    windows.parent.mkdir()
    lines = text.splitlines(keepends=True)
    lines[7] = lines[7].replace("\n", "\r")  # an old Mac line end
    windows.write_bytes(b"\xef\xbb\xbf" + "".join(lines).replace("\n", "\r\n").encode())
    runs = {}
    for name, path in (("unix", shakespeare_slice), ("windows", windows)):
        runs[name], code = run_tokenize(small_config(tmp_path, path), name)
        assert code == 0
    stats = {name: lake.read_json(run_folder.stats_uri(run, "tokenize")) for name, run in runs.items()}
    chars = {name: {split: counts["chars"] for split, counts in stats[name]["splits"].items()} for name in runs}
    assert chars["windows"] == chars["unix"] and sum(chars["unix"].values()) == len(text)
    assert stats["windows"]["pieces"] > 1  # cut after \\r\\n line ends
    tokenizer = {name: lake.read_text(lake.join(run, run_folder.TOKENIZER_PATH)) for name, run in runs.items()}
    assert tokenizer["windows"] == tokenizer["unix"]
    rows = sorted(
        pq.read_table(lake.local_path(lake.join(runs["windows"], run_folder.TOKENS_FOLDER))).to_pylist(),
        key=lambda row: row["piece"],
    )
    decoded = {
        split: bpe.from_json(tokenizer["unix"]).decode([i for row in rows if row["split"] == split for i in row["ids"]])
        for split in ("train", "val")
    }
    assert decoded["train"] + decoded["val"] == text and len(decoded["val"]) == chars["unix"]["val"]


def test_a_later_stage_without_its_input_says_what_to_run(spark, tmp_path, capsys, shakespeare_slice):
    run = new_run(small_config(tmp_path, shakespeare_slice), "no-tokens")
    with pytest.raises(SystemExit) as stop:
        run_stage("window", window.body, ["--run-dir", run])
    assert stop.value.code == 2
    assert "stage 'tokenize' has not completed" in error_line(capsys)


def test_many_small_files_give_whole_files_to_validation(spark, tmp_path, capsys, shakespeare):
    lines = shakespeare.read_text(encoding="utf-8").splitlines(keepends=True)[:4000]
    folder = tmp_path / "many"
    folder.mkdir()
    texts = {f"scene{i:02d}.txt": "".join(lines[i * 100 : (i + 1) * 100]) for i in range(40)}
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
    run, code = run_tokenize(small_config(tmp_path, folder / "*.txt"))
    assert code == 0
    stats = lake.read_json(run_folder.stats_uri(run, "tokenize"))
    assert stats["val_split"] == "files"
    val, train = stats["splits"]["val"], stats["splits"]["train"]
    assert val["documents"] + train["documents"] == 40 and 2 <= val["documents"] <= 4
    assert 0.05 <= val["chars"] / (val["chars"] + train["chars"]) <= 0.1
    rows = pq.read_table(lake.local_path(lake.join(run, run_folder.TOKENS_FOLDER))).to_pylist()
    splits_of = {}
    for row in rows:
        splits_of.setdefault(row["path"], set()).add(row["split"])
    assert all(len(splits) == 1 for splits in splits_of.values()), "a file was cut between train and val"
    # Small files share Spark tasks and part files.
    assert stats["tasks"] <= 6 and len(parts.parquet_files(lake.join(run, run_folder.TOKENS_FOLDER))) == stats["tasks"]
    # Each scene is longer than one window, so no part is lost and nothing is warned about.
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("WARNING")]


def test_validation_files_too_short_for_a_window_give_way_to_tails(spark, tmp_path, capsys, shakespeare):
    # A book and 30 notes: the notes make up about the validation share, but each is shorter than a
    # window (30 bytes, so at most 30 tokens, and a window needs 33). The book's tail gives windows.
    text = shakespeare.read_text(encoding="utf-8")
    folder = tmp_path / "book-and-notes"
    folder.mkdir()
    (folder / "book.txt").write_text(text[:12_000], encoding="utf-8")
    for i in range(30):
        (folder / f"note{i:02d}.txt").write_text(text[20_000 + 100 * i : 20_030 + 100 * i], encoding="utf-8")
    run, code = run_tokenize(small_config(tmp_path, folder / "*.txt"), "auto")
    assert code == 0
    stats = lake.read_json(run_folder.stats_uri(run, "tokenize"))
    assert stats["val_split"] == "tail" and stats["splits"]["val"]["documents"] == 31
    assert any("validation takes the tail of every file instead" in warning for warning in stats["warnings"])

    run, code = run_tokenize(small_config(tmp_path, folder / "*.txt", ["data.val_split=files"]), "files")
    line = error_line(capsys)
    assert code == 2 and "its validation part has" in line and "data.val_split=tail" in line


def test_re_running_a_stage_clears_the_stages_that_read_it(spark, tmp_path, capsys, shakespeare_slice):
    run, code = run_tokenize(small_config(tmp_path, shakespeare_slice))
    run_stage("window", window.body, ["--run-dir", run])
    assert code == 0 and lake.exists(run_folder.stats_uri(run, "window"))
    run_stage("tokenize", tokenize_corpus.body, ["--run-dir", run])
    assert lake.exists(run_folder.stats_uri(run, "tokenize")) and not lake.exists(run_folder.stats_uri(run, "window"))
    assert "NOTE [tokenize] window read this stage's outputs: no longer complete" in capsys.readouterr().err


def test_packed_documents_use_files_shorter_than_a_window(spark, tmp_path, capsys, shakespeare):
    # Lines of 10 to 32 characters, one per file: fewer tokens than a window of 33, whatever the merges.
    lines = [
        line for line in shakespeare.read_text(encoding="utf-8").splitlines(keepends=True) if 10 <= len(line) <= 32
    ]
    folder = tmp_path / "short"
    folder.mkdir()
    for i, line in enumerate(lines[:200]):
        (folder / f"line{i:03d}.txt").write_text(line, encoding="utf-8")
    run, code = run_tokenize(small_config(tmp_path, folder / "*.txt"), "per-file")
    line = error_line(capsys)
    assert code == 2 and "is shorter than one window" in line and "data.pack_documents=true" in line

    run, code = run_tokenize(small_config(tmp_path, folder / "*.txt", ["data.pack_documents=true"]), "packed")
    assert code == 0
    run_stage("window", window.body, ["--run-dir", run])
    config = lake.read_json(lake.join(run, run_folder.CONFIG_FILE))
    block_size, stride = config["data"]["block_size"], config["data"]["stride"]
    separator = bpe.separator_id(bpe.from_json(lake.read_text(lake.join(run, run_folder.TOKENIZER_PATH))))
    tokens = sorted(
        pq.read_table(lake.local_path(lake.join(run, run_folder.TOKENS_FOLDER))).to_pylist(),
        key=lambda r: (r["doc_id"], r["piece"]),
    )
    windows = pq.read_table(lake.local_path(lake.join(run, run_folder.WINDOWS_FOLDER))).to_pylist()
    for split in ("train", "val"):
        mine = [row for row in tokens if row["split"] == split]
        stream = []  # the split's files in order, each followed by the separator
        for doc_id in sorted({row["doc_id"] for row in mine}):
            stream += [i for row in mine if row["doc_id"] == doc_id for i in row["ids"]] + [separator]
        cut = sorted((w for w in windows if w["split"] == split), key=lambda w: w["idx"])
        assert [w["start"] for w in cut] == list(range(0, len(stream) - block_size, stride))
        assert all(w["ids"] == stream[w["start"] : w["start"] + block_size + 1] for w in cut)
        # tokenize's own counts are the files' and their tokens', whether or not windows pack them
        counted = lake.read_json(run_folder.stats_uri(run, "tokenize"))["splits"][split]
        documents = len({row["doc_id"] for row in mine})
        assert (counted["documents"], counted["tokens"]) == (documents, len(stream) - documents)
        assert any(separator in w["ids"][1:-1] for w in cut)  # windows run across files


def test_paths_with_spaces_hashes_and_accents_work_in_the_preprocessing_stages(spark, tmp_path, shakespeare):
    """Paths are taken as they are, never percent-encoded (file:///…/my books/…), by pyarrow and Spark alike."""
    folder = tmp_path / "my books"
    folder.mkdir()
    text = shakespeare.read_text(encoding="utf-8")[:40_000]
    (folder / "Les Misérables #1.txt").write_text(text, encoding="utf-8")
    config = small_config(tmp_path, folder / "*.txt", [{"lake": str(tmp_path / "lake été #2")}])
    assert config.corpus == [f"file://{folder}/*.txt"] and config.lake == f"file://{tmp_path}/lake été #2"

    run, code = run_tokenize(config)
    assert code == 0
    for stage, body in (
        ("window", window.body),
        ("positional_embed", positional_embed.body),
        ("export", export_tfrecord.body),
    ):
        run_stage(stage, body, ["--run-dir", run])
        assert lake.exists(run_folder.stats_uri(run, stage)), stage
    assert os.path.isdir(tmp_path / "lake été #2" / run_folder.RUNS_FOLDER / "run" / "tfrecords")
    rows = pq.read_table(lake.local_path(lake.join(run, run_folder.TOKENS_FOLDER))).to_pylist()
    assert {row["path"] for row in rows} == {f"file://{folder}/Les Misérables #1.txt"}
    tokenizer = bpe.from_json(lake.read_text(lake.join(run, run_folder.TOKENIZER_PATH)))
    decoded = "".join(
        tokenizer.decode(row["ids"]) for row in sorted(rows, key=lambda row: (row["piece"], row["split"] == "val"))
    )
    assert decoded == text
