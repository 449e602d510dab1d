"""The TFRecord codec (spark_jobs/text/tfrecord.py) against TensorFlow itself."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from spark_jobs.text import tfrecord
from spark_jobs.text.embedding_tables import sinusoidal


def tf_example(window: np.ndarray):
    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=window[:-1].tolist())),
                "target_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=window[1:].tolist())),
            }
        )
    )


def read_with_tf_data(path, block_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    spec = {
        "input_ids": tf.io.FixedLenFeature([block_size], tf.int64),
        "target_ids": tf.io.FixedLenFeature([block_size], tf.int64),
    }
    dataset = tf.data.TFRecordDataset([str(path)]).map(lambda record: tf.io.parse_single_example(record, spec))
    return [(item["input_ids"].numpy(), item["target_ids"].numpy()) for item in dataset]


def test_crc32c_known_value():
    assert tfrecord.crc32c(b"123456789") == 0xE3069283
    assert tfrecord.crc32c(b"") == 0


@pytest.mark.parametrize(
    "vocab, block_size, n",
    [(2048, 128, 300), (1_000_000, 7, 50), (300, 2, 3), (50_000, 1024, 5), (128, 16, 1)],
)
def test_round_trip_through_tf_data(tmp_path, vocab, block_size, n):
    rng = np.random.default_rng(vocab + block_size)
    windows = rng.integers(0, vocab, size=(n, block_size + 1))
    windows[0, :] = vocab - 1  # the widest varints
    windows[-1, 0] = 0
    path = tmp_path / "part.tfrecord"
    path.write_bytes(tfrecord.windows_to_tfrecord_bytes(windows))
    records = read_with_tf_data(path, block_size)
    assert len(records) == n
    for (inputs, targets), window in zip(records, windows, strict=True):
        np.testing.assert_array_equal(inputs, window[:-1])
        np.testing.assert_array_equal(targets, window[1:])


def test_examples_and_framing_match_tensorflow(tmp_path):
    windows = np.random.default_rng(1).integers(0, 40_000, size=(20, 65))
    ours = list(tfrecord.iter_records(tfrecord.windows_to_tfrecord_bytes(windows)))
    for record, window in zip(ours, windows, strict=True):
        assert tf.train.Example.FromString(record) == tf_example(window)  # same message
    # Framing and checksums: TensorFlow's writer given our records writes our file, byte for byte.
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in ours:
            writer.write(record)
    assert path.read_bytes() == tfrecord.windows_to_tfrecord_bytes(windows)


def test_batches_concatenate(monkeypatch):
    windows = np.random.default_rng(2).integers(0, 5000, size=(25, 9))
    whole = tfrecord.windows_to_tfrecord_bytes(windows)
    monkeypatch.setattr(tfrecord, "BATCH_ROWS", 4)
    assert tfrecord.windows_to_tfrecord_bytes(windows) == whole
    assert tfrecord.windows_to_tfrecord_bytes(windows[:10]) + tfrecord.windows_to_tfrecord_bytes(windows[10:]) == whole


def test_reader_decodes_and_checks():
    windows = np.random.default_rng(3).integers(0, 3000, size=(4, 6))
    data = tfrecord.windows_to_tfrecord_bytes(windows)
    decoded = [tfrecord.decode_example(record) for record in tfrecord.iter_records(data)]
    assert [d["input_ids"].tolist() for d in decoded] == windows[:, :-1].tolist()
    assert [d["target_ids"].tolist() for d in decoded] == windows[:, 1:].tolist()
    corrupt = bytearray(data)
    corrupt[20] ^= 0xFF
    with pytest.raises(ValueError, match="checksum"):
        list(tfrecord.iter_records(bytes(corrupt)))
    with pytest.raises(ValueError, match="truncated"):
        list(tfrecord.iter_records(data[:-3]))
    assert tfrecord.windows_to_tfrecord_bytes(np.zeros((0, 6), dtype=np.int64)) == b""


def test_shard_writer_is_whole_or_absent(tmp_path):
    windows = np.arange(30).reshape(5, 6)
    writer = tfrecord.ShardWriter((tmp_path / "out" / "part-00000.tfrecord").as_uri())
    writer.write_windows(windows[:2])
    assert list((tmp_path / "out").iterdir())[0].name.startswith(".part-00000.tfrecord.tmp-")  # hidden until done
    writer.write_windows(windows[2:])
    writer.close()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["part-00000.tfrecord"]
    assert len(read_with_tf_data(tmp_path / "out" / "part-00000.tfrecord", 5)) == 5 == writer.records

    broken = tfrecord.ShardWriter((tmp_path / "out" / "part-00001.tfrecord").as_uri())
    broken.write_windows(windows)
    broken.abort()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["part-00000.tfrecord"]


def test_sinusoidal_table():
    table = sinusoidal(16, 6)
    assert table.shape == (16, 6) and table.dtype == np.float32
    np.testing.assert_allclose(table[0], [0, 1, 0, 1, 0, 1], atol=1e-7)
    np.testing.assert_allclose(table[5, 0], np.sin(5), rtol=1e-6)
    np.testing.assert_allclose(table[5, 3], np.cos(5 / 10000 ** (2 / 6)), rtol=1e-6)
    assert sinusoidal(4, 5).shape == (4, 5)  # an odd width works too


def test_validation_batches_repeat_a_workers_few_windows_to_fill_a_batch(tmp_path):
    """A small corpus may give a worker fewer validation windows than its batch: the batch holds
    them repeated, each as often as the others when the batch is a multiple of their number."""
    from spark_jobs.training.input_pipeline import eval_batches

    windows = np.arange(3 * 5, dtype=np.int64).reshape(3, 5)  # 3 windows of T + 1 = 5 ids
    path = tmp_path / "part-00000.tfrecord"
    path.write_bytes(tfrecord.windows_to_tfrecord_bytes(windows))
    inputs, targets, weights = next(iter(eval_batches([str(path)], block_size=4, batch_size=6, in_memory=True)))
    assert inputs.numpy().tolist() == [window[:-1] for window in windows.tolist()] * 2
    assert targets.numpy().tolist() == [window[1:] for window in windows.tolist()] * 2
    assert weights.numpy().tolist() == [1.0] * 6  # every window of a periodic pass counts
