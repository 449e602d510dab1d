"""Room for a run's data in a local lake, and on EMR's core nodes, checked before anything runs.

The windows/ Parquet and the TFRecords hold every window's ids, so they grow with the corpus times
(data.block_size + 1) / data.stride: at the default 129 / 64 they are a few times the corpus, but
data.stride = 1 puts every token in 129 windows and makes them hundreds of times its size. The
estimate is the least they can take (few tokens per byte, well-compressed ids), so a run that fits
is never refused; tinyshakespeare's actual windows/ and tfrecords/ are about 3 times it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline import lake
from pipeline.config import PipelineConfig
from pipeline.errors import PipelineError

CORPUS_BYTES_PER_TOKEN = 6  # BPE tokens of text hold fewer (tinyshakespeare at 2,048 ids: 2.9)
WINDOW_BYTES_PER_ID = 1.0  # an id in windows/ Parquet, compressed (measured: 1.5)
TFRECORD_BYTES_PER_ID = 1.5  # a varint id in a tf.train.Example, input and target (measured: 2.1)
GB = 1e9


def least_run_bytes(config: PipelineConfig, corpus_bytes: int) -> dict[str, float]:
    """The fewest bytes windows/ and tfrecords/ can take for a corpus of corpus_bytes, and the
    number of windows that estimate rests on."""
    block_size = config.data.block_size
    windows = corpus_bytes / CORPUS_BYTES_PER_TOKEN / config.data.stride
    return {
        "windows": windows,
        "windows_bytes": windows * (block_size + 1) * WINDOW_BYTES_PER_ID,
        "tfrecords_bytes": windows * 2 * block_size * TFRECORD_BYTES_PER_ID,
    }


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds path, or would once it is created."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check_lake_room(config: PipelineConfig, sizes: dict[str, int]) -> None:
    """Stop a run whose windows and TFRecords cannot fit in a local lake's free space (a lake on S3
    has no such limit)."""
    if not config.lake.startswith("file://"):
        return
    need = least_run_bytes(config, sum(sizes.values()))
    total = need["windows_bytes"] + need["tfrecords_bytes"]
    free = free_bytes(Path(lake.local_path(config.lake)))
    if total <= free:
        return
    block_size, stride = config.data.block_size, config.data.stride
    overlap = (
        f": each token is in about {(block_size + 1) / stride:,.0f} of them, data.block_size + 1 = {block_size + 1} "
        f"over data.stride = {stride}"
        if stride < block_size
        else ""
    )
    raise PipelineError(
        f"the run's windows and TFRecords need at least {total / GB:,.1f} GB (windows/ "
        f"{need['windows_bytes'] / GB:,.1f}, "
        f"tfrecords/ {need['tfrecords_bytes'] / GB:,.1f} for about {need['windows']:,.0f} windows{overlap}), more "
        f"than the {free / GB:,.1f} GB free for lake {config.lake}: raise data.stride, or put the lake on a larger disk"
    )


def check_core_node_room(config: PipelineConfig, sizes: dict[str, int]) -> None:
    """On EMR each training worker copies its share of the TFRecords to its core node's disk: with
    emr.core_ebs_gb set, stop a run whose share cannot fit on that volume."""
    volume_gb = config.emr.core_ebs_gb
    if volume_gb is None:
        return
    share = least_run_bytes(config, sum(sizes.values()))["tfrecords_bytes"] / config.train.num_workers
    if share <= volume_gb * GB:
        return
    raise PipelineError(
        f"each of the {config.train.num_workers} training workers copies at least {share / GB:,.1f} GB of TFRecord "
        f"shards to its core node, more than its emr.core_ebs_gb = {volume_gb} GB volume: raise emr.core_ebs_gb "
        "or data.stride"
    )
