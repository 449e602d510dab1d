"""Stage `export`: windows/ -> tfrecords/{train,val}/part-NNNNN.tfrecord and tfrecords/manifest.json.

Window idx of a split goes to shard idx % data.shards, so every shard holds windows from the whole
split and shard sizes differ by at most one. Two Spark passes:

1. one task per windows/ part file encodes its windows as TFRecord `tf.train.Example`s
   (input_ids = ids[:T], target_ids = ids[1:], int64; spark_jobs.text.tfrecord) and emits, per
   batch and shard, the block of encoded records keyed by (shard, first idx);
2. the blocks are shuffled to one partition per shard, sorted by idx (TFRecord files concatenate),
   and each task streams its shard to a staging folder of the run.

When every shard is written and the counts match the window stage's, the driver moves the shards
to tfrecords/ and writes manifest.json last: shards that a crash leaves behind stay in the staging
folder, which the next attempt deletes, and no manifest ever lists them.
"""

from __future__ import annotations

import posixpath
import time

from pipeline import lake, run_folder
from pipeline.errors import PipelineError
from spark_jobs.spark import parts
from spark_jobs.spark.stage_app import run_stage
from spark_jobs.text import tfrecord
from spark_jobs.text.sliding_windows import SPLITS

STAGE = "export"


def shard_name(split: str, shard: int) -> str:
    return f"{split}/part-{shard:05d}.tfrecord"


def shard_key(split: str, shard: int, shards: int) -> int:
    """Partition number of a (split, shard): train shards first, then val."""
    return SPLITS.index(split) * shards + shard


def encode_file(shards: int, block_size: int):
    """Executor function: a windows/ part file -> ((shard key, first idx), (windows, records)) blocks."""

    def encode(uri: str):
        import numpy as np
        import pyarrow.parquet as pq

        fs, path = lake.filesystem(uri)
        with fs.open_input_file(path) as handle:
            for batch in pq.ParquetFile(handle).iter_batches(tfrecord.BATCH_ROWS, columns=["split", "idx", "ids"]):
                ids = batch.column("ids")
                offsets = ids.offsets.to_numpy()
                if np.any(np.diff(offsets) != block_size + 1):
                    raise ValueError(f"{uri} holds a window whose length is not block_size + 1 = {block_size + 1}")
                windows = ids.values.to_numpy()[offsets[0] : offsets[-1]].reshape(-1, block_size + 1)
                idx = batch.column("idx").to_numpy()
                split_of = np.array(batch.column("split").to_pylist())
                for split in SPLITS:
                    for shard in range(shards):
                        rows = np.flatnonzero((split_of == split) & (idx % shards == shard))
                        if rows.size:
                            records = tfrecord.windows_to_tfrecord_bytes(windows[rows])
                            yield (shard_key(split, shard, shards), int(idx[rows[0]])), (int(rows.size), records)

    return encode


def write_shards(staging: str, shards: int):
    """Executor function: a partition's blocks, sorted by (shard key, first idx) -> shard files;
    yields (split, shard, windows, bytes) per file."""

    def write(blocks):
        writer, current = None, None
        try:
            for (key, _), (count, records) in blocks:
                if key != current:
                    if writer is not None:
                        writer.close()
                        yield (*divmod(current, shards), writer.records, writer.bytes)
                    current = key
                    split, shard = SPLITS[key // shards], key % shards
                    writer = tfrecord.ShardWriter(lake.join(staging, shard_name(split, shard)))
                writer.write_records(records, count)
            if writer is not None:
                writer.close()
                yield (*divmod(current, shards), writer.records, writer.bytes)
                writer = None
        finally:
            if writer is not None:
                writer.abort()

    return write


def body(spark, config, run: str) -> dict:
    sc = spark.sparkContext
    tokenize = run_folder.require_stage(run, "tokenize")
    window = run_folder.require_stage(run, "window")
    block_size, shards = config.data.block_size, config.data.shards
    final = lake.join(run, run_folder.TFRECORDS_FOLDER)
    staging = lake.join(run, run_folder.STAGING_FOLDER, "export")
    lake.delete(final)
    lake.delete(staging)
    started = time.perf_counter()
    files = parts.stage_parquet_files(run, "window", run_folder.WINDOWS_FOLDER)
    n_keys = len(SPLITS) * shards
    results = (
        sc.parallelize(files, len(files))
        .flatMap(encode_file(shards, block_size))
        .repartitionAndSortWithinPartitions(n_keys, partitionFunc=lambda key: key[0])
        .mapPartitions(write_shards(staging, shards))
        .collect()
    )
    timings = {"encode_write_s": time.perf_counter() - started}
    started = time.perf_counter()
    written = {(SPLITS[split_index], shard): (windows, size) for split_index, shard, windows, size in results}
    splits = {}
    for split in SPLITS:
        counts = [written.get((split, shard), (0, 0))[0] for shard in range(shards)]
        expected = window["splits"][split]["windows"]
        if sum(counts) != expected:
            raise PipelineError(f"export wrote {sum(counts)} {split} windows, the window stage counted {expected}")
        for shard in range(shards):
            if (split, shard) not in written:  # fewer windows than shards: the shard is an empty file
                lake.write_bytes(lake.join(staging, shard_name(split, shard)), b"")
        splits[split] = {
            "windows": expected,
            "tokens": window["splits"][split]["tokens"],  # with the separators when packed: all predicted
            "chars": tokenize["splits"][split]["chars"],
            "shards": [shard_name(split, shard) for shard in range(shards)],
            "shard_windows": counts,
        }
    # Complete and counted: publish (renames locally, copies on S3), then the manifest.
    fs, staging_path = lake.filesystem(staging)
    _, final_path = lake.filesystem(final)
    for split in SPLITS:
        fs.create_dir(posixpath.join(final_path, split), recursive=True)
        for name in splits[split]["shards"]:
            lake.move_file(fs, posixpath.join(staging_path, name), posixpath.join(final_path, name))
    lake.delete(lake.join(run, run_folder.STAGING_FOLDER))
    manifest = {
        "block_size": block_size,
        "vocab_size": config.tokenizer.vocab_size,
        "num_shards": shards,
        "splits": splits,
    }
    manifest_uri = lake.join(run, run_folder.MANIFEST_PATH)
    lake.write_json(manifest_uri, manifest)
    timings["publish_s"] = time.perf_counter() - started
    return {
        "num_shards": shards,
        "splits": {split: {key: splits[split][key] for key in ("windows", "tokens", "chars")} for split in SPLITS},
        "bytes": sum(size for _, size in written.values()),
        "timings": timings,
        "outputs": {"tfrecords": final, "manifest": manifest_uri},
    }


if __name__ == "__main__":
    run_stage(STAGE, body)
