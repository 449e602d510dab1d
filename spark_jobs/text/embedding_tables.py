"""The embedding tables of the positional_embed stage: token vectors [V, D] and the sinusoidal
position table [T, D]; stored as .npy in the run folder (pipeline.run_folder names where)."""

from __future__ import annotations

import io

import numpy as np

from pipeline import lake

RANDOM_ROW_STD = 0.02  # rows Word2Vec never learned (and every row when it is disabled)


def sinusoidal(block_size: int, dim: int) -> np.ndarray:
    """float32 [block_size, dim]: column 2i is sin(pos / 10000^(2i/dim)), column 2i+1 the cos."""
    positions = np.arange(block_size, dtype=np.float64)[:, None]
    pair = np.arange(dim) // 2
    angles = positions / np.power(10000.0, 2 * pair / dim)[None, :]
    table = np.where(np.arange(dim) % 2 == 0, np.sin(angles), np.cos(angles))
    return table.astype(np.float32)


def token_table(vocab_size: int, dim: int, seed: int, learned: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """float32 [vocab_size, dim]: small seeded random rows, replaced by the learned vectors given."""
    table = np.random.default_rng(seed).normal(0.0, RANDOM_ROW_STD, size=(vocab_size, dim)).astype(np.float32)
    for token_id, vector in (learned or {}).items():
        table[token_id] = vector
    return table


def write_npy(uri: str, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    lake.write_bytes(uri, buffer.getvalue())


def read_npy(uri: str) -> np.ndarray:
    return np.load(io.BytesIO(lake.read_bytes(uri)), allow_pickle=False)
