"""The decoder as a Hugging Face GPT-2 checkpoint folder, and back.

write_hf_folder(model, tokenizer_json, generate_settings, folder) writes what transformers'
AutoModelForCausalLM and AutoTokenizer load with no code of this project:

- config.json: GPT2LMHeadModel, gelu_new (GELU's tanh approximation), LayerNorm epsilon 1e-5,
  n_positions the block size, the output projection tied to the token table;
- model.safetensors: the weights under GPT-2's tensor names (GPT2_NAMES), its Conv1D layout
  [in, out] being Keras Dense's kernel layout; lm_head.weight is left out, being transformer.wte.weight;
- tokenizer.json (the run's byte-level BPE as it is), tokenizer_config.json, special_tokens_map.json;
- generation_config.json: the run's sampling settings (the generate section) in transformers' names.

read_hf_folder(folder) loads such a folder into this project's Keras decoder from the safetensors
file: `python -m spark_jobs.generate --model-dir …/model/hf` samples from it.

The fused qkv projection's outputs are [q | k | v], each head h at h * head_dim within its part, as
GPT-2's c_attn splits them; attention is causal with scores scaled by 1 / sqrt(head_dim), as GPT-2's.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from pipeline import lake
from pipeline.config import SPECIAL_TOKENS, GenerateConfig
from pipeline.errors import PipelineError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
GENERATION_CONFIG_FILE = "generation_config.json"
FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE, GENERATION_CONFIG_FILE)

LAYER_NORM_EPSILON = 1e-5
END_OF_TEXT = SPECIAL_TOKENS[0]  # GPT-2's bos, eos and unk token alike

# GPT-2's tensor name of each weight: (Keras layer, its weight) for the model-level ones, and
# (sublayer of the block, its weight) for those of block i, under transformer.h.{i}.
GPT2_NAMES = {
    ("embedding", "tokens"): "transformer.wte.weight",
    ("embedding", "positions"): "transformer.wpe.weight",
    ("final_norm", "gamma"): "transformer.ln_f.weight",
    ("final_norm", "beta"): "transformer.ln_f.bias",
}
GPT2_BLOCK_NAMES = {
    ("attention_norm", "gamma"): "ln_1.weight",
    ("attention_norm", "beta"): "ln_1.bias",
    ("qkv", "kernel"): "attn.c_attn.weight",
    ("qkv", "bias"): "attn.c_attn.bias",
    ("attention_out", "kernel"): "attn.c_proj.weight",
    ("attention_out", "bias"): "attn.c_proj.bias",
    ("mlp_norm", "gamma"): "ln_2.weight",
    ("mlp_norm", "beta"): "ln_2.bias",
    ("mlp_in", "kernel"): "mlp.c_fc.weight",
    ("mlp_in", "bias"): "mlp.c_fc.bias",
    ("mlp_out", "kernel"): "mlp.c_proj.weight",
    ("mlp_out", "bias"): "mlp.c_proj.bias",
}


def gpt2_variables(model) -> dict[str, object]:
    """The model's variables by GPT-2 tensor name."""
    from spark_jobs.model.decoder import has_tied_head
    from spark_jobs.model.layers import DecoderBlock

    if not has_tied_head(model):
        raise PipelineError(
            "this model was saved before the decoder became GPT-2's (its output projection is its own, its GELU "
            "the exact one): it has no Hugging Face GPT-2 form; train it again to get one"
        )
    variables = {name: getattr(model.get_layer(layer), weight) for (layer, weight), name in GPT2_NAMES.items()}
    blocks = [layer for layer in model.layers if isinstance(layer, DecoderBlock)]
    for index, block in enumerate(blocks):
        for (sublayer, weight), name in GPT2_BLOCK_NAMES.items():
            variables[f"transformer.h.{index}.{name}"] = getattr(getattr(block, sublayer), weight)
    return variables


def gpt2_config(model, tokenizer_json: str) -> dict:
    """config.json of the model: GPT2LMHeadModel in the model's shape, its special tokens the tokenizer's ids."""
    from spark_jobs.model.layers import DecoderBlock

    embedding = model.get_layer("embedding")
    block = next(layer for layer in model.layers if isinstance(layer, DecoderBlock))
    end_of_text = special_token_id(tokenizer_json)
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": embedding.vocab_size,
        "n_positions": embedding.block_size,
        "n_ctx": embedding.block_size,
        "n_embd": embedding.dim,
        "n_layer": sum(isinstance(layer, DecoderBlock) for layer in model.layers),
        "n_head": block.n_head,
        "n_inner": block.mlp_ratio * embedding.dim,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": LAYER_NORM_EPSILON,
        "initializer_range": 0.02,
        "resid_pdrop": block.dropout,
        "embd_pdrop": block.dropout,
        "attn_pdrop": 0.0,  # the decoder drops no attention weights
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": end_of_text,
        "eos_token_id": end_of_text,
        "use_cache": True,
        "torch_dtype": "float32",
    }


def special_token_id(tokenizer_json: str) -> int:
    """The id of <|endoftext|> in a tokenizer.json."""
    for token in json.loads(tokenizer_json).get("added_tokens", []):
        if token.get("content") == END_OF_TEXT:
            return int(token["id"])
    raise PipelineError(f"the tokenizer has no {END_OF_TEXT} token")


def generation_config(settings: GenerateConfig, end_of_text: int) -> dict:
    """generation_config.json: the run's generate section in transformers' names (the prompt, seed
    and sample count are the caller's: they are no generation config's)."""
    sampling = {
        "greedy": {"do_sample": False},
        "top_k": {"do_sample": True, "top_k": settings.top_k, "top_p": 1.0},
        # transformers draws among its default top_k of 50 unless told otherwise
        "top_p": {"do_sample": True, "top_k": 0, "top_p": settings.top_p},
    }[settings.strategy]
    temperature = {} if settings.strategy == "greedy" else {"temperature": settings.temperature}
    return {
        "bos_token_id": end_of_text,
        "eos_token_id": end_of_text,
        "pad_token_id": end_of_text,
        "max_new_tokens": settings.max_new_tokens,
        **sampling,
        **temperature,
    }


def tokenizer_files(model_max_length: int) -> dict[str, dict]:
    special = {"bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "unk_token": END_OF_TEXT}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,  # decode as the tokenizer itself does
        "add_prefix_space": False,
        **special,
    }
    return {TOKENIZER_CONFIG_FILE: config, SPECIAL_TOKENS_FILE: special}


def write_hf_folder(model, tokenizer_json: str, settings: GenerateConfig, folder: Path) -> None:
    """The model as a Hugging Face GPT-2 folder (see the module's notes) in a local folder."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: np.ascontiguousarray(variable.numpy()) for name, variable in gpt2_variables(model).items()}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})  # "pt": what transformers expects
    config = gpt2_config(model, tokenizer_json)
    files = {
        CONFIG_FILE: config,
        GENERATION_CONFIG_FILE: generation_config(settings, config["eos_token_id"]),
        **tokenizer_files(config["n_positions"]),
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=2) + "\n")
    (folder / TOKENIZER_FILE).write_text(tokenizer_json)


def is_hf_folder(uri: str) -> bool:
    return all(lake.exists(lake.join(uri, name)) for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE))


def read_hf_folder(uri: str):
    """The Keras decoder and the tokenizer of a Hugging Face GPT-2 folder (path or URI) such as
    write_hf_folder writes: its config.json's shape, its model.safetensors's weights."""
    from safetensors.numpy import load
    from tokenizers import Tokenizer

    from spark_jobs.model.decoder import build_decoder

    config = json.loads(lake.read_text(lake.join(uri, CONFIG_FILE)))
    check_config(config, uri)
    model = build_decoder(
        vocab_size=config["vocab_size"],
        block_size=config["n_positions"],
        dim=config["n_embd"],
        n_layer=config["n_layer"],
        n_head=config["n_head"],
        mlp_ratio=(config.get("n_inner") or 4 * config["n_embd"]) // config["n_embd"],
        dropout=0.0,
    )
    with tempfile.TemporaryDirectory(prefix="gpt-pipeline-hf-") as local:
        tensors = load(lake.download_file(lake.join(uri, WEIGHTS_FILE), Path(local) / WEIGHTS_FILE).read_bytes())
    for name, variable in gpt2_variables(model).items():
        if name not in tensors or tensors[name].shape != tuple(variable.shape):
            raise PipelineError(f"{uri}/{WEIGHTS_FILE}: no tensor {name} of shape {tuple(variable.shape)}")
        variable.assign(tensors[name])
    return model, Tokenizer.from_str(lake.read_text(lake.join(uri, TOKENIZER_FILE)))


def check_config(config: dict, uri: str) -> None:
    """Refuse a GPT-2 config this decoder does not compute exactly."""
    expected = {
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "layer_norm_epsilon": LAYER_NORM_EPSILON,
        "tie_word_embeddings": True,
        "scale_attn_by_inverse_layer_idx": False,
    }
    for key, value in expected.items():
        # transformers' GPT-2 defaults: what a config leaves out (model_type it must name)
        if config.get(key, None if key == "model_type" else value) != value:
            raise PipelineError(f"{uri}/{CONFIG_FILE}: {key} is {config.get(key)!r}; this decoder computes {value!r}")
    if (config.get("n_inner") or 4 * config["n_embd"]) % config["n_embd"]:
        raise PipelineError(f"{uri}/{CONFIG_FILE}: n_inner is not a multiple of n_embd")
