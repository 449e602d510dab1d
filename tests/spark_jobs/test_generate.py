from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from itertools import pairwise

import numpy as np
import pytest
import yaml
from tokenizers import ByteLevelBPETokenizer

from local_platform.moto_s3 import LocalS3
from spark_jobs import generate as generate_module
from spark_jobs.generate import SAMPLE_SEPARATOR, generate, load_model, next_token, samples
from spark_jobs.lib import bpe, run_folder
from spark_jobs.lib.config import REPO_ROOT, GenerateConfig
from spark_jobs.lib.config_files import DEFAULT_CONFIG_PATH, load_config, read_yaml
from spark_jobs.lib.errors import PipelineError
from spark_jobs.lib.model import build_decoder
from spark_jobs.lib.overrides import apply_overrides


def settings(**overrides) -> GenerateConfig:
    return load_config().generate.model_copy(update=overrides)


LOGITS = np.array([0.0, 3.0, 1.0, 2.9, -1.0, 2.0])


def picks(settings: GenerateConfig, draws: int = 400) -> set[int]:
    rng = np.random.default_rng(0)
    return {next_token(LOGITS, settings, rng) for _ in range(draws)}


def test_greedy_takes_the_most_likely_token():
    assert picks(settings(strategy="greedy")) == {1}


def test_top_k_samples_only_among_the_k_most_likely():
    assert picks(settings(strategy="top_k", top_k=3, temperature=1.0)) == {1, 3, 5}


def test_top_p_keeps_the_smallest_set_reaching_p():
    # Softmax of LOGITS: tokens 1 and 3 hold ~0.77 together, token 5 brings it to ~0.92.
    assert picks(settings(strategy="top_p", top_p=0.7, temperature=1.0)) == {1, 3}
    assert picks(settings(strategy="top_p", top_p=0.85, temperature=1.0)) == {1, 3, 5}


def test_low_temperature_approaches_greedy():
    assert picks(settings(strategy="top_k", top_k=6, temperature=0.01)) == {1}
    for strategy in ("top_k", "top_p"):  # so small that 3.0 / it overflows: still the greedy pick, not nan
        assert picks(settings(strategy=strategy, top_k=6, top_p=0.9, temperature=1e-320), draws=20) == {1}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, shakespeare):
    """A small untrained decoder and a BPE tokenizer saved the way the train stage saves them."""
    folder = tmp_path_factory.mktemp("model")
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator([shakespeare.read_text()[:20_000]], vocab_size=300, special_tokens=["<|endoftext|>"])
    model = build_decoder(
        vocab_size=tokenizer.get_vocab_size(), block_size=8, dim=16, n_layer=1, n_head=2, mlp_ratio=2, dropout=0.0
    )
    model.save(folder / run_folder.MODEL_FILE)
    (folder / run_folder.MODEL_TOKENIZER_FILE).write_text(tokenizer._tokenizer.to_str())
    return folder


def test_generation_repeats_with_the_same_seed_and_varies_with_another(model_dir):
    model, tokenizer = load_model(str(model_dir))  # a path, as from Python; URIs work too (below)
    options = settings(prompt="The man starts with", max_new_tokens=20, strategy="top_k", seed=5)
    first, again = generate(model, tokenizer, options), generate(model, tokenizer, options)
    other = generate(model, tokenizer, options.model_copy(update={"seed": 6}))
    assert first.startswith("The man starts with") and len(first) > len("The man starts with")
    assert first == again
    assert other != first


def test_generation_stops_where_the_model_ends_the_document(model_dir, monkeypatch):
    model, tokenizer = load_model(model_dir.as_uri())
    to, be = tokenizer.encode(" to").ids[0], tokenizer.encode(" be").ids[0]
    drawn = iter([to, be, bpe.separator_id(tokenizer), to])
    monkeypatch.setattr(generate_module, "next_token", lambda *_: next(drawn))
    text = generate(model, tokenizer, settings(prompt="Not", max_new_tokens=10))
    assert text == tokenizer.decode(tokenizer.encode("Not").ids + [to, be])  # nothing after the separator


class ModelSpy:
    """The model, noting the context of every call."""

    def __init__(self, model):
        self.model, self.contexts = model, []

    def get_layer(self, name):
        return self.model.get_layer(name)

    def __call__(self, ids, training):
        self.contexts.append(ids[0].tolist())
        return self.model(ids, training=training)


def test_an_empty_prompt_starts_a_new_document(model_dir, monkeypatch):
    model, tokenizer = load_model(model_dir.as_uri())
    to, be = tokenizer.encode(" to").ids[0], tokenizer.encode(" be").ids[0]
    drawn = iter([to, be, bpe.separator_id(tokenizer)])
    monkeypatch.setattr(generate_module, "next_token", lambda *_: next(drawn))
    spy = ModelSpy(model)
    text = generate(spy, tokenizer, settings(prompt="", max_new_tokens=10))
    assert spy.contexts[0] == [bpe.separator_id(tokenizer)]  # the model continues <|endoftext|>
    assert text == tokenizer.decode([to, be]) and text.startswith(" to")  # without the <|endoftext|>


def test_several_samples_take_consecutive_seeds(model_dir):
    model, tokenizer = load_model(model_dir.as_uri())
    options = settings(prompt="ROMEO:", max_new_tokens=8, strategy="top_k", seed=11, num_samples=3)
    texts = samples(model, tokenizer, options).split(SAMPLE_SEPARATOR)
    assert texts == [generate(model, tokenizer, options.model_copy(update={"seed": 11 + i})) for i in range(3)]
    assert len(set(texts)) == 3


def test_only_ids_the_tokenizer_knows_are_drawn(model_dir, monkeypatch):
    """BPE may learn fewer tokens than tokenizer.vocab_size, the model's outputs: an id past them decodes to nothing."""
    _, tokenizer = load_model(str(model_dir))
    model = build_decoder(
        vocab_size=tokenizer.get_vocab_size() + 50, block_size=8, dim=16, n_layer=1, n_head=2, mlp_ratio=2, dropout=0.0
    )
    sizes, draw = [], generate_module.next_token
    monkeypatch.setattr(
        generate_module, "next_token", lambda logits, *rest: sizes.append(logits.size) or draw(logits, *rest)
    )
    generate(model, tokenizer, settings(prompt="The", max_new_tokens=3, strategy="top_k"))
    assert sizes and set(sizes) == {tokenizer.get_vocab_size()}


def test_context_longer_than_the_block_is_cropped_to_its_last_tokens(model_dir):
    model, tokenizer = load_model(model_dir.as_uri())
    spy, prompt = ModelSpy(model), "To be, or not to be: " * 4
    generate(spy, tokenizer, settings(prompt=prompt, max_new_tokens=12, strategy="greedy"))
    block_size = model.get_layer("embedding").block_size  # 8
    assert len(tokenizer.encode(prompt).ids) > block_size and len(spy.contexts) == 12
    # Each draw sees the last block_size ids: the prompt's last ones, then each context moves on by the token drawn.
    assert spy.contexts[0] == tokenizer.encode(prompt).ids[-block_size:]
    for before, after in pairwise(spy.contexts):
        assert len(after) == block_size and after[:-1] == before[1:]


def test_a_folder_without_a_model_is_named(tmp_path):
    with pytest.raises(PipelineError, match="holds no model.keras"):
        load_model(tmp_path.as_uri())


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spark_jobs.generate", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_cli_prints_a_seeded_continuation(model_dir):
    args = ["--model-dir", str(model_dir), "--prompt", "ROMEO:", "--max-new-tokens", "10", "--seed", "3"]
    first, again = cli(*args), cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("ROMEO:")
    assert first.stdout == again.stdout


def test_cli_prints_several_samples(model_dir):
    completed = cli("--model-dir", str(model_dir), "--prompt", "ROMEO:", "--max-new-tokens", "5", "--num-samples", "2")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.count(SAMPLE_SEPARATOR) == 1 and completed.stdout.count("ROMEO:") == 2


def test_cli_rejects_bad_settings_by_name(model_dir):
    completed = cli("--model-dir", str(model_dir), "--temperature", "0")
    assert completed.returncode == 2
    assert "generate.temperature: must be above 0; strategy greedy takes the most likely token" in completed.stderr


def test_cli_help_describes_the_command_line_not_the_stage():
    helped = cli("--help")
    assert helped.returncode == 0 and "--model-dir MODEL_DIR" in helped.stdout and "--prompt" in helped.stdout
    assert "--run-dir RUN_DIR continues generate.prompt" in " ".join(helped.stdout.split())  # the stage, as an aside


def test_cli_without_a_model_takes_the_newest_runs_in_the_lake(model_dir, tmp_path):
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(
        yaml.safe_dump(apply_overrides(read_yaml(DEFAULT_CONFIG_PATH), {"lake": str(tmp_path / "lake")}))
    )
    env = {"GPT_PIPELINE_CONFIG": str(config_file)}
    empty = cli(env=env)  # a bare call is the command line's, not the stage's
    assert (
        empty.returncode == 2
        and f"no run in {tmp_path / 'lake' / 'runs'} has a model yet: run `make run`" in empty.stderr
    )

    for run, age_s in (("older", 3600), ("newer", 0)):
        shutil.copytree(model_dir, tmp_path / "lake" / run_folder.RUNS_FOLDER / run / run_folder.MODEL_FOLDER)
        stamp = time.time() - age_s
        os.utime(
            tmp_path / "lake" / run_folder.RUNS_FOLDER / run / run_folder.MODEL_FOLDER / run_folder.MODEL_FILE,
            (stamp, stamp),
        )
    completed = cli("--prompt", "ROMEO:", "--max-new-tokens", "5", env=env)
    assert completed.returncode == 0, completed.stderr
    assert f"model: {tmp_path / 'lake' / 'runs' / 'newer' / 'model'} (the newest run's)" in completed.stderr
    assert completed.stdout.startswith("ROMEO:")


def test_cli_follows_a_latest_pointer_on_s3(model_dir):
    options = ["--prompt", "ROMEO:", "--max-new-tokens", "10", "--seed", "4"]
    with LocalS3(buckets=("models",)) as s3:
        client = s3.client()
        for file in model_dir.iterdir():
            client.put_object(Bucket="models", Key=f"runs/plays-1/model/{file.name}", Body=file.read_bytes())
        pointer = {"run": "plays-1", "model": "s3://models/runs/plays-1/model/"}
        client.put_object(Bucket="models", Key="runs/latest/plays.json", Body=json.dumps(pointer).encode())
        client.put_object(Bucket="models", Key="runs/latest/broken.json", Body=b"{}")

        followed = cli("--latest", "s3://models/runs/latest/plays.json", *options, env=s3.connection_env())
        missing = cli("--latest", "s3://models/runs/latest/poems.json", *options, env=s3.connection_env())
        broken = cli("--latest", "s3://models/runs/latest/broken.json", *options, env=s3.connection_env())

    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == cli("--model-dir", str(model_dir), *options).stdout
    assert "model: s3://models/runs/plays-1/model/ (from s3://models/runs/latest/plays.json)" in followed.stderr
    assert missing.returncode == 2
    assert "no latest pointer at s3://models/runs/latest/poems.json" in missing.stderr
    assert broken.returncode == 2 and "is not a latest pointer written by promote" in broken.stderr
