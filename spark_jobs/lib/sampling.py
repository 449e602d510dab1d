"""Fast sampling from the decoder: the prompt is run once (prefill), then every new token goes
through one compiled step that reuses the keys and values of the earlier positions (a KV cache).

The steps call the trained model's own layers (spark_jobs.lib.model: the embedding tables, each
DecoderBlock's norms, qkv, attention_out and MLP, the final norm and the output projection), so any
saved model samples this way, with no change to its format; only the attention is written out here,
one query against the cached keys.

Shapes are fixed, so the two functions are traced and XLA-compiled once per batch size (positions
are read with gathers, never slices: XLA would compile a slice again for every start it is given):

- cache: float32 [n_layer, batch, block_size, 2, n_head, head_dim], the keys ([..., 0, :, :]) and
  values ([..., 1, :, :]) of each position, laid out as the block's qkv projection reshapes them;
  positions past the current one hold stale values that the causal mask hides.
- prefill(ids int32 [batch, block_size], length int32 []) -> (logits [batch, vocab], cache): runs the
  first `length` ids (the rest is padding, which causality keeps from the earlier positions) and
  returns the next-token logits after position length - 1.
- step(tokens int32 [batch], position int32 [], cache) -> (logits [batch, vocab], cache): puts the
  tokens at `position`, writes their keys and values into the cache and returns the next logits.

Past block_size. The model has learned absolute positions: a token is drawn from the last
block_size tokens seen at positions 0..block_size-1. Once the text is longer, sliding the window by
one moves every token to another position, which changes every key and value, so no cache survives a
slide. The window therefore slides by `window_slide` tokens at a time and is prefilled again:

- window_slide=1 (the default) is exact: the same conditioning as running the whole model on the
  last block_size tokens, but every token past the block costs a full prefill of block_size tokens.
- window_slide=s > 1 keeps the last block_size - s + 1 tokens when the window is full, prefills them
  and continues with cached steps: a prefill per s tokens, each token conditioned on between
  block_size - s + 1 and block_size tokens. An approximation (shorter contexts than the model's),
  to be asked for explicitly, e.g. block_size // 2.

Several samples are one batch, each drawn with its own random stream from its own logits: a sample
does not depend on the others (beyond float rounding of a batched matrix product).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla

from spark_jobs.lib.model import DecoderBlock

# What keras masks attention logits with (keras.src.backend.tensorflow.nn._get_large_negative):
# the same value, so the cached step's softmax is the full pass's.
LARGE_NEGATIVE = -0.7 * float(np.finfo(np.float32).max)


class CachedDecoder:
    """The compiled prefill and step of a Keras decoder (spark_jobs.lib.model.build_decoder)."""

    def __init__(self, model):
        embedding = model.get_layer("embedding")
        self.token_table, self.position_table = embedding.tokens, embedding.positions
        self.block_size, self.dim = embedding.block_size, embedding.dim
        self.blocks = [layer for layer in model.layers if isinstance(layer, DecoderBlock)]
        self.final_norm, self.head = model.get_layer("final_norm"), model.get_layer("logits")
        self.vocab_size = int(self.head.kernel.shape[-1])
        self.n_head = self.blocks[0].n_head
        self.head_dim = self.dim // self.n_head
        self.scale = 1.0 / math.sqrt(self.head_dim)
        cache = tf.TensorSpec([len(self.blocks), None, self.block_size, 2, self.n_head, self.head_dim], tf.float32)
        self.prefill = tf.function(
            self._prefill,
            jit_compile=True,
            input_signature=[tf.TensorSpec([None, self.block_size], tf.int32), tf.TensorSpec([], tf.int32)],
        )
        self.step = tf.function(
            self._step,
            jit_compile=True,
            input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32), cache],
        )

        # Called as concrete functions with tensors, they skip tf.function's argument matching, which takes
        # longer than a step's compiled work (~0.25 of ~0.4 ms here).
        self.compiled_prefill = self.prefill.get_concrete_function()
        self.compiled_step = self.step.get_concrete_function()
        self.positions = [tf.constant(position, tf.int32) for position in range(self.block_size + 1)]

    def _attend(self, query, keys_values, position):
        """query [B, 1, heads, head_dim] against the cached positions 0..position: [B, 1, heads, head_dim]."""
        keys, values = keys_values[:, :, 0], keys_values[:, :, 1]
        logits = tf.einsum("BTNH,BSNH->BNTS", query, keys) * self.scale
        visible = tf.range(self.block_size) <= position
        probabilities = tf.nn.softmax(tf.where(visible[None, None, None, :], logits, LARGE_NEGATIVE), axis=-1)
        return tf.einsum("BNTS,BSNH->BTNH", probabilities, values)

    def _finish_block(self, block, x, query, keys_values, position):
        """x [B, 1, D] after the block, its query at `position` attending to the cache."""
        batch = tf.shape(x)[0]
        attended = tf.reshape(self._attend(query, keys_values, position), (batch, 1, self.dim))
        x = x + block.attention_out(attended)
        return x + block.mlp_out(block.mlp_in(block.mlp_norm(x)))

    def _logits(self, x):
        """x [B, 1, D] -> next-token logits [B, vocab]."""
        return self.head(self.final_norm(x))[:, 0]

    def _qkv(self, block, x):
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        return tf.reshape(block.qkv(block.attention_norm(x)), (batch, length, 3, self.n_head, self.head_dim))

    def _prefill(self, ids, length):
        x = tf.gather(self.token_table, ids) + self.position_table[None]
        cache = []
        last = length - 1
        for index, block in enumerate(self.blocks):
            qkv = self._qkv(block, x)
            cache.append(qkv[:, :, 1:])
            if index < len(self.blocks) - 1:  # every position, as the model's own DecoderBlock.call
                x = block(x, training=False)
            else:  # the last block only at the last position: the others feed no cache
                query, x_last = tf.gather(qkv[:, :, 0], [last], axis=1), tf.gather(x, [last], axis=1)
                x = self._finish_block(block, x_last, query, cache[-1], last)
        return self._logits(x), tf.stack(cache)

    def _step(self, tokens, position, cache):
        x = (tf.gather(self.token_table, tokens) + tf.gather(self.position_table, position))[:, None]  # [B, 1, D]
        layers = []
        for index, block in enumerate(self.blocks):
            qkv = self._qkv(block, x)
            keys_values = xla.dynamic_update_slice(cache[index], qkv[:, :, 1:], [0, position, 0, 0, 0])
            layers.append(keys_values)
            x = self._finish_block(block, x, qkv[:, :, 0], keys_values, position)
        return self._logits(x), tf.stack(layers)


_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_decoder(model) -> CachedDecoder:
    """The model's compiled decoder, built (and compiled, per batch size) once per model object."""
    decoder = _decoders.get(model)
    if decoder is None:
        decoder = _decoders[model] = CachedDecoder(model)
    return decoder


Pick = Callable[[int, np.ndarray], int]  # (sample index, its next-token logits) -> the token drawn


def decode(
    model,
    prompt: Sequence[int],
    num_samples: int,
    max_new_tokens: int,
    pick: Pick,
    stop_id: int | None = None,
    known: int | None = None,
    window_slide: int = 1,
) -> list[list[int]]:
    """The new tokens of num_samples continuations of `prompt` (ids), decoded as one batch.

    pick(i, logits) draws sample i's next token from its logits (float32 [known]: the first `known`
    outputs, default all); a sample ends after max_new_tokens or before stop_id. The context is the
    last block_size tokens; window_slide (1 = exact, see the module's notes) sets how the window
    slides past it."""
    decoder = cached_decoder(model)
    block_size = decoder.block_size
    if not 1 <= window_slide <= block_size:
        raise ValueError(f"window_slide {window_slide} is not between 1 and the block size {block_size}")
    if not prompt:
        raise ValueError("an empty prompt: give at least one token")
    known = decoder.vocab_size if known is None else known
    ids = list(prompt)
    new: list[list[int]] = [[] for _ in range(num_samples)]
    active = list(range(num_samples))

    def prefill(context: list[list[int]]):
        length = len(context[0])
        padded = np.zeros((num_samples, block_size), dtype=np.int32)
        padded[:, :length] = context
        logits, cache = decoder.compiled_prefill(tf.constant(padded), decoder.positions[length])
        return logits, cache, length

    logits, cache, length = prefill([ids[-block_size:]] * num_samples)
    for _ in range(max_new_tokens):
        rows = logits.numpy()[:, :known]
        tokens = np.zeros(num_samples, dtype=np.int32)  # samples that ended run on, unread
        for i in list(active):
            token = pick(i, rows[i])
            if token == stop_id:
                active.remove(i)
                continue
            new[i].append(token)
            tokens[i] = token
        if not active or len(new[active[0]]) == max_new_tokens:
            break
        if length < block_size:
            logits, cache = decoder.compiled_step(tf.constant(tokens), decoder.positions[length], cache)
            length += 1
        else:  # the window is full: slide it and prefill again
            keep = block_size - window_slide + 1
            # Samples that ended take a running one's context, to keep the batch's shape.
            contexts = [ids + new[i if i in active else active[0]] for i in range(num_samples)]
            logits, cache, length = prefill([context[-keep:] for context in contexts])
    return new
