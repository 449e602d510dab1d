"""Stage generate: continue the configured prompt with the trained model; writes samples.txt.

Also a command line for any saved model folder (a run's model/, or its Hugging Face GPT-2 folder
model/hf/; local path or URI), or for the model a latest pointer written by the DAG's promote task
points at:

    python -m spark_jobs.generate --model-dir lake/runs/<run_id>/model --prompt "ROMEO:" --seed 3
    python -m spark_jobs.generate --latest s3://gpt-pipeline/runs/latest/tinyshakespeare.json

Options not given come from the generate section of include/config/pipeline.yaml.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from pipeline import lake, run_folder
from pipeline.config import GenerateConfig, PipelineConfig, to_uri
from pipeline.config_files import load_config
from pipeline.errors import PipelineError
from pipeline.log import printable
from spark_jobs.model import export_hf
from spark_jobs.spark.stage_app import run_stage
from spark_jobs.text import bpe
from spark_jobs.training import tensorboard_log


def load_model(model_folder: str):
    """The Keras model and the tokenizer saved by the train stage, from a model folder's path or
    URI, or from a Hugging Face GPT-2 folder (the model folder's hf/, spark_jobs.model.export_hf)."""
    import keras
    from tokenizers import Tokenizer

    import spark_jobs.model.layers  # noqa: F401  registers the decoder's layers for loading

    model_uri = to_uri(str(model_folder))
    if not lake.exists(lake.join(model_uri, run_folder.MODEL_FILE)) and export_hf.is_hf_folder(model_uri):
        return export_hf.read_hf_folder(model_uri)
    for name in (run_folder.MODEL_FILE, run_folder.MODEL_TOKENIZER_FILE):
        if not lake.exists(lake.join(model_uri, name)):
            raise PipelineError(
                f"{model_uri} holds no {name}: is it a model folder written by the train stage, or its "
                f"{run_folder.MODEL_HF_FOLDER}/?"
            )
    with tempfile.TemporaryDirectory(prefix="gpt-pipeline-model-") as local:
        model = keras.saving.load_model(
            lake.download_file(lake.join(model_uri, run_folder.MODEL_FILE), Path(local) / run_folder.MODEL_FILE)
        )
    tokenizer = Tokenizer.from_str(lake.read_text(lake.join(model_uri, run_folder.MODEL_TOKENIZER_FILE)))
    return model, tokenizer


def pointed_model(pointer_uri: str) -> str:
    """The model folder a latest pointer (s3://{bucket}/{prefix}/latest/{run_name}.json) points at."""
    if not lake.exists(pointer_uri):
        raise PipelineError(f"no latest pointer at {pointer_uri}: no model of that run name was promoted there")
    try:
        model = json.loads(lake.read_text(pointer_uri))["model"]
    except (ValueError, TypeError, KeyError):
        raise PipelineError(f"{pointer_uri} is not a latest pointer written by promote (no 'model' in it)") from None
    print(f"model: {model} (from {pointer_uri})", file=sys.stderr)
    return model


def newest_model(config: PipelineConfig) -> str:
    """The model folder of the local lake's newest run that has one (what `make run` left last)."""
    if not config.lake.startswith("file://"):
        raise PipelineError(f"lake {config.lake} is not on local disk: give --model-dir or --latest")
    runs = Path(lake.local_path(run_folder.runs_folder(config.lake)))
    models = sorted(
        runs.glob(f"*/{run_folder.MODEL_FOLDER}/{run_folder.MODEL_FILE}"), key=lambda path: path.stat().st_mtime
    )
    if not models:
        raise PipelineError(f"no run in {runs} has a model yet: run `make run`, or give --model-dir or --latest")
    print(f"model: {models[-1].parent} (the newest run's)", file=sys.stderr)
    return str(models[-1].parent)


def generate_ids(
    model, tokenizer, settings: GenerateConfig, window_slide: int = 1
) -> tuple[list[int], list[list[int]]]:
    """The prompt's ids and the new ids of settings.num_samples samples, decoded as one batch
    (spark_jobs.model.sampler): sample i draws with seed settings.seed + i, each up to
    settings.max_new_tokens tokens, ending early where the model ends the document (<|endoftext|>).
    window_slide: how the context window slides past block_size (1: exactly; see sampling)."""
    end_of_text = bpe.separator_id(tokenizer)
    ids = tokenizer.encode(settings.prompt).ids if settings.prompt else [end_of_text]
    if not ids:
        raise PipelineError(f"the prompt {settings.prompt!r} encodes to no tokens")
    # The model has tokenizer.vocab_size outputs; BPE may have learned fewer tokens, whose ids alone decode.
    known = tokenizer.get_vocab_size()
    # Imported here: TensorFlow takes seconds to import, which --help and a refused argument need not wait for.
    from spark_jobs.model import sampler

    new = sampler.decode(
        model,
        ids,
        num_samples=settings.num_samples,
        max_new_tokens=settings.max_new_tokens,
        rule=settings,
        seed=settings.seed,
        stop_id=end_of_text,
        known=known,
        window_slide=window_slide,
    )
    return ids, new


def generate(model, tokenizer, settings: GenerateConfig, window_slide: int = 1) -> str:
    """The prompt and its continuation of up to settings.max_new_tokens tokens, ending early where
    the model ends the document (<|endoftext|>); the same seed gives the same text. An empty prompt
    starts a new document: the model continues <|endoftext|>, which the text leaves out."""
    return sample_texts(model, tokenizer, settings.model_copy(update={"num_samples": 1}), window_slide)[0]


def sample_texts(model, tokenizer, settings: GenerateConfig, window_slide: int = 1) -> list[str]:
    """settings.num_samples texts, sample i with seed settings.seed + i (the same text as drawn alone)."""
    ids, new = generate_ids(model, tokenizer, settings, window_slide)
    return [tokenizer.decode(ids + tokens) for tokens in new]


SAMPLE_SEPARATOR = "\n---------------\n"


def samples(model, tokenizer, settings: GenerateConfig, window_slide: int = 1) -> str:
    """settings.num_samples samples, sample i with seed settings.seed + i, separated by a line of dashes."""
    return SAMPLE_SEPARATOR.join(sample_texts(model, tokenizer, settings, window_slide))


def generate_stage(spark, config: PipelineConfig, run: str) -> dict:
    trained = run_folder.require_stage(run, "train")
    started = time.perf_counter()
    model, tokenizer = load_model(lake.join(run, run_folder.MODEL_FOLDER))
    loaded = time.perf_counter()
    ids, new = generate_ids(model, tokenizer, config.generate)
    generated = time.perf_counter()
    texts = [tokenizer.decode(ids + tokens) for tokens in new]
    text = SAMPLE_SEPARATOR.join(texts)
    tokens = sum(len(tokens) for tokens in new)
    lake.write_text(lake.join(run, run_folder.SAMPLES_PATH), text + "\n")
    tensorboard_log.write_samples(run, trained["steps"], texts)  # beside the training's curves, at its last step
    print(printable(text), flush=True)  # the samples.txt keeps the text as it is
    return {
        "prompt": config.generate.prompt,
        "new_tokens": config.generate.max_new_tokens,
        "strategy": config.generate.strategy,
        "seed": config.generate.seed,
        "samples": config.generate.num_samples,
        "chars": len(text),
        # Generation includes compiling the decoder's prefill and step (about a second), not loading the model.
        "generated_tokens": tokens,
        "generation_s": round(generated - loaded, 3),
        "tokens_per_s": round(tokens / (generated - loaded), 1),
        "timings": {"load_model": loaded - started, "generation": generated - loaded},
    }


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.generate",
        description="Continue a prompt with a saved model. Options not given come from the generate section of "
        "include/config/pipeline.yaml.",
        epilog="As the pipeline's stage (spark-submit, as the DAG runs it): --run-dir RUN_DIR continues "
        "generate.prompt with the run's model into the run's samples.txt.",
    )
    model = parser.add_mutually_exclusive_group()
    model.add_argument(
        "--model-dir", help="a model folder (path or URI), e.g. a run's model/; default: the newest run's in the lake"
    )
    model.add_argument("--latest", metavar="POINTER", help="a latest pointer (URI), for the model it points at")
    parser.add_argument("--prompt")
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--strategy", choices=["greedy", "top_k", "top_p"])
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--num-samples", type=int)
    parser.add_argument(
        "--window-slide",
        type=int,
        default=1,
        metavar="TOKENS",
        help="past the model's block size, slide the context window by this many tokens at a time: 1 (default) "
        "conditions every token on exactly the last block_size tokens, but each costs a pass over the whole "
        "block; more (e.g. half the block size) is much faster, each token then seeing at least "
        "block_size - TOKENS + 1 tokens",
    )
    args = vars(parser.parse_args(argv))
    model_dir, pointer, window_slide = args.pop("model_dir"), args.pop("latest"), args.pop("window_slide")
    try:
        given = {key: value for key, value in args.items() if value is not None}
        config = load_config(overrides={"generate": given})
        model_uri = pointed_model(to_uri(pointer)) if pointer else model_dir or newest_model(config)
        model, tokenizer = load_model(model_uri)
        block_size = model.get_layer("embedding").block_size
        if not 1 <= window_slide <= block_size:
            raise PipelineError(f"--window-slide {window_slide}: must be between 1 and the block size {block_size}")
        print(printable(samples(model, tokenizer, config.generate, window_slide)))
    except (PipelineError, OSError) as error:  # OSError: a model or pointer that cannot be read
        print(f"ERROR {error}", file=sys.stderr)
        return 2
    return 0


def is_stage_call(argv: list[str]) -> bool:
    """Whether the arguments are the stage's (--run-dir …) rather than a person's command line."""
    return any(arg.split("=")[0] == "--run-dir" for arg in argv) and not any(
        arg.split("=")[0] in ("--model-dir", "--latest", "-h", "--help") for arg in argv
    )


if __name__ == "__main__":
    if not is_stage_call(sys.argv[1:]):
        sys.exit(cli(sys.argv[1:]))
    run_stage("generate", generate_stage)
