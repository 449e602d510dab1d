"""Preprocessing throughput: the four Spark stages on ~20 MB of text against bare HF `tokenizers`.

    .venv/bin/python -m benchmarks.preprocess [--mb 20[,60]] [--files N] [--set section.key=value ...]

Builds a corpus of tinyshakespeare repeated to --mb megabytes (one file, or --files files cut at
line ends: a corpus of many small documents), runs tokenize, window,
positional_embed and export through spark-submit on local[cores] (include/local_spark.submit_stage),
and prints tokens/s per stage and end to end. Each stage's time is split into the body (the
stage's own work, duration_s of stats/{stage}.json) and start-up plus shut-down (JVM, imports,
SparkContext, stopping Spark: the rest of spark-submit's wall time). Then it encodes the same
text with the run's tokenizer.json on the same number of cores (RAYON_NUM_THREADS) with
encode_batch and encode_batch_fast, fed the same ~1 KB chunks the stage uses and, separately,
line by line, a few MB at a time (the Encodings of a large corpus would not fit in memory);
the fastest is the baseline. Goal: end to end (bodies) >= 0.7x the baseline.
With two sizes (--mb 20,60) it also prints what the extra text cost: the rate the pipeline tends
to on large corpora.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from include import class_archive
from include.local_spark import submit_stage
from include.spark_submit import package_code
from pipeline import lake, run_folder
from pipeline.config import SHARED_CORPUS
from pipeline.config_files import load_config
from pipeline.overrides import add_set_argument
from pipeline.stages import PREPROCESSING_STAGES
from spark_jobs.text import bpe


def build_corpus(folder: Path, megabytes: float, files: int) -> tuple[str, str, str]:
    """tinyshakespeare repeated to about `megabytes`, as one file or cut at line ends into `files`
    files; returns (corpus path or glob, its name, the text)."""
    text = SHARED_CORPUS.read_text(encoding="utf-8")
    copies = max(1, round(megabytes * 1_000_000 / len(text.encode("utf-8"))))
    text *= copies
    name = f"shakespeare-x{copies}"
    if files == 1:
        path = folder / f"{name}.txt"
        path.write_text(text, encoding="utf-8")
        return str(path), path.name, text
    name = f"{name} in {files} files"
    corpus = folder / "corpus"
    corpus.mkdir()
    lines = text.splitlines(keepends=True)
    per_file = -(-len(lines) // files)
    for index in range(files):
        (corpus / f"part-{index:05d}.txt").write_text(
            "".join(lines[index * per_file : (index + 1) * per_file]), encoding="utf-8"
        )
    return str(corpus / "*.txt"), name, text


BARE_BATCH_CHARS = 4_000_000  # text per encode call: a large corpus's Encodings all at once would not fit in memory


def batches(pieces: Iterator[str], chars: int) -> Iterator[list[str]]:
    """The pieces in consecutive lists of about `chars` characters."""
    batch, size = [], 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece)
        if size >= chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encode_all(tokenizer, method: str, pieces: Iterator[str]) -> tuple[float, int]:
    """Seconds spent encoding and tokens made, one batch at a time (each batch's Encodings dropped)."""
    seconds, tokens = 0.0, 0
    for batch in batches(pieces, BARE_BATCH_CHARS):
        started = time.perf_counter()
        encodings = getattr(tokenizer, method)(batch, add_special_tokens=False)
        seconds += time.perf_counter() - started
        tokens += sum(len(encoding.ids) for encoding in encodings)
    return seconds, tokens


def bare_tokenizer(tokenizer_json: str, text: str, cores: int, repeats: int) -> dict:
    """Best-of-`repeats` throughput of encode_batch and encode_batch_fast, on ~1 KB chunks and on lines."""
    os.environ["RAYON_NUM_THREADS"] = str(cores)  # read when tokenizers first starts its thread pool
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    inputs = {
        f"~{bpe.ENCODE_CHUNK_CHARS}-char chunks": lambda: bpe.chunks(text, bpe.ENCODE_CHUNK_CHARS),
        "lines": lambda: iter(io.StringIO(text)),
    }
    methods = [name for name in ("encode_batch", "encode_batch_fast") if hasattr(tokenizer, name)]
    results = {}
    for input_name, pieces in inputs.items():
        for method in methods:
            best, tokens = min(encode_all(tokenizer, method, pieces()) for _ in range(repeats))
            results[f"{method}, {input_name}"] = {"seconds": best, "tokens": tokens, "tokens_per_s": tokens / best}
    return results


def measure(megabytes: float, files: int, overrides: list[str], cores: int, repeats: int, keep: bool) -> dict:
    """Run the four stages on a corpus of `megabytes` and the bare tokenizer on the same text."""
    scratch = Path(tempfile.mkdtemp(prefix="gpt-pipeline-bench-"))
    try:
        corpus, name, text = build_corpus(scratch, megabytes, files)
        config = load_config(overrides=[{"corpus": corpus, "lake": str(scratch / "lake")}] + overrides)
        run = run_folder.create_run(config, "bench")
        code = scratch / "code"
        package_code(code)
        stages = {}
        for stage in PREPROCESSING_STAGES:
            started = time.perf_counter()
            submit_stage(stage, config, run, code)
            wall = time.perf_counter() - started
            stats = lake.read_json(run_folder.stats_uri(run, stage))
            stages[stage] = {
                "wall_s": wall,
                "body_s": stats["duration_s"],
                "overhead_s": wall - stats["duration_s"],
                "timings": stats.get("timings", {}),
            }
        tokenize = lake.read_json(run_folder.stats_uri(run, "tokenize"))
        tokens = sum(split["tokens"] for split in tokenize["splits"].values())
        tokenizer_json = lake.read_text(lake.join(run, run_folder.TOKENIZER_PATH))
        bare = bare_tokenizer(tokenizer_json, text, cores, repeats)
        return {"corpus": name, "mb": len(text.encode("utf-8")) / 1e6, "tokens": tokens, "stages": stages, "bare": bare}
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def baseline(result: dict) -> tuple[str, dict]:
    """The fastest bare-tokenizer way."""
    return max(result["bare"].items(), key=lambda item: item[1]["tokens_per_s"])


def report(result: dict, cores: int) -> float:
    """Print one corpus size's figures; returns the end-to-end ratio to the bare tokenizer."""
    tokens, stages = result["tokens"], result["stages"]
    body = sum(stage["body_s"] for stage in stages.values())
    wall = sum(stage["wall_s"] for stage in stages.values())
    baseline_name, best = baseline(result)
    print(f"corpus: {result['corpus']}, {result['mb']:.1f} MB, {tokens:,} tokens; local[{cores}]")
    print(f"{'stage':<18}{'start/stop s':>12}{'body s':>10}{'tokens/s (body)':>18}")
    for name, stage in stages.items():
        print(f"{name:<18}{stage['overhead_s']:>12.2f}{stage['body_s']:>10.2f}{tokens / stage['body_s']:>18,.0f}")
        print(" " * 20 + ", ".join(f"{key} {value:.2f}" for key, value in stage["timings"].items()))
    print(f"{'end to end':<18}{wall - body:>12.2f}{body:>10.2f}{tokens / body:>18,.0f}")
    print(f"end to end with start-up and shut-down: {tokens / wall:,.0f} tokens/s ({wall:.1f} s)")
    for name, bare in result["bare"].items():
        print(f"bare {name}: {bare['tokens_per_s']:,.0f} tokens/s ({bare['seconds']:.2f} s)")
    ratio = tokens / body / best["tokens_per_s"]
    print(
        f"ratio end to end / bare ({baseline_name}): {ratio:.2f} (goal >= 0.7: {'met' if ratio >= 0.7 else 'not met'})"
    )
    encode_s = stages["tokenize"]["timings"]["encode_s"]
    print(
        f"tokenize's encoding job alone (read, encode, write Parquet): {tokens / encode_s:,.0f} tokens/s, "
        f"{tokens / encode_s / best['tokens_per_s']:.2f}x bare"
    )
    return ratio


def report_marginal(small: dict, large: dict) -> None:
    """What the extra text of the larger corpus cost, stage by stage: the rate the pipeline tends to
    on large corpora, where the fixed costs (start-up of Python workers and Spark SQL, Word2Vec on
    its capped sample) no longer count."""
    extra = large["tokens"] - small["tokens"]
    cost = {name: large["stages"][name]["body_s"] - small["stages"][name]["body_s"] for name in PREPROCESSING_STAGES}
    bpe = large["stages"]["tokenize"]["timings"]["train_bpe_s"] - small["stages"]["tokenize"]["timings"]["train_bpe_s"]
    _, best = baseline(large)
    print(
        f"\nthe extra {large['mb'] - small['mb']:.0f} MB ({extra:,} tokens) cost: "
        + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in cost.items())
        + f"; BPE training is {bpe:.2f} s of tokenize's (its sample grows up to tokenizer.train_sample_mb)"
    )
    total = sum(cost.values())
    for label, seconds in (("all", total), ("without BPE training", total - bpe)):
        rate = extra / seconds
        print(f"marginal end to end, {label}: {rate:,.0f} tokens/s, {rate / best['tokens_per_s']:.2f}x bare")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--mb",
        default="20",
        help="corpus size in MB (default 20); several, comma-separated, also print the marginal rate",
    )
    parser.add_argument(
        "--files", type=int, default=1, help="cut the corpus into this many files at line ends (default 1)"
    )
    add_set_argument(parser)
    parser.add_argument("--repeats", type=int, default=3, help="bare tokenizer runs (best is kept)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders (corpus and run folder)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    sizes = sorted(float(size) for size in args.mb.split(","))
    cores = os.cpu_count() or 2  # local_spark's local[N]; the tokenizer gets as many threads
    load_before = os.getloadavg()[0]  # other work on the machine skews every figure
    unrecorded = class_archive.current_archive() is None
    if args.files < 1:
        parser.error("--files must be at least 1")
    results = [measure(size, args.files, args.overrides, cores, args.repeats, args.keep) for size in sizes]
    for index, result in enumerate(results):
        if index:
            print()
        result["ratio"] = report(result, cores)
    if len(results) > 1:
        report_marginal(results[0], results[-1])
    print(f"load average (1 min) before the run {load_before:.1f}, after {os.getloadavg()[0]:.1f}, on {cores} cores")
    if unrecorded:
        print(
            "the JVM class archive was recorded during this run: the first stage's figures include "
            "the recording; run again for the usual ones"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
