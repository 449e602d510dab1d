"""Training input: the export stage's manifest, each worker's shards on local disk, and tf.data
pipelines over them."""

from __future__ import annotations

from pathlib import Path

from pipeline import lake, run_folder
from pipeline.config import PipelineConfig
from pipeline.errors import PipelineError
from spark_jobs.text.sliding_windows import SPLITS, check_enough_windows


def read_manifest(run: str, config: PipelineConfig) -> dict:
    """The export manifest, checked against the config the model will be built from."""
    uri = lake.join(run, run_folder.MANIFEST_PATH)
    manifest = lake.read_json(uri)
    missing = [key for key in ("block_size", "vocab_size", "num_shards", "splits") if key not in manifest]
    if missing:
        raise PipelineError(f"{uri} lacks {', '.join(missing)}")
    if manifest["block_size"] != config.data.block_size:
        raise PipelineError(
            f"{uri}: block_size {manifest['block_size']} differs from data.block_size {config.data.block_size}; "
            "re-run the window and export stages"
        )
    workers = config.train.num_workers
    for split in SPLITS:
        info = manifest["splits"].get(split)
        if not info or not info.get("shards"):
            raise PipelineError(f"{uri} lists no {split} shards")
        if len(info.get("shard_windows", [])) != len(info["shards"]):
            raise PipelineError(
                f"{uri} lacks the {split} shards' window counts (shard_windows): re-run the export stage"
            )
        if len(info["shards"]) % workers:
            raise PipelineError(
                f"{uri}: {len(info['shards'])} {split} shards cannot be split evenly across {workers} workers"
            )
    splits = manifest["splits"]
    check_enough_windows(
        uri, splits["train"]["windows"], splits["val"]["windows"], len(splits["val"]["shards"]), config
    )
    return manifest


def worker_shards(manifest: dict, split: str, worker: int, workers: int) -> list[str]:
    """Worker i reads shards i, i+W, i+2W, ... (paths relative to tfrecords/)."""
    return manifest["splits"][split]["shards"][worker::workers]


def local_shards(run: str, shards: list[str], local_dir: Path) -> list[str]:
    """Local paths of the shards for TensorFlow, which reads no s3:// by itself: a lake on local
    disk's own files, read in place; from S3, copies in local_dir."""
    uris = [lake.join(run, run_folder.TFRECORDS_FOLDER, shard) for shard in shards]
    if run.startswith("file://"):
        return [lake.local_path(uri) for uri in uris]
    return [str(lake.download_file(uri, local_dir / shard)) for uri, shard in zip(uris, shards, strict=True)]


# A parsed window: input and target ids, int32.
WINDOW_BYTES_PER_TOKEN = 8
SHUFFLE_BUFFER_BYTES = 256 * 2**20


def keep_in_memory(windows: int, block_size: int, room_bytes: float) -> bool:
    """Whether a worker keeps its windows in memory, read and parsed once, rather than reading its
    local shards again on every pass: only while they take at most half the room its model leaves
    (spark_jobs.training.memory), so that a large corpus streams instead of running the worker out of memory."""
    return windows * block_size * WINDOW_BYTES_PER_TOKEN <= room_bytes / 2


def shuffle_buffer(block_size: int) -> int:
    """Windows in the shuffle buffer: 100,000, or fewer long ones (at most about 256 MB)."""
    return min(100_000, max(1_000, SHUFFLE_BUFFER_BYTES // (WINDOW_BYTES_PER_TOKEN * block_size)))


def windows_dataset(files: list[str], block_size: int, in_memory: bool):
    import tensorflow as tf

    features = {
        "input_ids": tf.io.FixedLenFeature([block_size], tf.int64),
        "target_ids": tf.io.FixedLenFeature([block_size], tf.int64),
    }

    def parse(record):
        example = tf.io.parse_single_example(record, features)
        return tf.cast(example["input_ids"], tf.int32), tf.cast(example["target_ids"], tf.int32)

    windows = tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return windows.cache() if in_memory else windows


def train_batches(files: list[str], block_size: int, batch_size: int, seed: int, skip_batches: int, in_memory: bool):
    """Shuffled (a new order each pass, the same orders on every attempt), repeated, batched; the
    first `skip_batches` are skipped so a resumed run continues where its backup was taken."""
    import tensorflow as tf

    windows = windows_dataset(files, block_size, in_memory)
    return (
        windows.shuffle(shuffle_buffer(block_size), seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(batch_size, drop_remainder=True)
        .skip(skip_batches)
        .prefetch(tf.data.AUTOTUNE)
    )


def weighted_windows(files: list[str], block_size: int, in_memory: bool):
    """Validation windows as (inputs, targets, weight 1)."""
    return windows_dataset(files, block_size, in_memory).map(lambda inputs, targets: (inputs, targets, 1.0))


def eval_batches(files: list[str], block_size: int, batch_size: int, in_memory: bool):
    """The validation windows in order, repeated, so every worker can always take the same number
    of batches (collective ops need every worker to run the same steps); each window weighs 1."""
    import tensorflow as tf

    windows = weighted_windows(files, block_size, in_memory)
    return windows.repeat().batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def whole_split_batches(files: list[str], block_size: int, batch_size: int, batches: int):
    """Each of the worker's validation windows once, in order, then blank windows of weight 0 up to
    `batches` full batches: every worker runs the same steps, and no window is scored twice."""
    import tensorflow as tf

    windows = weighted_windows(files, block_size, in_memory=False)
    blank = tf.zeros([block_size], tf.int32)
    padding = tf.data.Dataset.from_tensors((blank, blank, 0.0)).repeat()
    return windows.concatenate(padding).take(batches * batch_size).batch(batch_size).prefetch(tf.data.AUTOTUNE)


def most_windows_per_worker(manifest: dict, split: str, workers: int) -> int:
    """The windows of the worker with the most of a split (worker i reads shards i, i+W, ...)."""
    counts = manifest["splits"][split]["shard_windows"]
    return max(sum(counts[worker::workers]) for worker in range(workers))
