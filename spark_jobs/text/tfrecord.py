"""TFRecord files of `tf.train.Example`s without TensorFlow: a vectorised numpy encoder for windows,
a writer to the lake, and a reader (framing, CRC check, Example decoding) for tests and tools.

A window of T+1 token ids becomes one Example with two features, both int64 lists of length T:
`input_ids` = ids[:T] and `target_ids` = ids[1:]. `tf.data.TFRecordDataset` +
`tf.io.parse_single_example` read these files; tests/spark_jobs/test_tfrecord.py checks that byte for byte
against `tf.io.TFRecordWriter` and `tf.train.Example.SerializeToString`.

Record framing (TFRecord): uint64 length (little endian), masked CRC32C of those 8 bytes, the
data, masked CRC32C of the data. Everything below works on a batch of records at once, held as a
padded uint8 matrix plus a length per row, so the per-record cost is a few numpy operations.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np

from pipeline import lake

INPUT_KEY = b"input_ids"
TARGET_KEY = b"target_ids"
BATCH_ROWS = 8192  # windows encoded per numpy pass (bounds the temporary arrays)

_CRC_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_MASK_DELTA = 0xA282EAD8


def _crc_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC_POLY if crc & 1 else crc >> 1
        table[i] = crc
    return table


_CRC_TABLE = _crc_table()


def crc32c_ragged(data: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CRC-32C of each record of a ragged array: `data` holds the records back to back (uint8),
    `lengths[i]` bytes each. All records advance one byte per numpy step."""
    n = len(lengths)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    starts = np.cumsum(lengths) - lengths
    # Longest first: at byte j the records still going are a prefix of this order.
    order = np.argsort(-lengths, kind="stable")
    position = starts[order]
    active = np.searchsorted(-lengths[order], -np.arange(1, int(lengths.max()) + 1), side="right")
    # Byte j of every record in row j (the padding reads any byte in range): contiguous reads below.
    columns = position[None, :] + np.arange(active.size)[:, None]
    by_position = data[np.minimum(columns, data.size - 1)]
    crc = np.full(n, 0xFFFFFFFF, dtype=np.uint32)
    table = _CRC_TABLE
    for j, k in enumerate(active):
        head = crc[:k]
        crc[:k] = table[(head ^ by_position[j, :k]) & 0xFF] ^ (head >> 8)
    result = np.empty(n, dtype=np.uint32)
    result[order] = crc ^ 0xFFFFFFFF
    return result


def crc32c(data: bytes) -> int:
    return int(crc32c_ragged(np.frombuffer(data, dtype=np.uint8), np.array([len(data)]))[0])


def masked_crc(crc: np.ndarray) -> np.ndarray:
    crc = crc.astype(np.uint64)
    rotated = ((crc >> np.uint64(15)) | (crc << np.uint64(17))) & np.uint64(0xFFFFFFFF)
    return ((rotated + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _varint_size(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.uint64, copy=False)
    size = np.ones(values.shape, dtype=np.int64)
    top = int(values.max()) if values.size else 0
    for k in range(1, 10):
        if top < 1 << (7 * k):
            break
        size += values >= np.uint64(1 << (7 * k))
    return size


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint encodings of non-negative ints [...] as padded bytes uint8 [..., width] and sizes [...]."""
    values = values.astype(np.uint64, copy=False)
    size = _varint_size(values)
    width = int(size.max()) if size.size else 1
    groups = np.empty(values.shape + (width,), dtype=np.uint8)
    for k in range(width):
        byte = (values >> np.uint64(7 * k)) & np.uint64(0x7F)
        if k < width - 1:
            byte |= (size > k + 1).astype(np.uint64) << np.uint64(7)
        groups[..., k] = byte
    return groups, size


def _const(row: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.tile(np.frombuffer(row, dtype=np.uint8), (n, 1)), np.full(n, len(row), dtype=np.int64)


def gather(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A ragged array whose record i is source[starts[i, 0]:][:lengths[i, 0]] + source[starts[i, 1]:][:lengths[i, 1]]
    + ... (starts, lengths: [N, S]): the records back to back, and their lengths. One gather."""
    flat_lengths = lengths.ravel()
    out_starts = np.cumsum(flat_lengths) - flat_lengths
    index = np.arange(int(flat_lengths.sum())) + np.repeat(starts.ravel() - out_starts, flat_lengths)
    return source[index], lengths.sum(axis=1)


def concat_rows(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Padded byte rows (matrix [N, W], lengths [N]) concatenated part by part into a ragged array:
    record i is part0[i][:len0[i]] + part1[i][:len1[i]] + ..."""
    n = parts[0][0].shape[0]
    bases = np.cumsum([0] + [matrix.size for matrix, _ in parts[:-1]])
    rows = np.arange(n)
    starts = np.stack([base + rows * matrix.shape[1] for base, (matrix, _) in zip(bases, parts, strict=True)], axis=1)
    source = np.concatenate([matrix.ravel() for matrix, _ in parts])
    return gather(source, starts, np.stack([lengths for _, lengths in parts], axis=1))


def _entry_header(key: bytes, payload: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The bytes of a `features.feature` map entry {key: Feature(int64_list=Int64List(value=...))}
    up to its packed values (`payload` bytes long), as padded parts; the entry's own tag and length
    are not included."""
    n = len(payload)
    list_len = 1 + _varint_size(payload) + payload  # Int64List: tag 0x0A, length, packed varints
    feature_len = 1 + _varint_size(list_len) + list_len  # Feature.int64_list: tag 0x1A, length, list
    return [
        _const(b"\x0a" + bytes([len(key)]) + key + b"\x12", n),  # entry.key, then entry.value's tag
        _varints(feature_len),
        _const(b"\x1a", n),
        _varints(list_len),
        _const(b"\x0a", n),
        _varints(payload),
    ]


def encode_examples(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Serialized `tf.train.Example`s of windows int [N, T+1], as a ragged array (bytes, lengths)."""
    windows = np.asarray(windows)
    if windows.ndim != 2 or windows.shape[1] < 2:
        raise ValueError(f"windows must be [N, T+1] with T >= 1, got shape {windows.shape}")
    n = windows.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.int64)
    if windows.min() < 0:
        raise ValueError("token ids must be non-negative")
    groups, size = _varints(windows)  # [N, T+1, K], [N, T+1]
    stream = groups[np.arange(groups.shape[-1]) < size[..., None]]  # every window's packed varints, in order
    window_len = size.sum(axis=1)
    window_start = np.cumsum(window_len) - window_len
    input_len = window_len - size[:, -1]  # ids[:T]
    target_len = window_len - size[:, 0]  # ids[1:]
    input_header = _entry_header(INPUT_KEY, input_len)
    target_header = _entry_header(TARGET_KEY, target_len)
    input_entry = sum(part[1] for part in input_header) + input_len
    target_entry = sum(part[1] for part in target_header) + target_len
    features_len = 1 + _varint_size(input_entry) + input_entry + 1 + _varint_size(target_entry) + target_entry
    head, head_len = concat_rows(
        [_const(b"\x0a", n), _varints(features_len), _const(b"\x0a", n), _varints(input_entry)] + input_header
    )
    middle, middle_len = concat_rows([_const(b"\x0a", n), _varints(target_entry)] + target_header)
    source = np.concatenate([stream, head, middle])
    starts = np.stack(
        [
            stream.size + np.cumsum(head_len) - head_len,
            window_start,
            stream.size + head.size + np.cumsum(middle_len) - middle_len,
            window_start + size[:, 0],
        ],
        axis=1,
    )
    return gather(source, starts, np.stack([head_len, input_len, middle_len, target_len], axis=1))


def frame_records(data: np.ndarray, lengths: np.ndarray) -> bytes:
    """TFRecord framing of a ragged array of records: the bytes of a TFRecord file holding them."""
    n = len(lengths)
    if n == 0:
        return b""
    length_bytes = lengths.astype("<u8").view(np.uint8)
    length_crc = masked_crc(crc32c_ragged(length_bytes, np.full(n, 8))).astype("<u4").view(np.uint8)
    data_crc = masked_crc(crc32c_ragged(data, lengths)).astype("<u4").view(np.uint8)
    source = np.concatenate([length_bytes, length_crc, data, data_crc])
    rows = np.arange(n)
    starts = np.stack(
        [rows * 8, 8 * n + rows * 4, 12 * n + np.cumsum(lengths) - lengths, 12 * n + data.size + rows * 4], axis=1
    )
    framed, _ = gather(source, starts, np.stack([np.full(n, 8), np.full(n, 4), lengths, np.full(n, 4)], axis=1))
    return framed.tobytes()


def windows_to_tfrecord_bytes(windows: np.ndarray) -> bytes:
    """TFRecord file bytes for windows [N, T+1], encoded BATCH_ROWS at a time."""
    return b"".join(
        frame_records(*encode_examples(windows[start : start + BATCH_ROWS]))
        for start in range(0, len(windows), BATCH_ROWS)
    )


class ShardWriter:
    """One TFRecord file streamed to the lake, whole or absent (pipeline.lake.AtomicFile)."""

    def __init__(self, uri: str):
        self.file = lake.AtomicFile(uri)
        self.records = 0
        self.bytes = 0

    def write_windows(self, windows: np.ndarray) -> None:
        self.write_records(windows_to_tfrecord_bytes(windows), len(windows))

    def write_records(self, data: bytes, count: int) -> None:
        """Append already framed records (TFRecord files concatenate)."""
        self.file.stream.write(data)
        self.records += count
        self.bytes += len(data)

    def close(self) -> None:
        self.file.commit()

    def abort(self) -> None:
        self.file.abort()


def iter_records(data: bytes) -> Iterator[bytes]:
    """The records of a TFRecord file's bytes; raises ValueError on a truncated or corrupt file."""
    position = 0
    while position < len(data):
        if position + 12 > len(data):
            raise ValueError(f"truncated record header at byte {position}")
        header = data[position : position + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[position + 8 : position + 12])
        end = position + 12 + length + 4
        if end > len(data):
            raise ValueError(f"truncated record at byte {position}")
        record = data[position + 12 : position + 12 + length]
        (data_crc,) = struct.unpack("<I", data[end - 4 : end])
        if int(masked_crc(np.array([crc32c(header)]))[0]) != header_crc:
            raise ValueError(f"bad length checksum at byte {position}")
        if int(masked_crc(np.array([crc32c(record)]))[0]) != data_crc:
            raise ValueError(f"bad data checksum at byte {position}")
        yield record
        position = end


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, bytes | int]]:
    """(field number, payload) of a protobuf message's fields: bytes for length-delimited fields,
    the value for varints."""
    position = 0
    while position < len(data):
        tag, position = _read_varint(data, position)
        if tag & 7 == 0:
            value, position = _read_varint(data, position)
            yield tag >> 3, value
        elif tag & 7 == 2:
            length, position = _read_varint(data, position)
            yield tag >> 3, data[position : position + length]
            position += length
        else:
            raise ValueError(f"unexpected wire type {tag & 7}")


def decode_example(record: bytes) -> dict[str, np.ndarray]:
    """The int64-list features of a serialized tf.train.Example (what export writes)."""
    features: dict[str, np.ndarray] = {}
    for number, payload in _fields(record):
        if number != 1:
            continue
        for entry_number, entry in _fields(payload):
            if entry_number != 1:
                continue
            key, value = "", b""
            for field, content in _fields(entry):
                if field == 1:
                    key = content.decode("utf-8")
                elif field == 2:
                    value = content
            ids: list[int] = []
            for kind, int_list in _fields(value):
                if kind != 3:
                    raise ValueError(f"feature {key!r} is not an int64 list")
                for _, packed in _fields(int_list):
                    if isinstance(packed, int):  # an unpacked value
                        ids.append(packed)
                        continue
                    position = 0
                    while position < len(packed):
                        number_value, position = _read_varint(packed, position)
                        ids.append(number_value)
            features[key] = np.array(ids, dtype=np.int64)
    return features
