"""The byte-level BPE tokenizer (HF `tokenizers`): training on the driver, encoding on executors.

Byte-level: the ByteLevel pre-tokenizer maps every byte to one of 256 symbols, so any text encodes
and `decode(encode(text)) == text`. The vocabulary holds those 256 symbols, the special tokens of
config.SPECIAL_TOKENS and learned merges, tokenizer.vocab_size in all (fewer when the training text
runs out of pairs seen tokenizer.min_frequency times).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import numpy as np

from pipeline.config import SPECIAL_TOKENS

# Texts go to the tokenizer in newline-aligned chunks of about this many characters: measured here,
# 64 KB inputs encoded 3-4x slower per token than ~1 KB ones, and single lines ~1.5x slower.
ENCODE_CHUNK_CHARS = 1024
TRAIN_CHUNK_CHARS = 16 * 1024


def new_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train(texts: Iterable[str], vocab_size: int, min_frequency: int):
    from tokenizers import pre_tokenizers, trainers

    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((chunk for text in texts for chunk in chunks(text, TRAIN_CHUNK_CHARS)), trainer)
    return tokenizer


def separator_id(tokenizer) -> int:
    """The id of <|endoftext|>, which separates files in a packed split (data.pack_documents)."""
    return tokenizer.token_to_id(SPECIAL_TOKENS[0])


@functools.lru_cache(maxsize=2)
def from_json(text: str):
    """A tokenizer from its JSON, built once per Python worker."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(text)


def chunks(text: str, size: int) -> Iterator[str]:
    """Consecutive pieces of text of about `size` characters, cut after a newline (else after a
    space, else anywhere) within 16 * size characters; they join back to the text."""
    position, end = 0, len(text)
    while position < end:
        cut = position + size
        if cut >= end:
            yield text[position:]
            return
        found = text.find("\n", cut, cut + 16 * size)
        if found < 0:
            found = text.find(" ", cut, cut + 16 * size)
        cut = found + 1 if found >= 0 else cut
        yield text[position:cut]
        position = cut


def encode(tokenizer, text: str) -> np.ndarray:
    """Token ids (int32) of a text, encoded chunk by chunk; tokens never span a chunk border, so
    the ids decode back to exactly the text. Offsets are not computed (encode_batch_fast)."""
    batch = list(chunks(text, ENCODE_CHUNK_CHARS))
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    encodings = encode_batch(batch, add_special_tokens=False)
    lengths = [len(encoding) for encoding in encodings]  # without building each ids list twice
    ids = np.empty(sum(lengths), dtype=np.int32)
    position = 0
    for encoding, length in zip(encodings, lengths, strict=True):
        ids[position : position + length] = encoding.ids
        position += length
    return ids
