"""Stage `window`: tokens/ -> windows/ (Parquet), sliding windows of data.block_size + 1 tokens.

One Spark task per tokens/ part file, two passes: the first returns each row's length and first
T tokens, from which the driver plans which windows start in which piece
(spark_jobs.text.sliding_windows.plan_windows); the second cuts the windows of its pieces, borrowing the
few tokens a window needs from the following piece, and writes windows/part-NNNNN.parquet with
pyarrow. Windows are cut per sequence, `data.stride` tokens apart, so none crosses the
train/validation boundary. A sequence is one file's train or validation part, so no window crosses
a file boundary either; with data.pack_documents it is the whole split, every file's part
followed by <|endoftext|>, so windows run across files and short files are used whole.

windows/ columns: split, doc_id (the file of the piece the window starts in), start (the window's
first token in its sequence), idx (the window's number within its split: 0, 1, ... in sequence
order), ids (T + 1 token ids).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from pipeline import lake, run_folder
from spark_jobs.spark import parts
from spark_jobs.spark.stage_app import run_stage
from spark_jobs.text import bpe
from spark_jobs.text.sliding_windows import SPLITS, Piece, check_enough_windows, check_windows, plan_windows

STAGE = "window"
# By its module's name, also when spark-submit runs this file as __main__: under spark_jobs (lib/log.py).
logger = logging.getLogger("spark_jobs.window")
ROWS_PER_BATCH = 8192


def windows_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("split", pa.string()),
            ("doc_id", pa.int32()),
            ("start", pa.int64()),
            ("idx", pa.int64()),
            ("ids", pa.list_(pa.int32())),
        ]
    )


def read_heads(block_size: int):
    """Executor function: a tokens/ part file -> (doc_id, path, split, piece, n_tokens, first T ids) per row."""

    def heads(uri: str) -> list[tuple]:
        table = parts.read_parquet(uri)
        columns = {name: table.column(name).to_pylist() for name in ("doc_id", "path", "split", "piece", "n_tokens")}
        ids = table.column("ids")
        return [
            (
                columns["doc_id"][row],
                columns["path"][row],
                columns["split"][row],
                columns["piece"][row],
                columns["n_tokens"][row],
                ids[row].values[:block_size].to_numpy(zero_copy_only=False).astype(np.int32),
            )
            for row in range(table.num_rows)
        ]

    return heads


def cut_file(plans, block_size: int, stride: int, windows_uri: str):
    """Executor function: (task, tokens/ part file) -> windows/part-task.parquet; returns its window count."""

    def cut(item: tuple[int, str]) -> int:
        import pyarrow as pa

        task, uri = item
        plan_of = plans.value
        schema = windows_schema()
        table = parts.read_parquet(uri, ["doc_id", "split", "piece", "ids"])
        width = block_size + 1
        with parts.ParquetPart(lake.join(windows_uri, parts.part_name(task, ".parquet")), schema) as out:
            for row in range(table.num_rows):
                doc_id, split = table.column("doc_id")[row].as_py(), table.column("split")[row].as_py()
                plan = plan_of[(doc_id, split, table.column("piece")[row].as_py())]
                ids = table.column("ids")[row].values.to_numpy()
                for starts, indices, windows in plan.windows(ids, block_size, stride, ROWS_PER_BATCH):
                    n = len(starts)
                    out.write(
                        pa.RecordBatch.from_arrays(
                            [
                                pa.array([split] * n, pa.string()),
                                pa.array(np.full(n, doc_id, dtype=np.int32)),
                                pa.array(starts),
                                pa.array(indices),
                                pa.ListArray.from_arrays(
                                    pa.array(np.arange(n + 1, dtype=np.int32) * width), pa.array(windows.reshape(-1))
                                ),
                            ],
                            schema=schema,
                        )
                    )
        return out.rows

    return cut


def body(spark, config, run: str) -> dict:
    sc = spark.sparkContext
    tokenize = run_folder.require_stage(run, "tokenize")
    block_size, stride = config.data.block_size, config.data.stride
    started = time.perf_counter()
    files = parts.stage_parquet_files(run, "tokenize", run_folder.TOKENS_FOLDER)
    rows = sc.parallelize(files, len(files)).flatMap(read_heads(block_size)).collect()
    separator = None
    if config.data.pack_documents:
        separator = bpe.separator_id(bpe.from_json(lake.read_text(lake.join(run, run_folder.TOKENIZER_PATH))))
    plans, counts = plan_windows(
        [Piece(doc_id, split, piece, n_tokens, head) for doc_id, _, split, piece, n_tokens, head in rows],
        block_size,
        stride,
        separator,
    )
    paths = {row[0]: row[1] for row in rows}
    warnings = check_windows(counts, block_size, stride, paths, tokenize.get("val_split", "tail"))
    for message in warnings:
        logger.warning(message)
    windows = {split: counts["splits"][split]["windows"] for split in SPLITS}
    check_enough_windows("window", windows["train"], windows["val"], config.data.shards, config)

    timings = {"plan_s": time.perf_counter() - started}

    started = time.perf_counter()
    windows_uri = lake.join(run, run_folder.WINDOWS_FOLDER)
    lake.delete(windows_uri)
    cut = cut_file(sc.broadcast(plans), block_size, stride, windows_uri)
    written = sum(sc.parallelize(list(enumerate(files)), len(files)).map(cut).collect())
    expected = sum(counts["splits"][split]["windows"] for split in SPLITS)
    if written != expected:
        raise RuntimeError(f"window: wrote {written} windows, planned {expected}")
    timings["cut_s"] = time.perf_counter() - started
    return {
        "block_size": block_size,
        "stride": stride,
        "splits": {split: counts["splits"][split] for split in SPLITS},
        "sequences": counts["sequences"],
        "warnings": warnings,
        "timings": timings,
        "outputs": {"windows": windows_uri},
    }


if __name__ == "__main__":
    run_stage(STAGE, body)
