from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import yaml
from tokenizers import ByteLevelBPETokenizer

from local_platform.moto_s3 import LocalS3
from pipeline import run_folder
from pipeline.config import REPO_ROOT, GenerateConfig
from pipeline.config_files import DEFAULT_CONFIG_PATH, load_config, read_yaml
from pipeline.errors import PipelineError
from pipeline.log import printable
from pipeline.overrides import apply_overrides
from spark_jobs import generate as generate_module
from spark_jobs.generate import SAMPLE_SEPARATOR, generate, load_model, sample_texts, samples
from spark_jobs.model import sampler
from spark_jobs.model.decoder import build_decoder, cached_decoder
from spark_jobs.text import bpe
from spark_jobs.training import tensorboard_log
from tests.spark_jobs.tensorboard_events import read_events
from tests.spark_jobs.test_model import LEGACY_MODEL

# Most of them XLA-compile the decoder's generation loop (10 to 30 s a test), some run the command
# line in a TensorFlow process of its own.
pytestmark = pytest.mark.tensorflow


def settings(**overrides) -> GenerateConfig:
    return load_config().generate.model_copy(update=overrides)


LOGITS = np.array([0.0, 3.0, 1.0, 2.9, -1.0, 2.0])


def pick(logits: np.ndarray, settings: GenerateConfig, index: int, known: int | None = None) -> int:
    """The token sampling's pick draws from one sample's logits, as the decode loop's index-th draw."""
    known = logits.shape[-1] if known is None else known
    return int(sampler.pick(np.float32(logits)[None], known, settings, [settings.seed], index)[0])


def picks(settings: GenerateConfig, draws: int = 400) -> set[int]:
    return {pick(LOGITS, settings, index) for index in range(draws)}


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


def test_generation_stops_before_the_stop_token(deeper_model):
    prompt = [5, 9, 200]  # one whose greedy continuation is not one token repeated (the head is the token table)
    tokens = sampler.decode(deeper_model, prompt, 1, max_new_tokens=12, rule=settings(strategy="greedy"), seed=0)[0]
    end = next(index for index, token in enumerate(tokens) if index > 0 and token not in tokens[:index])
    stopped = sampler.decode(
        deeper_model, prompt, 1, max_new_tokens=12, rule=settings(strategy="greedy"), seed=0, stop_id=tokens[end]
    )
    assert stopped == [tokens[:end]]  # nothing from the stop token on


def test_an_empty_prompt_starts_a_new_document(model_dir, monkeypatch):
    model, tokenizer = load_model(model_dir.as_uri())
    to, be = tokenizer.encode(" to").ids[0], tokenizer.encode(" be").ids[0]
    calls = []
    monkeypatch.setattr(sampler, "decode", lambda model, prompt, **rest: calls.append((prompt, rest)) or [[to, be]])
    text = generate(model, tokenizer, settings(prompt="", max_new_tokens=10))
    assert [prompt for prompt, _ in calls] == [[bpe.separator_id(tokenizer)]]  # the model continues <|endoftext|>
    assert calls[0][1]["stop_id"] == bpe.separator_id(tokenizer)  # and ends where the model ends the document
    assert text == tokenizer.decode([to, be]) and text.startswith(" to")  # without the <|endoftext|>


def test_several_samples_take_consecutive_seeds(model_dir):
    model, tokenizer = load_model(model_dir.as_uri())
    options = settings(prompt="ROMEO:", max_new_tokens=8, strategy="top_k", seed=11, num_samples=3)
    texts = samples(model, tokenizer, options).split(SAMPLE_SEPARATOR)
    assert texts == [generate(model, tokenizer, options.model_copy(update={"seed": 11 + i})) for i in range(3)]
    assert len(set(texts)) == 3


def test_only_ids_the_tokenizer_knows_are_drawn(model_dir):
    """BPE may learn fewer tokens than tokenizer.vocab_size, the model's outputs: an id past them decodes to nothing."""
    _, tokenizer = load_model(str(model_dir))
    known = tokenizer.get_vocab_size()
    model = build_decoder(vocab_size=known + 50, block_size=8, dim=16, n_layer=1, n_head=2, mlp_ratio=2, dropout=0.0)
    # The final norm's outputs all ones; the unknown ids' rows of the (tied) token table sum to 100:
    # by far the likeliest.
    model.get_layer("final_norm").gamma.assign(np.zeros(16))
    model.get_layer("final_norm").beta.assign(np.ones(16))
    tokens = model.get_layer("embedding").tokens
    tokens.assign(np.where(np.arange(known + 50)[:, None] >= known, 100.0 / 16, tokens.numpy()))
    for strategy in ("greedy", "top_k", "top_p"):
        ids, new = generate_module.generate_ids(
            model, tokenizer, settings(prompt="The", max_new_tokens=12, strategy=strategy)
        )
        assert new[0] and max(new[0]) < known


def reference_generate(model, tokenizer, settings: GenerateConfig, window_slide: int = 1) -> str:
    """The sampler before the KV cache: the whole model on the whole context for every token. Its
    context is the last block_size tokens (window_slide 1); with window_slide s, once longer than the
    block it starts over from its last block_size - s + 1 tokens, as sampler.decode's window."""
    end_of_text = bpe.separator_id(tokenizer)
    ids = tokenizer.encode(settings.prompt).ids if settings.prompt else [end_of_text]
    block_size = model.get_layer("embedding").block_size
    known = tokenizer.get_vocab_size()
    start = max(0, len(ids) - block_size)
    for index in range(settings.max_new_tokens):
        context = ids[start:]
        assert len(context) <= block_size
        logits = model(np.array([context], dtype=np.int32), training=False)
        token = pick(np.asarray(logits[0, -1]), settings, index, known)
        if token == end_of_text:
            break
        ids.append(token)
        if len(ids) - start > block_size:
            start = len(ids) - (block_size - window_slide + 1)
    return tokenizer.decode(ids)


@pytest.fixture(scope="module")
def deeper_model():
    """Two blocks, so that a cache feeds the next block's; weights larger than at initialisation, so that the
    logits spread as a trained model's do (and differences from the full pass would show)."""
    keras.utils.set_random_seed(3)
    model = build_decoder(vocab_size=300, block_size=8, dim=16, n_layer=2, n_head=2, mlp_ratio=2, dropout=0.0)
    for variable in model.trainable_variables:
        if len(variable.shape) == 2:
            variable.assign(variable.numpy() * 10)
    return model


LOGITS_TOLERANCE = 1e-5  # absolute, on logits of a few units; float32 rounding gives ~1e-6


def test_the_cached_step_gives_the_full_passs_logits_at_every_position(deeper_model):
    ids = np.random.default_rng(0).integers(0, 300, (3, 8)).astype(np.int32)
    full = deeper_model(ids, training=False).numpy()  # [3, 8, 300]
    assert np.abs(full).max() > 1  # logits that differ
    decoder = cached_decoder(deeper_model)
    for length in range(1, 9):  # prefill of the first `length` ids (the rest is padding)
        logits, _ = decoder.prefill(ids, np.int32(length))
        np.testing.assert_allclose(logits.numpy(), full[:, length - 1], rtol=0, atol=LOGITS_TOLERANCE)
    logits, cache = decoder.prefill(ids, np.int32(1))
    for position in range(1, 8):  # then one cached step per position
        logits, cache = decoder.step(ids[:, position], np.int32(position), cache)
        np.testing.assert_allclose(logits.numpy(), full[:, position], rtol=0, atol=LOGITS_TOLERANCE)


@pytest.mark.parametrize("prompt", ["The", "To be, or not to be: " * 4])  # shorter and longer than the block
def test_greedy_decoding_gives_the_tokens_of_the_full_pass(model_dir, deeper_model, prompt):
    _, tokenizer = load_model(model_dir.as_uri())
    options = settings(prompt=prompt, max_new_tokens=30, strategy="greedy")  # the window slides 20 times or more
    assert generate(deeper_model, tokenizer, options) == reference_generate(deeper_model, tokenizer, options)
    sampled = options.model_copy(update={"strategy": "top_k", "temperature": 1.0, "seed": 2})
    assert generate(deeper_model, tokenizer, sampled) == reference_generate(deeper_model, tokenizer, sampled)


def test_a_wider_window_slide_starts_over_from_the_last_tokens(model_dir, deeper_model):
    _, tokenizer = load_model(model_dir.as_uri())
    options = settings(prompt="ROMEO:", max_new_tokens=30, strategy="greedy")
    texts = {slide: generate(deeper_model, tokenizer, options, window_slide=slide) for slide in (1, 4, 8)}
    for slide, text in texts.items():
        assert text == reference_generate(deeper_model, tokenizer, options, window_slide=slide)
    with pytest.raises(ValueError, match="window_slide 9 is not between 1 and the block size 8"):
        generate(deeper_model, tokenizer, options, window_slide=9)


def test_a_sample_of_a_batch_is_the_sample_drawn_alone(model_dir, deeper_model):
    _, tokenizer = load_model(model_dir.as_uri())
    options = settings(prompt="ROMEO:", max_new_tokens=20, strategy="top_k", temperature=1.0, seed=11, num_samples=8)
    texts = sample_texts(deeper_model, tokenizer, options)
    alone = [generate(deeper_model, tokenizer, options.model_copy(update={"seed": 11 + k})) for k in range(8)]
    assert texts == alone and len(set(texts)) == 8
    assert texts == sample_texts(deeper_model, tokenizer, options)  # and again, run after run


def test_samples_of_a_batch_end_apart(deeper_model):
    """A sample that draws the stop token ends there; the others run on."""
    rule = settings(strategy="top_k", temperature=1.0)
    first, second = sampler.decode(deeper_model, [1, 2, 3], 2, max_new_tokens=20, rule=rule, seed=4)
    end = next(i for i, token in enumerate(first) if token not in first[:i] and token not in second)
    stopped = sampler.decode(deeper_model, [1, 2, 3], 2, max_new_tokens=20, rule=rule, seed=4, stop_id=first[end])
    assert stopped == [first[:end], second]


def test_the_stage_records_how_long_generation_took_and_logs_the_samples_for_tensorboard(
    model_dir, tmp_path, monkeypatch
):
    shutil.copytree(model_dir, tmp_path / "run" / run_folder.MODEL_FOLDER)
    # As if the train stage had completed its 40 steps.
    monkeypatch.setattr(run_folder, "require_stage", lambda *_: {"steps": 40})
    config = load_config(overrides={"generate": {"prompt": "ROMEO:", "max_new_tokens": 6, "num_samples": 2}})
    run = (tmp_path / "run").as_uri()
    stats = generate_module.generate_stage(None, config, run)
    written = (tmp_path / "run" / run_folder.SAMPLES_PATH).read_bytes().decode()  # a drawn "\r" stays "\r"
    assert written.count("ROMEO:") == 2 and 0 < stats["generated_tokens"] <= 12
    assert stats["generation_s"] > 0 and stats["tokens_per_s"] > 0 and stats["timings"]["load_model"] > 0
    # The same samples, at the training's last step.
    [tags] = read_events(run).values()
    samples = written.removesuffix("\n").split(SAMPLE_SEPARATOR)
    assert tags == {tensorboard_log.SAMPLES: {40: tensorboard_log.samples_markdown(samples)}}


def test_the_stage_prints_its_samples_with_control_characters_as_escapes_and_keeps_them_in_samples_txt(
    model_dir, tmp_path, monkeypatch, capsys
):
    shutil.copytree(model_dir, tmp_path / "run" / run_folder.MODEL_FOLDER)
    monkeypatch.setattr(run_folder, "require_stage", lambda *_: {"steps": 40})
    config = load_config(overrides={"generate": {"prompt": "\x1b[2JROMEO:\r", "max_new_tokens": 3}})
    generate_module.generate_stage(None, config, (tmp_path / "run").as_uri())
    assert capsys.readouterr().out.startswith("\\x1b[2JROMEO:\\x0d")
    assert (tmp_path / "run" / run_folder.SAMPLES_PATH).read_bytes().startswith(b"\x1b[2JROMEO:\r")


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


def cli_here(capsys, *args: str) -> subprocess.CompletedProcess:
    """The command line in this process, whose TensorFlow is imported already: `cli` starts a
    TensorFlow process of its own for each call (seconds of CPU), which the tests of the command as
    a process (`seeded`, --help) do once."""
    capsys.readouterr()
    code = generate_module.cli(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


SEEDED = ["--prompt", "ROMEO:", "--max-new-tokens", "10", "--seed", "3"]


@pytest.fixture(scope="module")
def seeded(model_dir) -> subprocess.CompletedProcess:
    """The command's continuation of SEEDED, from the model folder: what the same seed gives again
    (test_cli_prints_a_seeded_continuation) and a latest pointer to that model gives."""
    return cli("--model-dir", str(model_dir), *SEEDED)


def test_cli_prints_a_seeded_continuation(model_dir, seeded):
    assert seeded.returncode == 0, seeded.stderr
    assert seeded.stdout.startswith("ROMEO:")
    assert seeded.stdout == cli("--model-dir", str(model_dir), *SEEDED).stdout


def test_cli_prints_several_samples_with_control_characters_as_escapes(model_dir, capsys):
    prompt = "\x1b]0;owned\x07ROMEO:"
    args = ["--model-dir", str(model_dir), "--prompt", prompt, "--max-new-tokens", "3", "--num-samples", "2"]
    completed = cli_here(capsys, *args)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("\\x1b]0;owned\\x07ROMEO:")
    assert completed.stdout.count(SAMPLE_SEPARATOR) == 1 and completed.stdout.count("\\x07ROMEO:") == 2


def test_cli_rejects_bad_settings_by_name(model_dir):
    completed = cli("--model-dir", str(model_dir), "--temperature", "0")
    assert completed.returncode == 2
    assert "generate.temperature: must be above 0; strategy greedy takes the most likely token" in completed.stderr


def test_cli_slides_the_window_as_asked(model_dir, capsys):
    args = ["--model-dir", str(model_dir), "--prompt", "ROMEO:", "--max-new-tokens", "12", "--strategy", "greedy"]
    completed = cli_here(capsys, *args, "--window-slide", "4")
    assert completed.returncode == 0, completed.stderr
    model, tokenizer = load_model(str(model_dir))
    options = settings(prompt="ROMEO:", max_new_tokens=12, strategy="greedy")
    assert completed.stdout == printable(reference_generate(model, tokenizer, options, window_slide=4)) + "\n"
    too_wide = cli_here(capsys, *args, "--window-slide", "9")
    assert too_wide.returncode == 2 and "--window-slide 9: must be between 1 and the block size 8" in too_wide.stderr


def test_cli_help_describes_the_command_line_not_the_stage():
    helped = cli("--help")
    assert helped.returncode == 0 and "--model-dir MODEL_DIR" in helped.stdout and "--prompt" in helped.stdout
    assert "--run-dir RUN_DIR continues generate.prompt" in " ".join(helped.stdout.split())  # the stage, as an aside


# Reports, as the command exits, whether TensorFlow was imported.
TENSORFLOW_IMPORTED = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('tensorflow imported:', 'tensorflow' in sys.modules))\n"
    "from spark_jobs import generate\n"
    "sys.exit(generate.cli(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("args", [["--help"], ["--temperature", "0"]], ids=["help", "refused"])
def test_help_and_a_refused_argument_answer_without_importing_tensorflow(args):
    """TensorFlow takes seconds to import: the command line answers these at once."""
    done = subprocess.run(
        [sys.executable, "-c", TENSORFLOW_IMPORTED, *args], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.stdout.splitlines()[-1] == "tensorflow imported: False", done.stdout + done.stderr


def test_cli_without_a_model_takes_the_newest_runs_in_the_lake(model_dir, tmp_path, monkeypatch, capsys):
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(
        yaml.safe_dump(apply_overrides(read_yaml(DEFAULT_CONFIG_PATH), {"lake": str(tmp_path / "lake")}))
    )
    # A bare call of the module is the command line's, not the stage's (its entry point tells them
    # apart), so this one runs as a process of its own.
    empty = cli(env={"GPT_PIPELINE_CONFIG": str(config_file)})
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
    monkeypatch.setenv("GPT_PIPELINE_CONFIG", str(config_file))
    completed = cli_here(capsys, "--prompt", "ROMEO:", "--max-new-tokens", "5")
    assert completed.returncode == 0, completed.stderr
    assert f"model: {tmp_path / 'lake' / 'runs' / 'newer' / 'model'} (the newest run's)" in completed.stderr
    assert completed.stdout.startswith("ROMEO:")


def test_cli_follows_a_latest_pointer_on_s3(model_dir, seeded, monkeypatch, capsys):
    with LocalS3(buckets=("models",)) as s3:
        client = s3.client()
        for file in model_dir.iterdir():
            client.put_object(Bucket="models", Key=f"runs/plays-1/model/{file.name}", Body=file.read_bytes())
        pointer = {"run": "plays-1", "model": "s3://models/runs/plays-1/model/"}
        client.put_object(Bucket="models", Key="runs/latest/plays.json", Body=json.dumps(pointer).encode())
        client.put_object(Bucket="models", Key="runs/latest/broken.json", Body=b"{}")

        for name, value in s3.connection_env().items():
            monkeypatch.setenv(name, value)
        followed = cli_here(capsys, "--latest", "s3://models/runs/latest/plays.json", *SEEDED)
        missing = cli_here(capsys, "--latest", "s3://models/runs/latest/poems.json", *SEEDED)
        broken = cli_here(capsys, "--latest", "s3://models/runs/latest/broken.json", *SEEDED)

    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == seeded.stdout
    assert "model: s3://models/runs/plays-1/model/ (from s3://models/runs/latest/plays.json)" in followed.stderr
    assert missing.returncode == 2
    assert "no latest pointer at s3://models/runs/latest/poems.json" in missing.stderr
    assert broken.returncode == 2 and "is not a latest pointer written by promote" in broken.stderr


def test_a_model_saved_before_the_gpt2_architecture_still_generates():
    """legacy_model/ (tests/spark_jobs/test_model.py): its own output projection, through the cached pass too."""
    model, tokenizer = load_model(str(LEGACY_MODEL))
    options = settings(prompt="The man", max_new_tokens=12, strategy="greedy")
    assert generate(model, tokenizer, options) == reference_generate(model, tokenizer, options)
