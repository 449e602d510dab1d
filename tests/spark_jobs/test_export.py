"""The model's other formats, as the train stage writes them (spark_jobs.training.backups.write_exports):
the Hugging Face GPT-2 folder read back by this project's loader, and the TensorFlow SavedModel run
by a Python that imports nothing of this project."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pipeline import run_folder
from pipeline.config_files import load_config
from pipeline.errors import PipelineError
from spark_jobs import generate as generate_module
from spark_jobs.generate import load_model
from spark_jobs.model import export_hf
from tests.spark_jobs.test_model import LEGACY_MODEL

# Exporting traces the model into a SavedModel; one test loads it in a TensorFlow process of its own.
pytestmark = pytest.mark.tensorflow

TOLERANCE = 1e-4  # absolute, on logits of a few units


def test_the_hf_folder_loads_back_with_the_same_logits(model_folder, exported_ids):
    model, tokenizer = load_model(str(model_folder))
    hf_model, hf_tokenizer = load_model(str(model_folder / run_folder.MODEL_HF_FOLDER))
    expected = np.asarray(model(exported_ids))
    assert np.abs(expected).max() > 1
    np.testing.assert_allclose(np.asarray(hf_model(exported_ids)), expected, rtol=0, atol=TOLERANCE)
    assert hf_tokenizer.to_str() == tokenizer.to_str()


def test_the_hf_folder_holds_gpt2s_config_and_tensor_names(model_folder):
    from safetensors.numpy import load_file

    hf = model_folder / run_folder.MODEL_HF_FOLDER
    assert sorted(path.name for path in hf.iterdir()) == sorted(export_hf.FILES)
    config = json.loads((hf / export_hf.CONFIG_FILE).read_text())
    expected = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_positions": 32,
        "n_embd": 16,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": 48,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": True,
        "bos_token_id": 0,  # <|endoftext|>, the tokenizer's special token
        "eos_token_id": 0,
    }
    assert {key: config.get(key) for key in expected} == expected
    tensors = load_file(str(hf / export_hf.WEIGHTS_FILE))
    assert tensors["transformer.wte.weight"].shape == (config["vocab_size"], 16)
    assert tensors["transformer.wpe.weight"].shape == (32, 16)
    assert tensors["transformer.h.1.attn.c_attn.weight"].shape == (16, 48)  # Conv1D: [in, out]
    assert tensors["transformer.h.0.mlp.c_proj.weight"].shape == (48, 16)
    assert "lm_head.weight" not in tensors  # tied to transformer.wte.weight
    assert len(tensors) == 4 + 2 * 12
    tokenizer_config = json.loads((hf / export_hf.TOKENIZER_CONFIG_FILE).read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tokenizer_config["model_max_length"] == 32 and tokenizer_config["eos_token"] == "<|endoftext|>"


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("greedy", {"do_sample": False}),
        ("top_k", {"do_sample": True, "top_k": 40, "top_p": 1.0, "temperature": 0.8}),
        ("top_p", {"do_sample": True, "top_k": 0, "top_p": 0.9, "temperature": 0.8}),
    ],
)
def test_the_generation_config_is_the_runs_sampling(strategy, expected):
    settings = load_config().generate.model_copy(
        update={"strategy": strategy, "top_k": 40, "top_p": 0.9, "temperature": 0.8, "max_new_tokens": 77}
    )
    config = export_hf.generation_config(settings, 5)
    assert config == {"bos_token_id": 5, "eos_token_id": 5, "pad_token_id": 5, "max_new_tokens": 77, **expected}


def test_a_model_saved_before_the_gpt2_architecture_has_no_hf_form():
    model, _ = load_model(str(LEGACY_MODEL))
    with pytest.raises(PipelineError, match="saved before the decoder became GPT-2's"):
        export_hf.gpt2_variables(model)


def test_an_hf_config_this_decoder_cannot_compute_is_refused(model_folder, tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    for path in (model_folder / run_folder.MODEL_HF_FOLDER).iterdir():
        (hf / path.name).write_bytes(path.read_bytes())
    config = json.loads((hf / export_hf.CONFIG_FILE).read_text())
    (hf / export_hf.CONFIG_FILE).write_text(json.dumps(config | {"activation_function": "relu"}))
    with pytest.raises(PipelineError, match="activation_function is 'relu'; this decoder computes 'gelu_new'"):
        load_model(str(hf))


SAVED_MODEL_CHECK = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf

    folder, ids_file, out_file = sys.argv[1:]
    loaded = tf.saved_model.load(folder)
    ids = tf.constant(np.load(ids_file))
    logits = loaded.signatures["serving_default"](ids=ids)["output_0"]
    np.testing.assert_array_equal(logits.numpy(), loaded.serve(ids).numpy())
    assert not [name for name in sys.modules if name.split(".")[0] in ("spark_jobs", "pipeline", "include")]
    np.save(out_file, logits.numpy())
    """
)


def test_the_saved_model_runs_without_this_projects_code(model_folder, exported_ids, tmp_path):
    """In `python -I` (no PYTHONPATH, no current folder on the path), from another folder."""
    np.save(tmp_path / "ids.npy", exported_ids)
    saved_model = model_folder / run_folder.MODEL_SAVED_MODEL_FOLDER
    subprocess.run(
        [sys.executable, "-I", "-c", SAVED_MODEL_CHECK, str(saved_model), "ids.npy", "logits.npy"],
        cwd=tmp_path,
        check=True,
        timeout=300,
    )
    model, _ = load_model(str(model_folder))
    expected = np.asarray(model(exported_ids))
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), expected, rtol=0, atol=TOLERANCE)


def test_the_command_line_samples_from_an_hf_folder_as_from_the_keras_model(model_folder, capsys):
    options = ["--prompt", "ROMEO:", "--max-new-tokens", "6", "--strategy", "greedy"]
    for folder in (model_folder, model_folder / run_folder.MODEL_HF_FOLDER):
        assert generate_module.cli(["--model-dir", str(folder), *options]) == 0
    keras_text, hf_text = capsys.readouterr().out.splitlines()[-2:]
    assert hf_text == keras_text and keras_text.startswith("ROMEO:")
