from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest

from spark_jobs.generate import load_model
from spark_jobs.model.decoder import build_decoder, has_tied_head, initialise_embedding, output_head

VOCAB, BLOCK, DIM = 50, 16, 16


def tiny_decoder(**overrides) -> keras.Model:
    settings = {
        "vocab_size": VOCAB,
        "block_size": BLOCK,
        "dim": DIM,
        "n_layer": 2,
        "n_head": 4,
        "mlp_ratio": 2,
        "dropout": 0.0,
    } | overrides
    return build_decoder(**settings)


def test_logits_per_position_over_the_vocabulary():
    model = tiny_decoder()
    ids = np.random.default_rng(0).integers(0, VOCAB, size=(3, BLOCK)).astype("int32")
    assert model(ids).shape == (3, BLOCK, VOCAB)
    assert model(ids[:, :5]).shape == (3, 5, VOCAB)


def test_attention_is_causal():
    """Changing a later token never changes the logits of earlier positions."""
    model = tiny_decoder()
    ids = np.random.default_rng(1).integers(0, VOCAB, size=(1, BLOCK)).astype("int32")
    changed = ids.copy()
    changed[0, 10] = (changed[0, 10] + 1) % VOCAB
    before, after = np.asarray(model(ids)), np.asarray(model(changed))
    np.testing.assert_allclose(before[0, :10], after[0, :10], atol=1e-5)
    assert not np.allclose(before[0, 10:], after[0, 10:], atol=1e-5)


def test_width_must_divide_into_heads():
    with pytest.raises(ValueError, match="not divisible by 3 heads"):
        tiny_decoder(n_head=3)


def test_embedding_starts_from_the_given_tables_rescaled():
    model = tiny_decoder()
    rng = np.random.default_rng(2)
    vectors, positions = rng.normal(0, 5, (VOCAB, DIM)), rng.normal(0, 1, (BLOCK, DIM))
    initialise_embedding(model, vectors, positions)
    layer = model.get_layer("embedding")
    tokens = np.asarray(layer.tokens)
    assert tokens.std() == pytest.approx(0.02, rel=1e-3)
    # Same directions as the Word2Vec table, only a smaller scale.
    np.testing.assert_allclose(tokens / tokens[0, 0], vectors / vectors[0, 0], rtol=1e-3)
    assert np.corrcoef(np.asarray(layer.positions).ravel(), positions.ravel())[0, 1] > 0.999


def test_embedding_tables_of_the_wrong_shape_are_named():
    model = tiny_decoder()
    with pytest.raises(ValueError, match=r"token_vectors.npy has shape \(50, 8\)"):
        initialise_embedding(model, np.ones((VOCAB, 8)), np.ones((BLOCK, DIM)))


def test_keras_format_round_trip(tmp_path):
    model = tiny_decoder(dropout=0.1)
    ids = np.arange(BLOCK, dtype="int32")[None] % VOCAB
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(np.asarray(loaded(ids)), np.asarray(model(ids)), atol=1e-6)
    assert loaded.get_layer("embedding").block_size == BLOCK


def test_the_model_is_gpt2s():
    """The output projection is the token table, transposed, with no bias; the MLP's GELU is the tanh one."""
    model = tiny_decoder()
    ids = np.random.default_rng(3).integers(0, VOCAB, size=(2, BLOCK)).astype("int32")
    embedding, block = model.get_layer("embedding"), model.get_layer("block_0")
    assert has_tied_head(model) and block.gelu == "tanh"
    assert "logits" not in [layer.name for layer in model.layers]
    hidden = keras.Model(model.inputs, model.get_layer("final_norm").output)(ids)
    np.testing.assert_allclose(model(ids), np.asarray(hidden) @ np.asarray(embedding.tokens).T, atol=1e-5)
    x = np.linspace(-4, 4, 9, dtype="float32")
    tanh_gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(keras.ops.gelu(x, approximate=block.gelu == "tanh"), tanh_gelu, atol=1e-6)


LEGACY_MODEL = Path(__file__).parent / "legacy_model"


def test_a_model_saved_before_the_gpt2_architecture_loads_and_computes_as_it_did():
    """legacy_model/: a tiny model.keras saved by the decoder of its own output projection (a Dense
    "logits" with bias) and the exact GELU, with its tokenizer, ids and the logits it gave."""
    model, _ = load_model(str(LEGACY_MODEL))
    ids = np.load(LEGACY_MODEL / "ids.npy")
    assert not has_tied_head(model) and model.get_layer("block_0").gelu == "exact"
    np.testing.assert_allclose(model(ids), np.load(LEGACY_MODEL / "logits.npy"), rtol=0, atol=1e-5)
    head, vocab_size = output_head(model)
    assert head is model.get_layer("logits") and vocab_size == 300
