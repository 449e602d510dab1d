"""Preprocessing throughput: the four Spark stages on ~20 MB of text against bare HF `tokenizers`.

    .venv/bin/python benchmarks/preprocess.py [--mb 20] [--set section.key=value ...]

Builds a corpus of tinyshakespeare repeated to --mb megabytes (one file), runs tokenize, window,
positional_embed and export through spark-submit on local[cores] (include/local_runner.run_stage),
and prints tokens/s per stage and end to end. Each stage's time is split into the body (the
stage's own work, duration_s of stats/{stage}.json) and start-up plus shut-down (JVM, imports,
SparkContext, stopping Spark: the rest of spark-submit's wall time). Then it encodes the same text with the run's tokenizer.json through `Tokenizer.encode_batch`
on the same number of cores (RAYON_NUM_THREADS) with encode_batch and encode_batch_fast, fed the
same ~1 KB chunks the stage uses and, separately, line by line; the fastest is the baseline. Goal: end to end (bodies) >= 0.7x
the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from include.local_runner import run_stage  # noqa: E402
from include.spark_submit import package_code  # noqa: E402
from spark_jobs.lib import bpe, lake  # noqa: E402
from spark_jobs.lib.config import REPO_ROOT, load_config  # noqa: E402

STAGES = ("tokenize", "window", "positional_embed", "export")
SHAKESPEARE = REPO_ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def build_corpus(folder: Path, megabytes: float) -> Path:
    text = SHAKESPEARE.read_text(encoding="utf-8")
    copies = max(1, round(megabytes * 1_000_000 / len(text.encode("utf-8"))))
    path = folder / f"shakespeare-x{copies}.txt"
    path.write_text(text * copies, encoding="utf-8")
    return path


def bare_tokenizer(tokenizer_json: str, text: str, cores: int, repeats: int) -> dict:
    """Best-of-`repeats` throughput of encode_batch and encode_batch_fast, on ~1 KB chunks and on lines."""
    os.environ["RAYON_NUM_THREADS"] = str(cores)  # read when tokenizers first starts its thread pool
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    inputs = {
        f"~{bpe.ENCODE_CHUNK_CHARS}-char chunks": list(bpe.chunks(text, bpe.ENCODE_CHUNK_CHARS)),
        "lines": text.splitlines(keepends=True),
    }
    methods = [name for name in ("encode_batch", "encode_batch_fast") if hasattr(tokenizer, name)]
    results = {}
    for input_name, batch in inputs.items():
        for method in methods:
            best, tokens = float("inf"), 0
            for _ in range(repeats):
                started = time.perf_counter()
                encodings = getattr(tokenizer, method)(batch, add_special_tokens=False)
                best = min(best, time.perf_counter() - started)
                tokens = sum(len(encoding.ids) for encoding in encodings)
            results[f"{method}, {input_name}"] = {"seconds": best, "tokens": tokens, "tokens_per_s": tokens / best}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=20, help="corpus size in MB (default 20)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--repeats", type=int, default=3, help="bare tokenizer runs (best is kept)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (corpus and run folder)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 2  # the local runner's local[N]; the tokenizer gets as many threads
    load_before = os.getloadavg()[0]  # other work on the machine skews every figure

    scratch = Path(tempfile.mkdtemp(prefix="gpt-pipeline-bench-"))
    try:
        corpus = build_corpus(scratch, args.mb)
        corpus_mb = corpus.stat().st_size / 1e6
        config = load_config(overrides=[{"corpus": str(corpus), "lake": str(scratch / "lake")}] + args.overrides)
        run = lake.create_run(config, "bench")
        code = scratch / "code"
        package_code(code)
        stages = {}
        for stage in STAGES:
            started = time.perf_counter()
            run_stage(stage, config, run, code)
            wall = time.perf_counter() - started
            stats = lake.read_json(lake.stats_uri(run, stage))
            stages[stage] = {"wall_s": wall, "body_s": stats["duration_s"], "overhead_s": wall - stats["duration_s"]}
            stages[stage]["timings"] = stats.get("timings", {})
            if stage == "tokenize":
                tokenize_stats = stats
        tokens = sum(split["tokens"] for split in tokenize_stats["splits"].values())
        text = corpus.read_text(encoding="utf-8")
        bare = bare_tokenizer(lake.read_text(lake.join(run, "tokenizer", "tokenizer.json")), text, cores, args.repeats)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)

    body = sum(stage["body_s"] for stage in stages.values())
    wall = sum(stage["wall_s"] for stage in stages.values())
    baseline_name, baseline = max(bare.items(), key=lambda item: item[1]["tokens_per_s"])
    end_to_end = tokens / body
    print(f"corpus: {corpus.name}, {corpus_mb:.1f} MB, {tokens:,} tokens; local[{cores}]")
    print(f"{'stage':<18}{'start/stop s':>12}{'body s':>10}{'tokens/s (body)':>18}")
    for name, stage in stages.items():
        print(f"{name:<18}{stage['overhead_s']:>12.2f}{stage['body_s']:>10.2f}{tokens / stage['body_s']:>18,.0f}")
        if "timings" in stage:
            print(" " * 20 + ", ".join(f"{key} {value:.2f}" for key, value in stage["timings"].items()))
    print(f"{'end to end':<18}{wall - body:>12.2f}{body:>10.2f}{end_to_end:>18,.0f}")
    print(f"end to end with start-up and shut-down: {tokens / wall:,.0f} tokens/s ({wall:.1f} s)")
    for name, result in bare.items():
        print(f"bare {name}: {result['tokens_per_s']:,.0f} tokens/s ({result['seconds']:.2f} s)")
    ratio = end_to_end / baseline["tokens_per_s"]
    print(f"ratio end to end / bare ({baseline_name}): {ratio:.2f} (goal >= 0.7: {'met' if ratio >= 0.7 else 'not met'})")
    encode_s = stages["tokenize"]["timings"].get("encode_s")
    if encode_s:
        print(
            f"tokenize's encoding job alone (read, encode, write Parquet): {tokens / encode_s:,.0f} tokens/s, "
            f"{tokens / encode_s / baseline['tokens_per_s']:.2f}x bare"
        )
    print(f"load average (1 min) before the run {load_before:.1f}, after {os.getloadavg()[0]:.1f}, on {cores} cores")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"tokens": tokens, "stages": stages, "bare": bare, "ratio": ratio}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
