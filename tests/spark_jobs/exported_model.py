"""A model folder as the train stage leaves it, with its Hugging Face and SavedModel formats, and ids
of validation text: the fixtures of the export tests (registered in conftest.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from tokenizers import ByteLevelBPETokenizer

from pipeline import run_folder
from pipeline.config_files import load_config
from spark_jobs.generate import load_model
from spark_jobs.model.decoder import build_decoder
from spark_jobs.training.backups import write_exports

SHAPE = {"block_size": 32, "dim": 16, "n_layer": 2, "n_head": 4, "mlp_ratio": 3, "dropout": 0.1}


def trained_like(model: keras.Model) -> keras.Model:
    """Weights larger than at initialisation, so that the logits spread as a trained model's do."""
    keras.utils.set_random_seed(4)
    for variable in model.trainable_variables:
        variable.assign(variable.numpy() * (10 if len(variable.shape) == 2 else 1) + np.random.normal(0, 0.1))
    return model


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, shakespeare):
    """A model folder as the train stage leaves it: model.keras, tokenizer.json, hf/ and saved_model/."""
    folder = tmp_path_factory.mktemp("model")
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator([shakespeare.read_text()[:20_000]], vocab_size=300, special_tokens=["<|endoftext|>"])
    model = trained_like(build_decoder(vocab_size=tokenizer.get_vocab_size(), **SHAPE))
    model.save(folder / run_folder.MODEL_FILE)
    tokenizer_json = tokenizer._tokenizer.to_str()
    (folder / run_folder.MODEL_TOKENIZER_FILE).write_text(tokenizer_json)
    write_exports(folder, tokenizer_json, load_config().generate)
    return folder


@pytest.fixture(scope="module")
def exported_ids(model_folder, shakespeare) -> np.ndarray:
    _, tokenizer = load_model(str(model_folder))
    text = shakespeare.read_text()[-2_000:]  # validation text
    return np.array([tokenizer.encode(text).ids[:16], tokenizer.encode(text[500:]).ids[:16]], dtype=np.int32)
