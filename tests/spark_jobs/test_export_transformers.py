"""The Hugging Face GPT-2 folder as transformers loads it, in an environment of its own (.venv-hf/,
`make hf-venv`, made here when missing or out of date and reused after) and a Python that imports
nothing of this project: the same tokens, logits and greedy continuation as this project's model."""

from __future__ import annotations

import json
import subprocess
import textwrap

import numpy as np
import pytest

from pipeline import run_folder
from pipeline.config import REPO_ROOT
from pipeline.config_files import load_config
from spark_jobs.generate import generate_ids, load_model

# Building .venv-hf installs transformers and torch (minutes, once); the check then runs torch.
pytestmark = [pytest.mark.pip, pytest.mark.tensorflow]

HF_PYTHON = REPO_ROOT / ".venv-hf" / "bin" / "python"
TOLERANCE = 1e-4  # absolute, on logits of a few units
NEW_TOKENS = 20  # the prompt's tokens and these stay within the model's 32 positions

TRANSFORMERS_CHECK = textwrap.dedent(
    """
    import json
    import sys

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, text, prompt, new_tokens, block_size = sys.argv[1:]
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(text, return_tensors="pt").input_ids[:, : int(block_size)]
    prompt_ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        np.save("logits.npy", model(ids).logits.numpy())
        generated = model.generate(prompt_ids, do_sample=False, max_new_tokens=int(new_tokens))
    new = generated[0, prompt_ids.shape[1] :].tolist()
    if new[-1:] == [model.generation_config.eos_token_id]:  # transformers keeps the token it stops at
        new = new[:-1]
    assert not [name for name in sys.modules if name.split(".")[0] in ("spark_jobs", "pipeline", "include")]
    text = tokenizer.decode(prompt_ids[0].tolist() + new)
    json.dump({"ids": ids[0].tolist(), "new": new, "text": text}, open("out.json", "w"))
    """
)


@pytest.fixture(scope="session")
def hf_python():
    """.venv-hf's Python: make hf-venv builds the environment when missing or older than requirements-hf.txt."""
    subprocess.run(["make", "hf-venv"], cwd=REPO_ROOT, check=True, timeout=3600)
    return HF_PYTHON


def test_transformers_loads_the_hf_folder_with_the_same_logits_and_greedy_tokens(
    hf_python, model_folder, shakespeare, tmp_path
):
    model, tokenizer = load_model(str(model_folder))
    text = shakespeare.read_text()[-2_000:]  # validation text
    settings = load_config().generate.model_copy(update={"strategy": "greedy", "max_new_tokens": NEW_TOKENS})
    block_size = model.get_layer("embedding").block_size
    hf_folder = model_folder / run_folder.MODEL_HF_FOLDER
    argv = [str(hf_folder), text, settings.prompt, str(NEW_TOKENS), str(block_size)]
    subprocess.run([str(hf_python), "-I", "-c", TRANSFORMERS_CHECK, *argv], cwd=tmp_path, check=True, timeout=600)
    out = json.loads((tmp_path / "out.json").read_text())

    ids = tokenizer.encode(text).ids[:block_size]
    assert out["ids"] == ids
    expected = np.asarray(model(np.array([ids], dtype=np.int32)))
    assert np.abs(expected).max() > 1
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), expected, rtol=0, atol=TOLERANCE)

    prompt_ids, (new,) = generate_ids(model, tokenizer, settings)
    assert out["new"] == new  # without the end-of-text token, which this project's generation leaves out
    assert out["text"] == tokenizer.decode(prompt_ids + new)
