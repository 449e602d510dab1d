"""Training against its reference, measured side by side: nanoGPT's README CPU command, then ours.

    .venv/bin/python -m benchmarks.anchor_nanogpt --nanogpt DIR --python TORCH_PYTHON [--workers 2]
        [--corpus PATH] [--eval-interval 10] [--set section.key=value ...]

DIR is a checkout of https://github.com/karpathy/nanoGPT (its train.py, model.py, configurator.py
and config/train_shakespeare_char.py are used, unchanged); TORCH_PYTHON a Python with torch and
numpy (`make hf-venv` makes .venv-hf, which has both). On this machine, one after the other:

1. this machine's fp32 matmul peak (TensorFlow, 2048 x 2048, best of 3);
2. nanoGPT's README CPU command (char-level, 4 layers x 128, block 64, batch 12, 2,000 iterations)
   on the corpus split as its prepare.py splits it (first 90% train, last 10% validation), written
   from --corpus rather than downloaded: its wall time and its final validation loss (nats/char,
   its estimate on 20 batches);
3. our preprocessing (not timed: nanoGPT's prepare.py is not either), then our train stage with the
   default config (and --set), evaluating the whole validation split every --eval-interval steps.
   The training clock counts the steps only (every step, compilation included); the evaluations
   are timed apart, as is the stage's start (Spark, TensorFlow, the workers' cluster).

Prints our training time to the first evaluation at or below nanoGPT's final loss, to 1.60
nats/char and to the end, each beside nanoGPT's wall time as a ratio, and tokens/s as a fraction
of the matmul peak (6 x parameters + 12 x layers x block x width FLOPs per token, attention included).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import pickle
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.quality import clone_run
from include.local_spark import submit_stage
from include.spark_submit import packaged_code
from local_platform.stage_runner import run_pipeline
from pipeline import lake, run_folder
from pipeline.config_files import load_config
from pipeline.overrides import add_set_argument
from pipeline.stages import PREPROCESSING_STAGES
from spark_jobs.training.input_pipeline import most_windows_per_worker

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
# nanoGPT's README, "I only have a macbook" (CPU): the command and the loss it says it reaches.
NANOGPT_COMMAND = (
    "config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1 "
    "--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 "
    "--lr_decay_iters=2000 --dropout=0.0"
).split()
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py")
TARGET_NATS_PER_CHAR = 1.60


def matmul_peak_gflops(size: int = 2048, repeats: int = 3, products: int = 10) -> float:
    """The best fp32 matmul rate of TensorFlow on this machine, GFLOP/s."""
    import tensorflow as tf

    a, b = tf.random.normal((size, size)), tf.random.normal((size, size))
    product = tf.function(tf.linalg.matmul)
    product(a, b).numpy()
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(products):
            result = product(a, b)
        result.numpy()
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 * products / best / 1e9


def check_nanogpt(nanogpt: Path) -> None:
    missing = [name for name in NANOGPT_FILES if not (nanogpt / name).is_file()]
    if missing:
        raise SystemExit(f"--nanogpt {nanogpt} is not a nanoGPT checkout: it lacks {', '.join(missing)}")


def prepare_nanogpt(nanogpt: Path, corpus: Path, work: Path) -> Path:
    """nanoGPT's files and its shakespeare_char data (as data/shakespeare_char/prepare.py makes it)."""
    for name in NANOGPT_FILES:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(nanogpt / name, work / name)
    text = corpus.read_text(encoding="utf-8")
    chars = sorted(set(text))
    index = {char: i for i, char in enumerate(chars)}
    cut = int(len(text) * 0.9)
    data = work / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    for name, part in (("train", text[:cut]), ("val", text[cut:])):
        np.array([index[char] for char in part], dtype=np.uint16).tofile(data / f"{name}.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": index}
    (data / "meta.pkl").write_bytes(pickle.dumps(meta))
    return work


def run_nanogpt(python: str, work: Path) -> tuple[float, float]:
    """nanoGPT's wall time (the whole command) and its last validation loss."""
    command = [python, "train.py", *NANOGPT_COMMAND, f"--out_dir={work / 'out'}"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=work, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (work / "train.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"nanoGPT failed ({work / 'train.log'}):\n{done.stderr[-2000:]}")
    losses = re.findall(r"step \d+: train loss [\d.]+, val loss ([\d.]+)", done.stdout)
    return seconds, float(losses[-1])


def benchmark_settings(lake_root: str, corpus: Path, overrides: list) -> list:
    """The overrides of a benchmark run: its lake and corpus, then the --set ones."""
    return [{"lake": lake_root}, {"corpus": str(corpus)}, *overrides]


def preprocess(overrides: list) -> tuple[str, dict]:
    """Our preprocessing stages (untimed, as nanoGPT's prepare.py): the run folder and its manifest."""
    config = load_config(overrides=overrides)
    run_id = f"anchor-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    base = run_pipeline(config, run_id, PREPROCESSING_STAGES)
    return base, lake.read_json(lake.join(base, run_folder.MANIFEST_PATH))


def train_evaluated(base: str, manifest: dict, overrides: list, eval_interval: int, name: str):
    """The train stage on a copy of the preprocessed run `base`, evaluating the whole validation split
    every eval_interval steps: its stats, its stats/epochs.csv rows and its config."""
    config = load_config(overrides=overrides)
    workers = config.train.num_workers
    whole_split = math.ceil(most_windows_per_worker(manifest, "val", workers) / (config.train.batch_size // workers))
    evaluated = [f"train.eval_interval={eval_interval}", f"train.eval_batches={whole_split}"]
    config = load_config(overrides=[*overrides, *evaluated])
    run = clone_run(base, name, config)
    with packaged_code() as code_dir:
        submit_stage("train", config, run, code_dir)
    stats = lake.read_json(run_folder.stats_uri(run, "train"))
    rows = list(csv.DictReader(io.StringIO(lake.read_text(lake.join(run, run_folder.EPOCHS_CSV_PATH)))))
    return stats, rows, config


def train_ours(args, workers: int) -> tuple[dict, list[dict], dict]:
    """Our train stage with an evaluation of the whole validation split every eval_interval steps."""
    overrides = benchmark_settings(args.lake, args.corpus, [*args.overrides, f"train.num_workers={workers}"])
    base, manifest = preprocess(overrides)
    return train_evaluated(base, manifest, overrides, args.eval_interval, "anchor")


def first_at_or_below(rows: list[dict], loss: float) -> tuple[int, float] | None:
    """The first evaluation at or below `loss` nats/char: its step and the training time up to it."""
    clock = 0.0
    for row in rows:
        clock += float(row["duration_ms"]) / 1000
        if float(row["val_nats_per_char"]) <= loss:
            return int(row["step"]), clock
    return None


def crossing_line(name: str, crossing: tuple[int, float] | None, nanogpt_s: float) -> str:
    if crossing is None:
        return f"{name:<34} not reached"
    step, seconds = crossing
    return f"{name:<34} step {step:>5}  {seconds:>7.1f} s  nanoGPT's wall time / ours {nanogpt_s / seconds:>5.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout")
    parser.add_argument("--python", required=True, help="a Python with torch and numpy, for nanoGPT")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--eval-interval", type=int, default=10)
    parser.add_argument("--lake", default=str(Path(tempfile.gettempdir()) / "gpt-pipeline-anchor"))
    add_set_argument(parser)
    args = parser.parse_args()
    check_nanogpt(args.nanogpt)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    peak = matmul_peak_gflops()
    print(f"fp32 matmul peak (TensorFlow, 2048 x 2048): {peak:,.0f} GFLOP/s")
    with tempfile.TemporaryDirectory(prefix="nanogpt-") as work:
        nanogpt_s, nanogpt_loss = run_nanogpt(args.python, prepare_nanogpt(args.nanogpt, args.corpus, Path(work)))
    print(
        f"nanoGPT: {nanogpt_s:.1f} s wall, final val loss {nanogpt_loss:.4f} nats/char "
        f"(load average {os.getloadavg()[0]:.2f})"
    )
    stats, rows, config = train_ours(args, args.workers)
    training_s = sum(float(row["duration_ms"]) for row in rows) / 1000
    evaluating_s = stats["train_wall_s"] - training_s
    flops_per_token = (
        6 * stats["parameters"] + 12 * config.model.n_layer * config.data.block_size * config.embedding.dim
    )
    print(
        f"ours: {args.workers} workers, {config.train.max_steps} steps, batch {config.train.batch_size} x "
        f"{config.data.block_size}, {stats['parameters']:,} parameters; stage {stats['duration_s']:.1f} s = "
        f"training {training_s:.1f} s (first step, compiling: {stats['compile_s']:.1f} s) + "
        f"{len(rows)} whole-split evaluations (and backups) {evaluating_s:.1f} s + start and stop "
        f"{stats['duration_s'] - stats['train_wall_s']:.1f} s; "
        f"final {float(rows[-1]['val_nats_per_char']):.4f} nats/char"
    )
    print(crossing_line(f"to nanoGPT's final {nanogpt_loss:.4f}", first_at_or_below(rows, nanogpt_loss), nanogpt_s))
    print(
        crossing_line(
            f"to {TARGET_NATS_PER_CHAR:.2f} nats/char", first_at_or_below(rows, TARGET_NATS_PER_CHAR), nanogpt_s
        )
    )
    print(crossing_line("to the end", (int(rows[-1]["step"]), training_s), nanogpt_s))
    rate = stats["tokens_per_s"]
    print(
        f"throughput: {rate:,.0f} tokens/s x {flops_per_token / 1e6:.2f} MFLOP/token = "
        f"{rate * flops_per_token / 1e9:.0f} GFLOP/s, {rate * flops_per_token / 1e9 / peak:.0%} of the matmul peak"
    )


if __name__ == "__main__":
    main()
