"""Stage `tokenize`: corpus files -> tokenizer/tokenizer.json and tokens/ (Parquet).

1. The driver cuts every corpus file into byte pieces at line ends (spark_jobs.text.corpus).
2. Executors read the pieces, check that they are UTF-8 text without NUL bytes, and count their
   characters. A bad file stops the stage (data.bad_files=fail) or is left out with a warning
   (skip); empty files are left out.
3. The driver splits the files into training and validation text (data.val_split: whole files or
   the tail of each), trains a byte-level BPE on the training text, at most
   tokenizer.train_sample_mb MB of it, and writes tokenizer.json. With data.val_split=auto and
   data.pack_documents off, whole validation files that give no window after step 4 (while the
   training files give some) make it split by tails instead and do steps 3 and 4 again.
4. Executors encode the pieces with the tokenizer broadcast to them and write tokens/ with pyarrow,
   one part file per task (consecutive pieces of about the same total size: a large file's pieces
   get one each, small files share one), one row per piece and split: doc_id (the file's index in
   the sorted corpus list), path (its URI), split ("train"/"val"), piece (order within the file),
   chars, n_tokens and ids (array<int>). A file's train (val) tokens are its train (val) rows' ids
   concatenated in piece order.

Not named tokenize.py: spark-submit puts this folder first on sys.path, which would shadow the
standard library's `tokenize` module.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from pipeline import corpus_files, lake, run_folder
from spark_jobs.spark import parts
from spark_jobs.spark.stage_app import run_stage
from spark_jobs.text import bpe, corpus
from spark_jobs.text.sliding_windows import SPLITS, check_windows, plan_windows
from spark_jobs.text.sliding_windows import Piece as WindowPiece

STAGE = "tokenize"
# By its module's name, also when spark-submit runs this file as __main__: under spark_jobs (lib/log.py).
logger = logging.getLogger("spark_jobs.tokenize_corpus")


def encode_tasks(pieces: list[corpus.Piece], scans: list[corpus.Scan], documents: list[corpus.Document]) -> list[tuple]:
    """(piece, character at which the piece's validation part starts) for the pieces of usable files."""
    usable = {doc.doc_id: doc for doc in documents}
    chars = {(scan.doc_id, scan.index): scan.chars for scan in scans}
    tasks, first_char = [], {}
    for piece in sorted(pieces, key=lambda piece: (piece.doc_id, piece.index)):
        start = first_char.get(piece.doc_id, 0)
        n = chars[(piece.doc_id, piece.index)]
        first_char[piece.doc_id] = start + n
        doc = usable.get(piece.doc_id)
        if doc is not None and n:
            tasks.append((piece, min(max(doc.boundary - start, 0), n)))
    return tasks


def tokens_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("doc_id", pa.int32()),
            ("path", pa.string()),
            ("split", pa.string()),
            ("piece", pa.int32()),
            ("chars", pa.int64()),
            ("n_tokens", pa.int64()),
            ("ids", pa.list_(pa.int32())),
        ]
    )


def encode_task(groups: list[list[tuple]], tokenizer_json, tokens_uri: str):
    """Executor function: encode task i's pieces and write tokens/part-i.parquet; returns the
    rows' counts."""

    def encode(task: int) -> list[dict]:
        import os

        import pyarrow as pa

        # One tokenizer thread per task: Spark already runs one task per core.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        tokenizer = bpe.from_json(tokenizer_json.value)
        rows, ids = [], []
        for piece, val_start in groups[task]:
            text = corpus.read_piece_text(piece.path, piece.start, piece.end - piece.start)
            for split, part in (("train", text[:val_start]), ("val", text[val_start:])):
                if part:
                    ids.append(bpe.encode(tokenizer, part))
                    rows.append(
                        {
                            "doc_id": piece.doc_id,
                            "path": piece.path,
                            "split": split,
                            "piece": piece.index,
                            "chars": len(part),
                            "n_tokens": len(ids[-1]),
                        }
                    )
        schema = tokens_schema()
        offsets = np.cumsum([0] + [len(item) for item in ids], dtype=np.int32)
        table = pa.Table.from_pylist(rows, schema=schema.remove(schema.get_field_index("ids"))).append_column(
            schema.field("ids"), pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(ids)))
        )
        with parts.ParquetPart(lake.join(tokens_uri, parts.part_name(task, ".parquet")), schema) as out:
            out.write(table)
        return rows

    return encode


def body(spark, config, run: str) -> dict:
    sc = spark.sparkContext
    timings = {}
    started = time.perf_counter()
    files = list(corpus_files.corpus_files(config).items())
    pieces = corpus.plan_pieces(files, sc.defaultParallelism)
    task_bytes = corpus.piece_bytes(sum(size for _, size in files), sc.defaultParallelism)
    groups = corpus.pack(pieces, corpus.piece_size, task_bytes)
    scans = sc.parallelize(groups, len(groups)).flatMap(corpus.scan_pieces).collect()
    documents, skipped, warnings = corpus.assess(files, scans, bad_files=config.data.bad_files)
    documents, val_split = corpus.split_validation(documents, config.data.val_fraction, config.data.val_split)
    for message in warnings:
        logger.warning(message)
    timings["scan_s"] = time.perf_counter() - started

    encoded = encode_corpus(sc, config, run, pieces, scans, documents, task_bytes, timings)
    counts = window_counts(config, encoded)
    if val_split == "files" and config.data.val_split == "auto" and too_short_validation_files(config, counts):
        message = (
            f"data.val_split=auto: the whole files taken for validation are each shorter than one window "
            f"(data.block_size + 1 = {config.data.block_size + 1} tokens); validation takes the tail of every "
            "file instead (data.val_split=tail), tokenized again"
        )
        logger.warning(message)
        warnings.append(message)
        documents, val_split = corpus.split_validation(documents, config.data.val_fraction, "tail")
        encoded = encode_corpus(sc, config, run, pieces, scans, documents, task_bytes, timings)
        counts = window_counts(config, encoded)
    tokenizer, sample, groups, rows = encoded
    # The window check, early: a split without a single window stops the run here. Its warnings
    # (files too short for a window, text the windows leave unused) come from the window stage.
    paths = {doc.doc_id: doc.path for doc in documents}
    check_windows(counts, config.data.block_size, config.data.stride, paths, val_split=val_split)
    # Counted from the rows rather than the window plan, which with data.pack_documents sees one
    # sequence per split and counts the separators between files.
    splits = {
        split: {
            "tokens": sum(row["n_tokens"] for row in rows if row["split"] == split),
            "chars": sum(row["chars"] for row in rows if row["split"] == split),
            "documents": len({row["doc_id"] for row in rows if row["split"] == split}),
        }
        for split in SPLITS
    }
    return {
        "splits": splits,
        "val_split": val_split,
        "files": len(files),
        "skipped": skipped,
        "warnings": warnings,
        "pieces": len(pieces),
        "tasks": len(groups),
        "tokenizer": {
            "vocab_size": tokenizer.get_vocab_size(),
            "configured_vocab_size": config.tokenizer.vocab_size,
            "sample_chars": sum(len(text) for text in sample),
            "sample_cap_bytes": config.tokenizer.sample_cap_bytes,
        },
        "timings": timings,
        "outputs": {
            "tokenizer": lake.join(run, run_folder.TOKENIZER_PATH),
            "tokens": lake.join(run, run_folder.TOKENS_FOLDER),
        },
    }


def encode_corpus(sc, config, run: str, pieces, scans, documents, task_bytes: int, timings: dict) -> tuple:
    """Train the tokenizer on the documents' training parts and encode every piece into tokens/:
    (tokenizer, its training sample, the encoding tasks, the tokens/ rows). Adds to `timings`."""
    started = time.perf_counter()
    sample = corpus.training_sample(documents, config.tokenizer.sample_cap_bytes)
    tokenizer = bpe.train(sample, config.tokenizer.vocab_size, config.tokenizer.min_frequency)
    tokenizer_json = tokenizer.to_str()
    lake.write_text(lake.join(run, run_folder.TOKENIZER_PATH), tokenizer_json)
    timings["train_bpe_s"] = timings.get("train_bpe_s", 0) + time.perf_counter() - started

    started = time.perf_counter()
    groups = corpus.pack(encode_tasks(pieces, scans, documents), lambda task: corpus.piece_size(task[0]), task_bytes)
    tokens_uri = lake.join(run, run_folder.TOKENS_FOLDER)
    lake.delete(tokens_uri)
    encode = encode_task(groups, sc.broadcast(tokenizer_json), tokens_uri)
    rows = sc.parallelize(range(len(groups)), len(groups)).flatMap(encode).collect()
    corpus.check_unchanged(documents, rows)
    timings["encode_s"] = timings.get("encode_s", 0) + time.perf_counter() - started
    return tokenizer, sample, groups, rows


def window_counts(config, encoded: tuple) -> dict:
    """The window plan's counts of the encoded corpus (see spark_jobs.text.sliding_windows.plan_windows)."""
    tokenizer, _, _, rows = encoded
    _, counts = plan_windows(
        [WindowPiece(row["doc_id"], row["split"], row["piece"], row["n_tokens"], ()) for row in rows],
        config.data.block_size,
        config.data.stride,
        bpe.separator_id(tokenizer) if config.data.pack_documents else None,
    )
    return counts


def too_short_validation_files(config, counts: dict) -> bool:
    """Whether whole validation files give no window (`counts`: the window plan's) where each
    file's tail might: windows per file (no data.pack_documents), and the training files give some."""
    splits = counts["splits"]
    return not config.data.pack_documents and splits["val"]["windows"] == 0 and splits["train"]["windows"] > 0


if __name__ == "__main__":
    run_stage(STAGE, body)
