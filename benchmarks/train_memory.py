"""Training memory: the estimate of spark_jobs/training/memory.py against the peak a real worker reaches.

    .venv/bin/python -m benchmarks.train_memory [--corpus PATH] [--only N,...]

For each model shape below, runs tokenize, window, positional_embed, export and a 3-step train
through spark-submit (include/local_spark) on the corpus (tinyshakespeare by default), reads the
worker's peak resident memory from stats/epochs.csv (process_memory_max_mb, ru_maxrss) and prints
it beside the estimate. The estimate should be close to the peak and not far below it: the
refusal of a run too big for its machine rests on it.
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import sys
import tempfile
from pathlib import Path

from local_platform.stage_runner import run_pipeline
from pipeline import lake, run_folder
from pipeline.config import SHARED_CORPUS
from pipeline.config_files import load_config
from pipeline.stages import PREPROCESSING_STAGES, TRAINING_STAGE
from spark_jobs.training import memory

SHORT_TRAINING = [
    "train.max_steps=3",
    "train.eval_interval=3",
    "train.eval_batches=1",
    "train.warmup_steps=1",
    "train.log_interval=1",
    "generate.max_new_tokens=1",
]
SHAPES = {
    "defaults, 1 worker": ["train.num_workers=1"],
    "defaults, 2 workers": [],
    "T=512": ["train.num_workers=1", "data.block_size=512", "data.stride=256"],
    "T=1024, batch 16": ["train.num_workers=1", "data.block_size=1024", "data.stride=512", "train.batch_size=16"],
    "batch 128": ["train.num_workers=1", "train.batch_size=128"],
    "V=8192": ["train.num_workers=1", "tokenizer.vocab_size=8192"],
    "D=384, 6 heads": ["train.num_workers=1", "embedding.dim=384", "model.n_head=6"],
    "12 layers": ["train.num_workers=1", "model.n_layer=12"],
    "MLP ratio 16": ["train.num_workers=1", "model.mlp_ratio=16"],
    "MLP ratio 1": ["train.num_workers=1", "model.mlp_ratio=1"],
    "D=256, T=32, b=256, MLP 16": [
        "train.num_workers=1",
        "embedding.dim=256",
        "data.block_size=32",
        "data.stride=16",
        "train.batch_size=256",
        "model.mlp_ratio=16",
    ],
}
MEASURED_STAGES = (*PREPROCESSING_STAGES, TRAINING_STAGE)


def measure(corpus: Path, overrides: list[str], scratch: Path) -> tuple[dict, float, int]:
    """(the estimate, the measured peak in MB, the vocabulary the tokenizer reached)."""
    config = load_config(
        overrides=[{"corpus": str(corpus), "lake": str(scratch / "lake")}] + SHORT_TRAINING + overrides
    )
    run = run_pipeline(config, "memory", MEASURED_STAGES)
    rows = list(csv.DictReader(io.StringIO(lake.read_text(lake.join(run, run_folder.EPOCHS_CSV_PATH)))))
    peak = max(float(row["process_memory_max_mb"]) for row in rows)
    vocab = lake.read_json(lake.join(run, run_folder.MANIFEST_PATH))["vocab_size"]
    return memory.worker_peak_mb(config, vocab), peak, vocab


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=SHARED_CORPUS)
    parser.add_argument("--only", help="comma-separated numbers of the shapes to run (1 = the first)")
    args = parser.parse_args(argv)
    chosen = list(SHAPES.items())
    if args.only:
        chosen = [chosen[int(number) - 1] for number in args.only.split(",")]
    results = []
    for name, overrides in chosen:
        scratch = Path(tempfile.mkdtemp(prefix="gpt-pipeline-memory-"))
        try:
            results.append((name, *measure(args.corpus, overrides, scratch)))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"\n{'shape':22} {'vocab':>6} {'estimate MB':>12} {'peak MB':>9} {'estimate/peak':>14}   parts of the "
        "estimate (MB)"
    )
    for name, estimate, peak, vocab in results:
        parts = ", ".join(f"{key} {value:,}" for key, value in estimate.items() if key != "total")
        print(
            f"{name:22} {vocab:>6} {estimate['total']:>12,} {peak:>9,.0f} {estimate['total'] / peak:>14.2f}   {parts}"
        )
    print(
        f"this machine: {memory.machine_memory_mb():,} MB; a local worker may use "
        f"{memory.local_worker_mb(load_config()):,} MB with the default train.num_workers"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
