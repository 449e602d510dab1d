"""Sampling from the decoder: the picking rules, and the decode loop around the model's cached
forward pass (spark_jobs.model.decoder.CachedDecoder: the prompt is run once, the prefill, then every
new token goes through one compiled step that reuses the keys and values of the earlier positions).

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

Picking runs in the compiled code too: the decode loop (`compiled_run`) picks a token, steps it in
with the model's cached step (traced into the loop), picks the next, ... in one XLA while loop, up
to the end of the window, so Python is entered once per window, not once per token. A pick (greedy,
top_k, top_p, with a temperature) draws with sample i's own random stream, a counter-based one
(stateless Philox) keyed by (seed + i, index of the new token): the draw does not depend on the
batch, on the window slide, or on how the loop is cut into calls.

Several samples are one batch, each drawn with its own random stream from its own logits: a sample
does not depend on the others (beyond float rounding of a batched matrix product).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla

from spark_jobs.model.decoder import CachedDecoder, cached_decoder

STRATEGIES = ("greedy", "top_k", "top_p")
# Lower temperatures pick as this one does: among the most likely tokens only (and no 0 / 0 = nan).
MIN_TEMPERATURE = 1e-30


class SamplingRule(Protocol):
    """How tokens are drawn: the generate section of the config (pipeline.config.GenerateConfig)."""

    strategy: str
    temperature: float
    top_k: int
    top_p: float


def _uniforms(seeds, index):
    """One uniform draw in [0, 1) per sample from its stream: seeds int64 [B], index int32 []."""
    counter = tf.cast(index, tf.int64)
    return tf.map_fn(
        lambda seed: tf.random.stateless_uniform([], tf.stack([seed, counter])), seeds, fn_output_signature=tf.float32
    )


def _order_keys(values):
    """int32 keys in the order of float32 values <= 0 (and -inf): -0.0 and 0.0 alike."""
    bits = tf.bitcast(values, tf.int32)
    return tf.where(bits < 0, -(bits & np.int32(2**31 - 1)), bits)


def _cutoff(scaled, probabilities, enough):
    """Per sample, the lowest scaled logit of the most likely tokens that are `enough` (ties kept
    together): a bisection over the logits' order keys, each step one pass over the vocabulary,
    which costs XLA less than sorting it or its top_k."""
    keys = _order_keys(scaled)
    low, high = tf.reduce_min(tf.where(probabilities > 0, keys, 0), axis=1), tf.zeros_like(keys[:, 0])

    def halve(low, high):
        middle = high - (high - low) // 2
        fits = enough(keys >= middle[:, None])
        return tf.where(fits, middle, low), tf.where(fits, high, middle - 1)

    low, _ = tf.while_loop(lambda low, high: tf.reduce_any(low < high), halve, [low, high])
    return tf.reduce_max(tf.where(keys <= low[:, None], scaled, -np.inf), axis=1)


def _pick(logits, known, rule: SamplingRule, temperature, top_p, seeds, index):
    """The next token of each sample, int32 [B], from its logits float32 [B, vocab]: only the first
    `known` outputs are drawn, by rule.strategy (and rule.top_k), with `temperature` and `top_p`
    (tensors, so that they change nothing compiled); the index-th draw of each seed's stream."""
    logits = tf.where(tf.range(tf.shape(logits)[1])[None] < known, logits, -np.inf)
    if rule.strategy == "greedy":
        return tf.argmax(logits, axis=1, output_type=tf.int32)
    # Shifted by the largest first, so that a tiny temperature scales the others to -inf, never to nan.
    scaled = (logits - tf.reduce_max(logits, axis=1, keepdims=True)) / temperature
    probabilities = tf.nn.softmax(scaled, axis=1)
    if rule.strategy == "top_k":  # the top_k most likely tokens

        def enough(kept):
            return tf.reduce_sum(tf.cast(kept, tf.int32), axis=1) >= tf.minimum(rule.top_k, known)
    else:  # the most likely tokens whose probabilities add up to top_p

        def enough(kept):
            return tf.reduce_sum(tf.where(kept, probabilities, 0.0), axis=1) >= top_p

    allowed = scaled >= _cutoff(scaled, probabilities, enough)[:, None]
    cumulative = tf.cumsum(tf.where(allowed, probabilities, 0.0), axis=1)
    draw = _uniforms(seeds, index) * cumulative[:, -1]
    return tf.reduce_sum(tf.cast(cumulative <= draw[:, None], tf.int32), axis=1)


def rule_values(rule: SamplingRule) -> tuple[tf.Tensor, tf.Tensor]:
    """The rule's temperature and top_p, as the compiled pick takes them."""
    return tf.constant(max(rule.temperature, MIN_TEMPERATURE), tf.float32), tf.constant(rule.top_p, tf.float32)


def compiled_key(rule: SamplingRule) -> tuple:
    """What a pick is compiled for: its strategy and, for top_k, k."""
    return (rule.strategy, rule.top_k if rule.strategy == "top_k" else None)


def pick(logits, known: int, rule: SamplingRule, seeds, index: int):
    """_pick compiled as in the decode loop, for logits of one's own (float32 [B, vocab])."""
    compiled = _picks.get(compiled_key(rule))
    if compiled is None:
        compiled = _picks[compiled_key(rule)] = tf.function(
            lambda *args: _pick(args[0], args[1], rule, *args[2:]), jit_compile=True
        )
    return compiled(
        tf.constant(logits, tf.float32),
        tf.constant(known),
        *rule_values(rule),
        tf.constant(seeds, tf.int64),
        tf.constant(index),
    )


_picks: dict[tuple, Callable] = {}


_runs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_run(model, rule: SamplingRule) -> Callable:
    """_run on the model's cached decoder for this rule, compiled once per model object,
    compiled_key(rule) and batch size."""
    runs = _runs.setdefault(model, {})
    key = compiled_key(rule)
    if key not in runs:
        decoder = cached_decoder(model)
        scalar, ratio = tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32)
        run = tf.function(lambda *args: _run(decoder, rule, *args), jit_compile=True)
        runs[key] = run.get_concrete_function(
            tf.TensorSpec([None, decoder.vocab_size], tf.float32),  # logits
            tf.TensorSpec(decoder.cache_shape, tf.float32),
            scalar,  # position
            scalar,  # steps
            scalar,  # known
            ratio,  # temperature
            ratio,  # top_p
            tf.TensorSpec([None], tf.int64),  # seeds
            scalar,  # first_index
            scalar,  # stop_id
            tf.TensorSpec([None], tf.bool),  # ended
        )
    return runs[key]


def _run(
    decoder: CachedDecoder,
    rule: SamplingRule,
    logits,
    cache,
    position,
    steps,
    known,
    temperature,
    top_p,
    seeds,
    first_index,
    stop_id,
    ended,
):
    """Up to `steps` new tokens of each sample: pick one from `logits` (those after position - 1),
    step it in at `position`, pick the next, ...; the last pick is not stepped in (the caller
    prefills next, or is done). Stops early once every sample has drawn stop_id (now or before:
    `ended`). Returns (tokens int32 [B, block_size + 1], of which the first `count` columns are
    new, count, cache, ended)."""
    tokens = tf.zeros([tf.shape(logits)[0], decoder.block_size + 1], tf.int32)

    def more(count, logits, cache, tokens, ended):
        return (count < steps) & ~tf.reduce_all(ended)

    def pick_and_step(count, logits, cache, tokens, ended):
        picked = _pick(logits, known, rule, temperature, top_p, seeds, first_index + count)
        tokens = xla.dynamic_update_slice(tokens, picked[:, None], [0, count])
        ended = ended | (picked == stop_id)
        logits, cache = tf.cond(
            count + 1 < steps,
            lambda: decoder.call_step(picked, position + count, cache),
            lambda: (logits, cache),
        )
        return count + 1, logits, cache, tokens, ended

    count, _, cache, tokens, ended = tf.while_loop(more, pick_and_step, [tf.constant(0), logits, cache, tokens, ended])
    return tokens, count, cache, ended


NO_STOP = -1  # stop_id when no token ends a sample


def decode(
    model,
    prompt: Sequence[int],
    num_samples: int,
    max_new_tokens: int,
    rule: SamplingRule,
    seed: int,
    stop_id: int | None = None,
    known: int | None = None,
    window_slide: int = 1,
) -> list[list[int]]:
    """The new tokens of num_samples continuations of `prompt` (ids), decoded as one batch.

    Sample i draws by `rule` with the random stream of seed + i, from the first `known` outputs
    (default all); it ends after max_new_tokens or before stop_id. The context is the last
    block_size tokens; window_slide (1 = exact, see the module's notes) sets how the window slides
    past it."""
    decoder = cached_decoder(model)
    block_size = decoder.block_size
    if not 1 <= window_slide <= block_size:
        raise ValueError(f"window_slide {window_slide} is not between 1 and the block size {block_size}")
    if not prompt:
        raise ValueError("an empty prompt: give at least one token")
    known = tf.constant(decoder.vocab_size if known is None else known, tf.int32)
    run = compiled_run(model, rule)
    temperature, top_p = rule_values(rule)
    seeds = tf.constant([seed + i for i in range(num_samples)], tf.int64)
    stop = tf.constant(NO_STOP if stop_id is None else stop_id, tf.int32)
    ids = list(prompt)
    new: list[list[int]] = [[] for _ in range(num_samples)]
    ended = np.zeros(num_samples, dtype=bool)

    def prefill(context: list[list[int]]):
        length = len(context[0])
        padded = np.zeros((num_samples, block_size), dtype=np.int32)
        padded[:, :length] = context
        logits, cache = decoder.compiled_prefill(tf.constant(padded), decoder.positions[length])
        return logits, cache, length

    logits, cache, length = prefill([ids[-block_size:]] * num_samples)
    drawn = 0
    while True:
        steps = min(max_new_tokens - drawn, block_size - length + 1)
        tokens, count, cache, ended_now = run(
            logits,
            cache,
            decoder.positions[length],
            tf.constant(steps),
            known,
            temperature,
            top_p,
            seeds,
            tf.constant(drawn),
            stop,
            tf.constant(ended),
        )
        count = int(count)
        for i, row in enumerate(tokens.numpy()[:, :count]):
            for token in row if not ended[i] else ():
                if token == stop_id:
                    break
                new[i].append(int(token))
        ended, drawn = ended_now.numpy(), drawn + count
        if ended.all() or drawn == max_new_tokens:
            return new
        # The window is full: slide it and prefill again. Samples that ended take a running one's
        # context, to keep the batch's shape.
        running = int(np.flatnonzero(~ended)[0])
        keep = block_size - window_slide + 1
        logits, cache, length = prefill([(ids + new[running if ended[i] else i])[-keep:] for i in range(num_samples)])
