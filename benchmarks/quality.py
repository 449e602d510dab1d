"""Quality and speed of training with the default config on the whole tinyshakespeare.

    .venv/bin/python -m benchmarks.quality [--set section.key=value ...] [--workers 2,1]

Runs the preprocessing stages once, then the train stage with 2 workers and with 1 (on a copy of
the run folder), and prints per worker count: the training wall time (the training loop,
including compilation and the periodic and final evaluations), tokens/s and the final validation
loss per token and per character. nanoGPT's CPU config, the reference, is measured beside the
train stage by `python -m benchmarks.anchor_nanogpt` (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import posixpath
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from include.local_spark import submit_stage
from include.spark_submit import packaged_code
from local_platform.stage_runner import run_pipeline
from pipeline import lake, run_folder
from pipeline.config import to_uri
from pipeline.config_files import load_config
from pipeline.overrides import add_set_argument
from pipeline.stages import PREPROCESSING_STAGES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_set_argument(parser)
    parser.add_argument("--workers", default="2,1", help="worker counts to train with, comma-separated")
    parser.add_argument("--lake", default=str(Path(tempfile.gettempdir()) / "gpt-pipeline-bench"))
    args = parser.parse_args()
    counts = [int(count) for count in args.workers.split(",")]
    config = load_config(overrides=[{"lake": args.lake}, *args.overrides])
    run_id = f"quality-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    base = run_pipeline(config, run_id, PREPROCESSING_STAGES)
    rows = []
    with packaged_code() as code_dir:
        for workers in counts:
            worker_config = load_config(
                overrides=[{"lake": args.lake}, *args.overrides, f"train.num_workers={workers}"]
            )
            run = clone_run(base, f"{workers}w", worker_config)
            submit_stage("train", worker_config, run, code_dir)
            rows.append((workers, lake.read_json(run_folder.stats_uri(run, "train"))))
    export = lake.read_json(lake.join(base, run_folder.MANIFEST_PATH))
    train = config.train
    print(
        f"\nconfig: vocab {export['vocab_size']}, block {config.data.block_size}, stride {config.data.stride}, "
        f"width {config.embedding.dim}, {config.model.n_layer} layers x {config.model.n_head} heads, "
        f"batch {train.batch_size}, {train.max_steps} steps, lr {train.learning_rate}; "
        f"train split {export['splits']['train']['tokens']:,} tokens / {export['splits']['train']['chars']:,} chars"
    )
    print(f"{'workers':>7} {'train wall s':>12} {'stage s':>8} {'tokens/s':>9} {'val loss':>8} {'val nats/char':>13}")
    for workers, stats in rows:
        print(
            f"{workers:>7} {stats['train_wall_s']:>12.1f} {stats['duration_s']:>8.1f} {stats['tokens_per_s']:>9,.0f} "
            f"{stats['final_val_loss']:>8.4f} {stats['final_val_nats_per_char']:>13.4f}"
        )


def clone_run(run: str, suffix: str, config) -> str:
    """A copy of the run folder's inputs (not its training outputs) with this config."""
    source = Path(lake.local_path(run))
    target = source.with_name(f"{source.name}-{suffix}")
    shutil.rmtree(target, ignore_errors=True)
    training = [run_folder.MODEL_FOLDER, run_folder.BACKUP_FOLDER, run_folder.stats_path("train")]
    names = [posixpath.basename(path) for path in [*training, run_folder.EPOCHS_CSV_PATH]]
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*names))
    uri = to_uri(str(target))
    lake.write_text(lake.join(uri, run_folder.CONFIG_FILE), config.to_json())
    return uri


if __name__ == "__main__":
    main()
