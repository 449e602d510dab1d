"""The decoder's layers: the token and position embedding (whose token table is also the output
projection: GPT-2's tied head), and the pre-norm causal self-attention block. Each has its `call`,
the full pass over a window that training and the Keras model run, and a cached form for sampling
one position at a time, which runs the same sublayers with the same weights (the model-level cached
pass: spark_jobs.model.decoder.CachedDecoder):

- TokenAndPositionEmbedding.call_at(ids, start): the ids placed at positions start, start + 1, ...
- DecoderBlock.call_with_cache(x, cache, index): the block on x placed at positions index, index + 1,
  ..., attending to the keys and values of the positions before it, kept in `cache`; returns the
  cache with x's own written in.

Saved models name these classes and their config keys (registered under package "gpt_pipeline"):
renaming either, or a sublayer attribute (its weights are saved under that name), would stop the
models saved before from loading: add methods, as the cached forms are, and give a new config key a
from_config default that keeps the older models' behaviour (DecoderBlock's `gelu`).
"""

from __future__ import annotations

import math

import keras
from keras import ops

INIT_STD = 0.02
GELUS = ("tanh", "exact")


def normal_initializer(std: float = INIT_STD) -> keras.initializers.Initializer:
    return keras.initializers.RandomNormal(stddev=std)


@keras.saving.register_keras_serializable(package="gpt_pipeline")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """ids [B, t] -> token vectors + position vectors [B, t, D] for t <= block_size; called with
    reverse=True, vectors [B, t, D] -> logits [B, t, vocab_size] over the same token table (no bias)."""

    def __init__(self, vocab_size: int, block_size: int, dim: int, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.block_size, self.dim = vocab_size, block_size, dim

    def build(self, input_shape):
        self.tokens = self.add_weight(
            name="tokens", shape=(self.vocab_size, self.dim), initializer=normal_initializer()
        )
        self.positions = self.add_weight(
            name="positions", shape=(self.block_size, self.dim), initializer=normal_initializer()
        )

    def call(self, inputs, reverse=False):
        if reverse:
            return self.logits(inputs)
        length = ops.shape(inputs)[1]
        return ops.take(self.tokens, inputs, axis=0) + self.positions[:length]

    def logits(self, x):
        """x [B, t, D] -> x @ tokens^T [B, t, vocab_size]: the output projection tied to the token table."""
        return ops.matmul(x, ops.transpose(self.tokens))

    def call_at(self, ids, start):
        """ids [B, t] at positions start..start + t - 1 -> [B, t, D]. The positions are read with a
        gather, not a slice: compiled by XLA, a slice is compiled again for every start it is given."""
        positions = start + ops.arange(ops.shape(ids)[1], dtype="int32")
        return ops.take(self.tokens, ids, axis=0) + ops.take(self.positions, positions, axis=0)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "block_size": self.block_size, "dim": self.dim}


@keras.saving.register_keras_serializable(package="gpt_pipeline")
class DecoderBlock(keras.layers.Layer):
    """x + attention(norm(x)), then x + mlp(norm(x)); attention is causal, heads of width dim / n_head.
    The MLP's GELU is `gelu`: "tanh", GPT-2's approximation, or "exact" (erf), that of models saved
    before it was GPT-2's, which load with it.

    The cache of one block: float32 [B, block_size, 2, n_head, head_dim], the keys ([:, :, 0]) and
    values ([:, :, 1]) of each position, laid out as the qkv projection reshapes them."""

    def __init__(
        self, dim: int, n_head: int, mlp_ratio: int, dropout: float, n_layer: int, gelu: str = "tanh", **kwargs
    ):
        super().__init__(**kwargs)
        if gelu not in GELUS:
            raise ValueError(f"gelu {gelu!r}: one of {', '.join(GELUS)}")
        self.dim, self.n_head, self.mlp_ratio, self.dropout, self.n_layer = dim, n_head, mlp_ratio, dropout, n_layer
        self.gelu = gelu
        # As in GPT-2: residual projections start smaller the deeper the network.
        residual_init = normal_initializer(INIT_STD / math.sqrt(2 * n_layer))
        self.attention_norm = keras.layers.LayerNormalization(epsilon=1e-5)
        self.qkv = keras.layers.Dense(3 * dim, kernel_initializer=normal_initializer())
        self.attention_out = keras.layers.Dense(dim, kernel_initializer=residual_init)
        self.mlp_norm = keras.layers.LayerNormalization(epsilon=1e-5)
        self.mlp_in = keras.layers.Dense(mlp_ratio * dim, kernel_initializer=normal_initializer())
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

    def call(self, x, training=False):
        query, keys_values = self._heads(x)
        attended = ops.dot_product_attention(query, keys_values[:, :, 0], keys_values[:, :, 1], is_causal=True)
        return self._after_attention(x, attended, training)

    def call_with_cache(self, x, cache, index, only_at=None):
        """x [B, t, D] at positions index..index + t - 1, and the block's cache (see the class) ->
        (the block's outputs [B, t, D], the cache with x's keys and values written at index). Each
        position attends to the cached positions up to itself: those after index + t - 1 may hold
        stale values, never seen. With only_at (an index into x), only that position's outputs are
        computed, [B, 1, D]: the keys and values of all of x are still written."""
        query, keys_values = self._heads(x)
        cache = ops.slice_update(cache, [0, index, 0, 0, 0], keys_values)
        if only_at is not None:
            wanted = ops.reshape(only_at, [1])
            x, query, index = ops.take(x, wanted, axis=1), ops.take(query, wanted, axis=1), index + only_at
        length, cached = ops.shape(x)[1], ops.shape(cache)[1]
        visible = ops.arange(cached, dtype="int32")[None] <= (index + ops.arange(length, dtype="int32"))[:, None]
        attended = ops.dot_product_attention(query, cache[:, :, 0], cache[:, :, 1], mask=visible)
        return self._after_attention(x, attended, training=False), cache

    def _heads(self, x):
        """x [B, t, D] -> the queries [B, t, n_head, head_dim] of norm(x), and its keys and values
        [B, t, 2, n_head, head_dim]."""
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        qkv = ops.reshape(self.qkv(self.attention_norm(x)), (batch, length, 3, self.n_head, self.dim // self.n_head))
        return qkv[:, :, 0], qkv[:, :, 1:]

    def _after_attention(self, x, attended, training):
        """The block's outputs from its inputs x [B, t, D] and their heads' attention [B, t, n_head, head_dim]."""
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        merged = ops.reshape(attended, (batch, length, self.dim))
        x = x + self.residual_dropout(self.attention_out(merged), training=training)
        hidden = ops.gelu(self.mlp_in(self.mlp_norm(x)), approximate=self.gelu == "tanh")
        return x + self.residual_dropout(self.mlp_out(hidden), training=training)

    def get_config(self):
        return {
            **super().get_config(),
            "dim": self.dim,
            "n_head": self.n_head,
            "mlp_ratio": self.mlp_ratio,
            "dropout": self.dropout,
            "n_layer": self.n_layer,
            "gelu": self.gelu,
        }

    @classmethod
    def from_config(cls, config):
        # A config without the key is a model's saved before the GELU became GPT-2's: it keeps its own.
        return cls(**{"gelu": "exact", **config})
