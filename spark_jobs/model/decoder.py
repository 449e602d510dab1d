"""The GPT-style decoder: token embedding plus positional table, pre-norm causal self-attention
blocks with MLPs and residuals, a final norm and the output projection to the vocabulary.

Plain Keras 3 layers, so the model saves to and loads from the Keras format by itself.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from pipeline import run_folder

INIT_STD = 0.02


def _normal(std: float = INIT_STD) -> keras.initializers.Initializer:
    return keras.initializers.RandomNormal(stddev=std)


@keras.saving.register_keras_serializable(package="gpt_pipeline")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """ids [B, t] -> token vectors + position vectors [B, t, D] for t <= block_size."""

    def __init__(self, vocab_size: int, block_size: int, dim: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.block_size, self.dim = vocab_size, block_size, dim

    def build(self, input_shape):
        self.tokens = self.add_weight(name="tokens", shape=(self.vocab_size, self.dim), initializer=_normal())
        self.positions = self.add_weight(name="positions", shape=(self.block_size, self.dim), initializer=_normal())

    def call(self, ids):
        length = ops.shape(ids)[1]
        return ops.take(self.tokens, ids, axis=0) + self.positions[:length]

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "block_size": self.block_size, "dim": self.dim}


@keras.saving.register_keras_serializable(package="gpt_pipeline")
class DecoderBlock(keras.layers.Layer):
    """x + attention(norm(x)), then x + mlp(norm(x)); attention is causal, heads of width dim / n_head."""

    def __init__(self, dim: int, n_head: int, mlp_ratio: int, dropout: float, n_layer: int, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.n_head, self.mlp_ratio, self.dropout, self.n_layer = dim, n_head, mlp_ratio, dropout, n_layer
        # As in GPT-2: residual projections start smaller the deeper the network.
        residual_init = _normal(INIT_STD / math.sqrt(2 * n_layer))
        self.attention_norm = keras.layers.LayerNormalization(epsilon=1e-5)
        self.qkv = keras.layers.Dense(3 * dim, kernel_initializer=_normal())
        self.attention_out = keras.layers.Dense(dim, kernel_initializer=residual_init)
        self.mlp_norm = keras.layers.LayerNormalization(epsilon=1e-5)
        self.mlp_in = keras.layers.Dense(mlp_ratio * dim, activation="gelu", kernel_initializer=_normal())
        self.mlp_out = keras.layers.Dense(dim, kernel_initializer=residual_init)
        self.residual_dropout = keras.layers.Dropout(dropout)

    def build(self, input_shape):
        for layer, width in [
            (self.attention_norm, self.dim),
            (self.qkv, self.dim),
            (self.attention_out, self.dim),
            (self.mlp_norm, self.dim),
            (self.mlp_in, self.dim),
            (self.mlp_out, self.mlp_ratio * self.dim),
        ]:
            layer.build((None, None, width))

    def attention(self, x, training):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        head_dim = self.dim // self.n_head
        qkv = ops.reshape(self.qkv(x), (batch, length, 3, self.n_head, head_dim))
        query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, t, heads, head_dim]
        attended = ops.dot_product_attention(query, key, value, is_causal=True)
        merged = ops.reshape(attended, (batch, length, self.dim))
        return self.residual_dropout(self.attention_out(merged), training=training)

    def call(self, x, training=False):
        x = x + self.attention(self.attention_norm(x), training)
        return x + self.residual_dropout(self.mlp_out(self.mlp_in(self.mlp_norm(x))), training=training)

    def get_config(self):
        return {
            **super().get_config(),
            "dim": self.dim,
            "n_head": self.n_head,
            "mlp_ratio": self.mlp_ratio,
            "dropout": self.dropout,
            "n_layer": self.n_layer,
        }


def build_decoder(
    vocab_size: int, block_size: int, dim: int, n_layer: int, n_head: int, mlp_ratio: int, dropout: float
) -> keras.Model:
    """ids [B, t] (t <= block_size) -> next-token logits [B, t, vocab_size]."""
    if dim % n_head:
        raise ValueError(f"width {dim} is not divisible by {n_head} heads")
    ids = keras.Input(shape=(None,), dtype="int32", name="ids")
    x = TokenAndPositionEmbedding(vocab_size, block_size, dim, name="embedding")(ids)
    x = keras.layers.Dropout(dropout)(x)
    for index in range(n_layer):
        x = DecoderBlock(dim, n_head, mlp_ratio, dropout, n_layer, name=f"block_{index}")(x)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    logits = keras.layers.Dense(vocab_size, kernel_initializer=_normal(), name="logits")(x)
    return keras.Model(ids, logits, name="gpt_decoder")


def decoder_for(config, vocab_size: int | None = None, block_size: int | None = None, dropout: float | None = None):
    """build_decoder in the shape a PipelineConfig gives; the vocabulary, block size and dropout
    are the config's unless given (the train stage takes the first two from export's manifest)."""
    return build_decoder(
        vocab_size=config.tokenizer.vocab_size if vocab_size is None else vocab_size,
        block_size=config.data.block_size if block_size is None else block_size,
        dim=config.embedding.dim,
        n_layer=config.model.n_layer,
        n_head=config.model.n_head,
        mlp_ratio=config.model.mlp_ratio,
        dropout=config.model.dropout if dropout is None else dropout,
    )


def initialise_embedding(model: keras.Model, token_vectors: np.ndarray | None, positions: np.ndarray) -> None:
    """Start the embedding from the pipeline's tables: the Word2Vec token vectors (rescaled to the
    model's initial scale, so they do not swamp the positions) and the sinusoidal position table."""
    layer = model.get_layer("embedding")
    expected = {"token_vectors": tuple(layer.tokens.shape), "positions": tuple(layer.positions.shape)}
    files = {"token_vectors": run_folder.TOKEN_VECTORS_PATH, "positions": run_folder.POSITIONS_PATH}
    for name, table in [("token_vectors", token_vectors), ("positions", positions)]:
        if table is not None and tuple(table.shape) != expected[name]:
            raise ValueError(f"{files[name]} has shape {tuple(table.shape)}, the model needs {expected[name]}")
    if token_vectors is not None:
        layer.tokens.assign(_rescaled(token_vectors))
    layer.positions.assign(_rescaled(positions))


def _rescaled(table: np.ndarray) -> np.ndarray:
    std = float(table.std())
    return (table * (INIT_STD / std if std > 0 else 1.0)).astype("float32")
