"""Levers of training, measured one at a time on one preprocessed run.

    .venv/bin/python -m benchmarks.levers [--corpus PATH] [--workers 2] [--eval-interval 10]
        [--target 1.8857 --target 1.60] [--set section.key=value ...]
        --lever "" --lever "train.learning_rate=0.006 train.warmup_steps=20" ...

Runs the preprocessing stages once (the default config and --set), then the train stage once per
--lever on a copy of that run: the lever's settings (space-separated, "" for none) on top of the
same config, the whole validation split evaluated every --eval-interval steps. A lever changes what
the train stage reads (model, train); the data, tokenizer and embedding settings go to --set, as
they change the preprocessing every lever shares.

Prints per lever: the step and training seconds at the first evaluation at or below each --target
(nats/char), the final nats/char, the training seconds and tokens/s. The training clock is
benchmarks/anchor_nanogpt.py's: the steps alone, evaluations apart. Steps and losses compare
between any two runs; seconds only between runs on a machine doing nothing else.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.anchor_nanogpt import (
    CORPUS,
    TARGET_NATS_PER_CHAR,
    benchmark_settings,
    first_at_or_below,
    preprocess,
    train_evaluated,
)
from pipeline.overrides import add_set_argument

PREPROCESSING_SECTIONS = ("data.", "tokenizer.", "embedding.", "corpus", "lake")
# nanoGPT's final loss on tinyshakespeare, as benchmarks.anchor_nanogpt measured it (docs/benchmarks.md).
NANOGPT_FINAL_NATS_PER_CHAR = 1.8857


def lever_settings(lever: str) -> list[str]:
    """The section.key=value settings of one --lever; a setting the preprocessing reads is refused."""
    settings = lever.split()
    shared = [setting for setting in settings if setting.startswith(PREPROCESSING_SECTIONS)]
    if shared:
        raise SystemExit(
            f"--lever {lever!r}: {', '.join(shared)} changes the preprocessing every lever shares; "
            "give it to --set, in a run of its own"
        )
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lever", action="append", required=True, help='settings of one lever; "" the defaults')
    parser.add_argument("--target", type=float, action="append", help="nats/char to time (nanoGPT's, 1.60)")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--eval-interval", type=int, default=10)
    parser.add_argument("--lake", default=str(Path(tempfile.gettempdir()) / "gpt-pipeline-levers"))
    add_set_argument(parser)
    args = parser.parse_args()
    levers = [lever_settings(lever) for lever in args.lever]
    targets = args.target or [NANOGPT_FINAL_NATS_PER_CHAR, TARGET_NATS_PER_CHAR]
    shared = benchmark_settings(args.lake, args.corpus, [*args.overrides, f"train.num_workers={args.workers}"])
    base, manifest = preprocess(shared)
    for number, settings in enumerate(levers):
        stats, rows, _ = train_evaluated(base, manifest, [*shared, *settings], args.eval_interval, f"lever{number}")
        crossings = []
        for target in targets:
            crossing = first_at_or_below(rows, target)
            reached = f"step {crossing[0]} at {crossing[1]:.1f} s" if crossing else "not reached"
            crossings.append(f"to {target:.4g}: {reached}")
        training_s = sum(float(row["duration_ms"]) for row in rows) / 1000
        print(
            f"lever {' '.join(settings) or '(defaults)'}: {'; '.join(crossings)}; "
            f"final {float(rows[-1]['val_nats_per_char']):.4f} nats/char at step {rows[-1]['step']}; "
            f"training {training_s:.1f} s, {stats['tokens_per_s']:,.0f} tokens/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
