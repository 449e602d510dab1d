"""The GPT-style decoder: token embedding plus positional table, pre-norm causal self-attention
blocks with MLPs and residuals, a final norm and the output projection to the vocabulary, built from
the layers of spark_jobs.model.layers. Plain Keras 3 layers, so the model saves to and loads from
the Keras format by itself.

Its architecture is GPT-2's, weight for weight (spark_jobs.model.export_hf maps it): fused qkv,
GELU's tanh approximation, LayerNorm epsilon 1e-5, and the output projection tied to the token
table, without bias. Models saved before had their own projection ("logits", a Dense with bias)
and the exact GELU; they load and sample as they were (output_head, DecoderBlock.from_config).

The same model runs with a KV cache (CachedDecoder): the prompt once (the prefill), then one token
at a time (the step), each position through the layers' cached calls, which reuse the keys and
values of the positions before. Shapes are fixed, so the two are traced and XLA-compiled once per
batch size (positions are read with gathers, never slices: XLA would compile a slice again for every
start it is given):

- cache: float32 [n_layer, batch, block_size, 2, n_head, head_dim], each block's keys
  ([..., 0, :, :]) and values ([..., 1, :, :]) of each position, laid out as its qkv projection
  reshapes them; positions past the current one hold stale values that the causal mask hides.
- prefill(ids int32 [batch, block_size], length int32 []) -> (logits [batch, vocab], cache): runs the
  first `length` ids (the rest is padding, which causality keeps from the earlier positions) and
  returns the next-token logits after position length - 1.
- step(tokens int32 [batch], position int32 [], cache) -> (logits [batch, vocab], cache): puts the
  tokens at `position`, writes their keys and values into the cache and returns the next logits.

The split with spark_jobs.model.sampler: the model's side is how logits are computed, compiled on
their own (prefill, step) or traced into other compiled code (call_prefill, call_step); the
sampler's is what is drawn from them, and the decode loop, compiled there, that calls the step.
"""

from __future__ import annotations

import weakref

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from pipeline import run_folder
from spark_jobs.model.layers import INIT_STD, DecoderBlock, TokenAndPositionEmbedding

LEGACY_HEAD = "logits"  # the output projection of models saved before it was tied to the token table


def build_decoder(
    vocab_size: int, block_size: int, dim: int, n_layer: int, n_head: int, mlp_ratio: int, dropout: float
) -> keras.Model:
    """ids [B, t] (t <= block_size) -> next-token logits [B, t, vocab_size]."""
    if dim % n_head:
        raise ValueError(f"width {dim} is not divisible by {n_head} heads")
    ids = keras.Input(shape=(None,), dtype="int32", name="ids")
    embedding = TokenAndPositionEmbedding(vocab_size, block_size, dim, name="embedding")
    x = keras.layers.Dropout(dropout)(embedding(ids))
    for index in range(n_layer):
        x = DecoderBlock(dim, n_head, mlp_ratio, dropout, n_layer, name=f"block_{index}")(x)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    return keras.Model(ids, embedding(x, reverse=True), name="gpt_decoder")


def output_head(model: keras.Model):
    """The model's projection from the final norm's outputs to the logits, and the vocabulary size:
    the token table's (tied), or a model saved before, its own "logits" layer."""
    if has_tied_head(model):
        embedding = model.get_layer("embedding")
        return embedding.logits, embedding.vocab_size
    head = model.get_layer(LEGACY_HEAD)
    return head, int(head.kernel.shape[-1])


def has_tied_head(model: keras.Model) -> bool:
    """Whether the model is of today's architecture (GPT-2's), not one saved before it."""
    return LEGACY_HEAD not in [layer.name for layer in model.layers]


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


class CachedDecoder:
    """A decoder of build_decoder's making, run with a KV cache (see the module's notes) through its
    own layers: call_prefill and call_step to trace into one's own compiled code, prefill and step
    compiled alone, compiled_prefill and compiled_step their concrete functions. Called with tensors
    (such as `positions`), those skip tf.function's argument matching, which takes longer than a
    step's compiled work (~0.25 of ~0.4 ms here)."""

    def __init__(self, model: keras.Model):
        self.embedding = model.get_layer("embedding")
        self.blocks = [layer for layer in model.layers if isinstance(layer, DecoderBlock)]
        self.final_norm = model.get_layer("final_norm")
        self.head, self.vocab_size = output_head(model)
        self.block_size, self.dim = self.embedding.block_size, self.embedding.dim
        self.n_head = self.blocks[0].n_head
        self.cache_shape = [len(self.blocks), None, self.block_size, 2, self.n_head, self.dim // self.n_head]
        self.prefill = tf.function(
            self.call_prefill,
            jit_compile=True,
            input_signature=[tf.TensorSpec([None, self.block_size], tf.int32), tf.TensorSpec([], tf.int32)],
        )
        self.step = tf.function(
            self.call_step,
            jit_compile=True,
            input_signature=[
                tf.TensorSpec([None], tf.int32),
                tf.TensorSpec([], tf.int32),
                tf.TensorSpec(self.cache_shape, tf.float32),
            ],
        )
        self.compiled_prefill = self.prefill.get_concrete_function()
        self.compiled_step = self.step.get_concrete_function()
        self.positions = [tf.constant(position, tf.int32) for position in range(self.block_size + 1)]

    def call_with_cache(self, ids, cache, index, last=None):
        """ids [B, t] at positions index..index + t - 1, and the cache -> (the next-token logits
        [B, t, vocab], the cache with the ids' keys and values written in). With `last` (an index
        into the ids), the logits after that one alone, [B, 1, vocab]: the positions after it are
        padding, and the last block's outputs feed no cache. The embedding's dropout is left out: it
        passes everything at inference."""
        x = self.embedding.call_at(ids, index)
        caches = []
        for layer, block in enumerate(self.blocks):
            only_at = last if layer == len(self.blocks) - 1 else None
            x, block_cache = block.call_with_cache(x, cache[layer], index, only_at)
            caches.append(block_cache)
        return self.head(self.final_norm(x)), ops.stack(caches)

    def call_prefill(self, ids, length):
        empty = ops.zeros([len(self.blocks), ops.shape(ids)[0], *self.cache_shape[2:]])
        logits, cache = self.call_with_cache(ids, empty, 0, last=length - 1)
        return logits[:, 0], cache

    def call_step(self, tokens, position, cache):
        logits, cache = self.call_with_cache(tokens[:, None], cache, position)
        return logits[:, 0], cache


_cached_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_decoder(model: keras.Model) -> CachedDecoder:
    """The model's CachedDecoder, built (and compiled, per batch size) once per model object."""
    decoder = _cached_decoders.get(model)
    if decoder is None:
        decoder = _cached_decoders[model] = CachedDecoder(model)
    return decoder
