"""The four preprocessing applications through the real spark-submit, checked against the run-folder
contract (docs/preprocessing.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from local_platform import stage_runner
from pipeline import disk_room, lake, run_folder
from pipeline.stages import PREPROCESSING_STAGES
from spark_jobs.text import corpus
from spark_jobs.text.embedding_tables import sinusoidal
from tests.conftest import new_run, small_config

# The module's first test runs the four preprocessing applications (`preprocessed`, tests/conftest.py;
# the training tests use the same run), each a spark-submit, which on a loaded machine take minutes
# the first time (their class archives).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def formula(n: int, block_size: int, stride: int) -> int:
    return (n - block_size - 1) // stride + 1 if n >= block_size + 1 else 0


def read_folder(uri: str):
    return pq.read_table([lake.local_path(f) for f in lake.list_files(uri) if f.endswith(".parquet")]).to_pylist()


def test_outputs_exist_and_stages_completed(preprocessed):
    config, run, _ = preprocessed
    root = Path(lake.local_path(run))
    for stage in PREPROCESSING_STAGES:
        assert (root / run_folder.stats_path(stage)).is_file()
    for name in [
        run_folder.TOKENIZER_PATH,
        run_folder.TOKEN_VECTORS_PATH,
        run_folder.POSITIONS_PATH,
        run_folder.EMBEDDINGS_META_PATH,
        run_folder.MANIFEST_PATH,
    ]:
        assert (root / name).is_file(), name
    for split in ("train", "val"):
        shards = sorted(p.name for p in (root / run_folder.TFRECORDS_FOLDER / split).iterdir())
        assert shards == [f"part-{i:05d}.tfrecord" for i in range(config.data.shards)]
    assert not (root / run_folder.STAGING_FOLDER).exists()


def test_tokens_decode_to_the_text_and_ids_fit_the_vocabulary(preprocessed):
    from tokenizers import Tokenizer

    config, run, texts = preprocessed
    tokenizer = Tokenizer.from_file(lake.local_path(lake.join(run, run_folder.TOKENIZER_PATH)))
    assert tokenizer.get_vocab_size() <= config.tokenizer.vocab_size
    assert tokenizer.token_to_id("<|endoftext|>") is not None
    rows = read_folder(lake.join(run, run_folder.TOKENS_FOLDER))
    assert all(max(row["ids"]) < config.tokenizer.vocab_size and min(row["ids"]) >= 0 for row in rows)
    assert all(len(row["ids"]) == row["n_tokens"] for row in rows)
    stats = lake.read_json(run_folder.stats_uri(run, "tokenize"))
    for path, text in texts.items():
        parts = {}
        for split in ("train", "val"):
            mine = sorted(
                (row for row in rows if row["path"] == path and row["split"] == split), key=lambda r: r["piece"]
            )
            parts[split] = tokenizer.decode([i for row in mine for i in row["ids"]], skip_special_tokens=False)
        assert parts["train"] + parts["val"] == text
        assert len(parts["train"]) == corpus.split_boundary(len(text), config.data.val_fraction)
    for split in ("train", "val"):
        assert stats["splits"][split]["tokens"] == sum(r["n_tokens"] for r in rows if r["split"] == split)
        assert stats["splits"][split]["chars"] == sum(r["chars"] for r in rows if r["split"] == split)
    assert stats["pieces"] > 2  # the files were cut into pieces, so windows cross piece borders


def test_windows_follow_the_formula_and_the_sequences(preprocessed):
    config, run, _ = preprocessed
    block_size, stride = config.data.block_size, config.data.stride
    tokens = read_folder(lake.join(run, run_folder.TOKENS_FOLDER))
    windows = read_folder(lake.join(run, run_folder.WINDOWS_FOLDER))
    sequences = {}
    for row in sorted(tokens, key=lambda r: r["piece"]):
        sequences.setdefault((row["doc_id"], row["split"]), []).extend(row["ids"])
    for (doc_id, split), ids in sequences.items():
        mine = sorted((w for w in windows if w["doc_id"] == doc_id and w["split"] == split), key=lambda w: w["start"])
        assert len(mine) == formula(len(ids), block_size, stride)
        assert [w["start"] for w in mine] == list(range(0, stride * len(mine), stride))
        assert all(w["ids"] == ids[w["start"] : w["start"] + block_size + 1] for w in mine)
    stats = lake.read_json(run_folder.stats_uri(run, "window"))
    for split in ("train", "val"):
        indices = sorted(w["idx"] for w in windows if w["split"] == split)
        assert indices == list(range(len(indices))) and len(indices) == stats["splits"][split]["windows"] > 0


def test_embedding_tables(preprocessed):
    config, run, _ = preprocessed
    root = Path(lake.local_path(run))
    vectors, positions = np.load(root / run_folder.TOKEN_VECTORS_PATH), np.load(root / run_folder.POSITIONS_PATH)
    assert vectors.shape == (config.tokenizer.vocab_size, config.embedding.dim) and vectors.dtype == np.float32
    assert positions.shape == (config.data.block_size, config.embedding.dim) and positions.dtype == np.float32
    np.testing.assert_array_equal(positions, sinusoidal(config.data.block_size, config.embedding.dim))
    meta = json.loads((root / run_folder.EMBEDDINGS_META_PATH).read_text())
    assert meta["vocab_size"] == config.tokenizer.vocab_size and meta["dim"] == config.embedding.dim
    assert meta["block_size"] == config.data.block_size
    assert meta["word2vec"]["enabled"] and 0 < meta["word2vec"]["learned_ids"] <= config.tokenizer.vocab_size
    assert meta["word2vec"]["sentences"] <= config.embedding.word2vec.max_sentences
    assert np.isfinite(vectors).all() and len(np.unique(vectors, axis=0)) == len(vectors)


def test_tfrecords_hold_the_windows_and_match_the_manifest(preprocessed):
    import tensorflow as tf

    config, run, _ = preprocessed
    block_size, shards = config.data.block_size, config.data.shards
    manifest = lake.read_json(lake.join(run, run_folder.MANIFEST_PATH))
    tokenize = lake.read_json(run_folder.stats_uri(run, "tokenize"))
    assert manifest["block_size"] == block_size and manifest["vocab_size"] == config.tokenizer.vocab_size
    assert manifest["num_shards"] == shards
    windows = read_folder(lake.join(run, run_folder.WINDOWS_FOLDER))
    spec = {
        "input_ids": tf.io.FixedLenFeature([block_size], tf.int64),
        "target_ids": tf.io.FixedLenFeature([block_size], tf.int64),
    }
    for split in ("train", "val"):
        info = manifest["splits"][split]
        window_stats = lake.read_json(run_folder.stats_uri(run, "window"))
        assert info["tokens"] == window_stats["splits"][split]["tokens"] == tokenize["splits"][split]["tokens"]
        assert info["chars"] == tokenize["splits"][split]["chars"]
        assert info["shards"] == [f"{split}/part-{i:05d}.tfrecord" for i in range(shards)]
        by_idx = {w["idx"]: w["ids"] for w in windows if w["split"] == split}
        total = 0
        for shard, name in enumerate(info["shards"]):
            path = lake.local_path(lake.join(run, run_folder.TFRECORDS_FOLDER, name))
            dataset = tf.data.TFRecordDataset([path]).map(lambda r: tf.io.parse_single_example(r, spec))
            records = [(x["input_ids"].numpy(), x["target_ids"].numpy()) for x in dataset]
            assert len(records) == info["shard_windows"][shard]
            # Shard s holds windows s, s + S, s + 2S, ... in order; input = ids[:T], target = ids[1:].
            expected = [by_idx[i] for i in sorted(by_idx) if i % shards == shard]
            assert [inputs.tolist() + targets[-1:].tolist() for inputs, targets in records] == expected
            assert all((inputs[1:] == targets[:-1]).all() for inputs, targets in records)
            total += len(records)
        assert total == info["windows"] == len(by_idx)


def test_the_disk_check_estimates_less_than_the_run_took_but_not_far_less(preprocessed):
    """disk_room.check_lake_room refuses only runs that cannot fit: its estimate stays below the real sizes."""
    config, run, texts = preprocessed
    corpus_bytes = sum(len(text.encode("utf-8")) for text in texts.values())
    least = disk_room.least_run_bytes(config, corpus_bytes)
    for folder, estimate in (("windows", least["windows_bytes"]), ("tfrecords", least["tfrecords_bytes"])):
        taken = sum(lake.list_file_sizes(lake.join(run, folder)).values())
        assert taken / 10 < estimate < taken, (folder, estimate, taken)


def test_a_copied_run_folder_reads_its_own_outputs_even_under_a_path_spark_would_glob(
    preprocessed, tmp_path, code_dir, capfd
):
    config, run, _ = preprocessed
    copy = tmp_path / "lake [v2]{old,new}" / run_folder.RUNS_FOLDER / "e2e-copy"
    shutil.copytree(lake.local_path(run), copy)
    copied = "file://" + str(copy)
    for stage in PREPROCESSING_STAGES[1:]:
        stage_runner.submit_stage(stage, config, copied, code_dir)
        assert lake.read_json(run_folder.stats_uri(copied, stage))["outputs"]
    assert (
        json.loads((copy / run_folder.MANIFEST_PATH).read_text())["splits"]
        == json.loads(Path(lake.local_path(lake.join(run, run_folder.MANIFEST_PATH))).read_text())["splits"]
    )
    # Its tokens gone, the copy does not read the original's: window names what to run again.
    shutil.rmtree(copy / run_folder.TOKENS_FOLDER)
    with pytest.raises(stage_runner.StageFailed):
        stage_runner.submit_stage("window", config, copied, code_dir)
    captured = capfd.readouterr()
    assert "stage 'tokenize' is marked complete in run folder" in captured.out + captured.err
    assert "its tokens/ holds no Parquet part file: run tokenize again" in captured.out + captured.err


def test_a_bad_file_fails_the_application_with_exit_code_2(tmp_path, code_dir, capfd):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "latin1.txt").write_bytes("Grüße aus Köln\n".encode("latin-1") * 50)
    config = small_config(tmp_path, folder)
    run = new_run(config, "bad")
    with pytest.raises(stage_runner.StageFailed, match=r"exit code 2: corpus file \S+latin1.txt is not UTF-8 text"):
        stage_runner.submit_stage("tokenize", config, run, code_dir)
    captured = capfd.readouterr()  # spark-submit merges the driver's stderr into its stdout
    errors = [line for line in (captured.out + captured.err).splitlines() if line.startswith("ERROR [tokenize]")]
    assert errors == [
        f"ERROR [tokenize] corpus file {(folder / 'latin1.txt').as_uri()} is not UTF-8 text "
        "(byte 0xfc at offset 2); convert it first, from its encoding (iconv -f WINDOWS-1252 -t UTF-8 for "
        "most Western European text); set data.bad_files=skip to leave such files out"
    ]
    assert not lake.exists(run_folder.stats_uri(run, "tokenize"))
    assert lake.read_json(lake.join(run, run_folder.error_path("tokenize")))["bad_input"] is True
