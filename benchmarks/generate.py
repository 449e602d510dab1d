"""Speed of sampling (spark_jobs.generate, spark_jobs.model.sampler and the model's cached pass,
spark_jobs.model.decoder.CachedDecoder) on the default model shape.

    .venv/bin/python -m benchmarks.generate [--model-dir DIR] [--new-tokens 1000] [--samples 1,8] [--window-slides 1,64]

Without --model-dir, a decoder of include/config/pipeline.yaml's shape (block_size, embedding.dim,
model.*, tokenizer.vocab_size) with its initial random weights is saved in the model folder layout,
with a byte-level BPE tokenizer trained on the first MB of the corpus: a trained model of that shape
takes the same time per token (the text differs; random weights draw longer tokens than real text's).

Prints the start-up (loading the model and the tokenizer, compiling, the first token out: what one
`python -m spark_jobs.generate` pays before its steady state, after importing TensorFlow), then for each
batch size and window slide the steady state over --new-tokens tokens per sample (compiled already):
ms per step (one token for each sample), ms per token (and the process's CPU time per token, which
other processes on the machine sway less), characters per second. Then where the time of a
step goes: the compiled step alone, a full-window prefill alone, and the matmul FLOPs of a token.

The `x nanoGPT` columns divide by a dated reference, not measured here: nanoGPT's sample.py with
its CPU shakespeare_char model (`python sample.py --out_dir=out-shakespeare-char --device=cpu`),
~1.5 ms per character (~667 chars/s) on 2 cores, recorded by 2026-11-25 (docs/generation.md); the goal
is 4x that, ~2,700 chars/s, about 1.1 ms per BPE token at ~2.9 chars per token.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

# TensorFlow and the sampler are imported inside the functions: main() times their first import,
# the start-up every `python -m spark_jobs.generate` pays before it loads a model.
NANOGPT_CHARS_PER_S = 1 / 1.5e-3
CHARS_PER_TOKEN = 2.9  # characters per BPE token of tinyshakespeare with the default vocabulary


def default_model_folder(folder: Path, config) -> Path:
    from tokenizers import ByteLevelBPETokenizer

    from pipeline import run_folder
    from spark_jobs.model.decoder import decoder_for
    from spark_jobs.text import bpe

    text = Path(config.corpus[0].removeprefix("file://")).read_text(encoding="utf-8")[: 2**20]
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        [text], vocab_size=config.tokenizer.vocab_size, special_tokens=list(bpe.SPECIAL_TOKENS)
    )
    model = decoder_for(config, dropout=0.0)
    model.save(folder / run_folder.MODEL_FILE)
    (folder / run_folder.MODEL_TOKENIZER_FILE).write_text(tokenizer._tokenizer.to_str())
    return folder


def run(model, prompt: list[int], samples: int, new_tokens: int, window_slide: int, settings) -> list[list[int]]:
    from spark_jobs.model import sampler

    return sampler.decode(
        model,
        prompt,
        num_samples=samples,
        max_new_tokens=new_tokens,
        rule=settings,
        seed=settings.seed,
        stop_id=None,  # no early end: every sample writes new_tokens tokens
        window_slide=window_slide,
    )


def timed(function, repeats: int) -> float:
    """Seconds per call, the best of 3 rounds of `repeats` calls."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(repeats):
            function()
        best = min(best, (time.perf_counter() - started) / repeats)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="a saved model folder (default: the default shape, random weights)")
    parser.add_argument("--new-tokens", type=int, default=1000)
    parser.add_argument("--samples", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--window-slides", default="1,64", help="window slides past block_size, comma-separated")
    args = parser.parse_args()
    import_started = time.perf_counter()
    import tensorflow as tf

    from pipeline.config_files import load_config
    from spark_jobs.generate import load_model
    from spark_jobs.model.decoder import cached_decoder

    import_s = time.perf_counter() - import_started
    config = load_config()
    settings = config.generate
    with tempfile.TemporaryDirectory(prefix="gpt-pipeline-bench-") as scratch:
        folder = args.model_dir or str(default_model_folder(Path(scratch), config))

        started = time.perf_counter()
        model, tokenizer = load_model(folder)
        loaded = time.perf_counter()
        prompt = tokenizer.encode(settings.prompt).ids
        run(model, prompt, 1, 1, 1, settings)
        first = time.perf_counter()

    decoder = cached_decoder(model)
    print(
        f"model: {'random weights, ' if not args.model_dir else ''}vocab {decoder.vocab_size}, block "
        f"{decoder.block_size}, width {decoder.dim}, {len(decoder.blocks)} layers x {decoder.n_head} heads; "
        f"prompt {settings.prompt!r} ({len(prompt)} tokens), {settings.strategy}; "
        f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores, TensorFlow {tf.__version__}"
    )
    print(
        f"start-up: import {import_s:.2f} s, load model and tokenizer {loaded - started:.2f} s, "
        f"compile and first token {first - loaded:.2f} s: first token out {first - started:.2f} s after loading began"
    )
    print(
        f"{'samples':>7} {'slide':>5} {'tokens':>7} {'seconds':>8} {'ms/step':>8} {'ms/token':>8} {'cpu ms/token':>12} "
        f"{'chars/token':>11} {'chars/s':>8} {'x nanoGPT':>9} {'chars/s @2.9':>12} {'x nanoGPT':>9}"
    )
    for samples in [int(count) for count in args.samples.split(",")]:
        for slide in [int(value) for value in args.window_slides.split(",")]:
            run(model, prompt, samples, decoder.block_size + 2, slide, settings)  # compile for this batch size
            started, cpu_started = time.perf_counter(), time.process_time()
            new = run(model, prompt, samples, args.new_tokens, slide, settings)
            seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
            tokens = sum(len(ids) for ids in new)
            chars = sum(len(tokenizer.decode(prompt + ids)) - len(tokenizer.decode(prompt)) for ids in new)
            per_token = seconds / tokens
            print(
                f"{samples:>7} {slide:>5} {tokens:>7} {seconds:>8.2f} {seconds / args.new_tokens * 1e3:>8.3f} "
                f"{per_token * 1e3:>8.3f} {cpu_seconds / tokens * 1e3:>12.3f} "
                f"{chars / tokens:>11.2f} {chars / seconds:>8,.0f} "
                f"{chars / seconds / NANOGPT_CHARS_PER_S:>9.1f} {CHARS_PER_TOKEN / per_token:>12,.0f} "
                f"{CHARS_PER_TOKEN / per_token / NANOGPT_CHARS_PER_S:>9.1f}"
            )
    profile(model, [int(count) for count in args.samples.split(",")])


def profile(model, batch_sizes: list[int]) -> None:
    """The compiled functions alone (of the model's CachedDecoder), with no sampling between calls."""
    import tensorflow as tf

    from pipeline.config_files import load_config
    from spark_jobs.model import sampler
    from spark_jobs.model.decoder import cached_decoder

    decoder = cached_decoder(model)
    block, dim, layers = decoder.block_size, decoder.dim, len(decoder.blocks)
    mlp = int(decoder.blocks[0].mlp_in.kernel.shape[-1])
    # Multiply-adds of one token through the matmuls: qkv, attention_out, the MLP, the output projection.
    token_macs = layers * (dim * 3 * dim + dim * dim + 2 * dim * mlp) + dim * decoder.vocab_size
    print(
        f"a token's matmuls: {2 * token_macs / 1e6:.2f} MFLOP (+ attention, up to "
        f"{2 * 2 * layers * block * dim / 1e6:.2f} MFLOP at a full window)"
    )
    for batch in batch_sizes:
        ids, tokens = tf.zeros((batch, block), tf.int32), tf.zeros(batch, tf.int32)
        middle, end = decoder.positions[block // 2], decoder.positions[block]
        _, cache = decoder.compiled_prefill(ids, middle)
        step_s = timed(lambda: decoder.compiled_step(tokens, middle, cache)[0].numpy(), 200)  # noqa: B023
        prefill_s = timed(lambda: decoder.compiled_prefill(ids, end)[0].numpy(), 10)  # noqa: B023
        logits, cache = decoder.compiled_prefill(ids, decoder.positions[1])
        window = block - 1  # picks and steps from position 1 to the end of the window, in one call

        def run_window():
            run = sampler.compiled_run(model, load_config().generate)
            run(*window_arguments(decoder, logits, cache, window))[1].numpy()  # noqa: B023

        window_s = timed(run_window, 5) / window
        print(
            f"batch {batch}: compiled step {step_s * 1e3:.3f} ms ({2 * token_macs * batch / step_s / 1e9:.1f} "
            f"GFLOP/s of matmuls), full-window prefill {prefill_s * 1e3:.2f} ms "
            f"({2 * token_macs * batch * block / prefill_s / 1e9:.1f} GFLOP/s), "
            f"pick and step in the compiled loop {window_s * 1e3:.3f} ms per step"
        )


def window_arguments(decoder, logits, cache, steps: int) -> tuple:
    """compiled_run's arguments for `steps` top_k picks from position 1, no stop token."""
    import tensorflow as tf

    from pipeline.config_files import load_config
    from spark_jobs.model import sampler

    batch = int(logits.shape[0])
    return (
        logits,
        cache,
        decoder.positions[1],
        tf.constant(steps),
        tf.constant(decoder.vocab_size),
        *sampler.rule_values(load_config().generate),
        tf.range(batch, dtype=tf.int64),
        tf.constant(0),
        tf.constant(sampler.NO_STOP),
        tf.zeros(batch, tf.bool),
    )


if __name__ == "__main__":
    main()
