"""What the local start-up and shut-down tricks save: the six stage applications of a run timed
through spark-submit, with and without each.

    .venv/bin/python -m benchmarks.spark_startup [--kb 60] [--repeats 3] [--variants all,...]

Builds a corpus of the first --kb kB of tinyshakespeare, and runs the six stages (tokenize, window,
positional_embed, export, a short train, generate) in a fresh run folder per repetition, each with
spark-submit as include/local_spark.submit_stage does, timing every application's wall time.
Variants:

- all: as `make run` runs them (the stages' shared class-data-sharing archive, include/class_archive.py,
  and stop_spark's two tricks: the barrier timer cancelled, pyspark's accumulator server detached);
- no_archive: without the class archive (no JVM option);
- keep_accumulator_server: stop_spark without detaching the accumulator server (the barrier timer
  still cancelled): what the detaching saves;
- plain_stop: spark.stop() alone, run once: whether the train stage's spark-submit exits at all
  without the barrier timer cancelled. Every application runs under --timeout; one that does not
  end by then is killed and shown as a timeout (and the stages after it do not run).

The archive is recorded in a temporary folder by a first run of the six (its time shown apart;
its first stage records it), so the virtual environment's own archive is neither used nor touched. The variants of
stop_spark are made in the packaged code only (spark_jobs/spark/stage_app.py in the zip spark-submit
ships gets a stop_spark of its own appended), not in the repository's. Prints a table of medians
per stage and the sum over the six applications, and the load average: on a shared machine the
figures are as noisy as its neighbours are busy.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

from include import class_archive
from include.local_spark import local_argv, spark_env
from include.spark_submit import LIBRARY_ZIP, package_code
from pipeline import lake, run_folder
from pipeline.config import SHARED_CORPUS
from pipeline.config_files import load_config
from pipeline.stages import STAGE_NAMES

SMALL = [
    "tokenizer.vocab_size=512",
    "data.block_size=32",
    "data.stride=16",
    "embedding.dim=32",
    "embedding.word2vec.max_sentences=2000",
    "model.n_layer=1",
    "model.n_head=2",
    "train.batch_size=16",
    "train.max_steps=4",
    "train.warmup_steps=1",
    "train.eval_interval=4",
    "train.eval_batches=1",
    "train.log_interval=2",
    "train.checkpoint_interval=4",
    "generate.max_new_tokens=5",
]

# stop_spark variants, appended to the packaged spark_jobs/spark/stage_app.py: the later definition is
# the one run_stage calls. Every variant's stop_spark is then timed, in the driver, by TIMED_STOP.
STOP_VARIANTS = {
    "keep_accumulator_server": """

def stop_spark(spark) -> None:  # benchmark: the barrier timer cancelled, the accumulator server waited for
    barrier = getattr(getattr(spark.sparkContext._jvm.org.apache.spark, "BarrierTaskContext$"), "MODULE$")
    getattr(barrier, "org$apache$spark$BarrierTaskContext$$timer")().cancel()
    spark.stop()
""",
    "plain_stop": """

def stop_spark(spark) -> None:  # benchmark: pyspark's own stop alone
    spark.stop()
""",
}
TIMED_STOP = """

_timed_stop_spark = stop_spark


def stop_spark(spark) -> None:  # benchmark: the variant's stop_spark, timed
    started = time.perf_counter()
    _timed_stop_spark(spark)
    print(f"BENCHMARK stop_spark_s {time.perf_counter() - started:.3f}", file=sys.stderr, flush=True)
"""
VARIANTS = ("plain_stop", "all", "no_archive", "keep_accumulator_server")


def corpus(folder: Path, kilobytes: int) -> Path:
    text = SHARED_CORPUS.read_text(encoding="utf-8")[: kilobytes * 1000]
    path = folder / "corpus.txt"
    path.write_text(text[: text.rfind("\n") + 1], encoding="utf-8")
    return path


def package(folder: Path, variant: str) -> Path:
    """The packaged code, its stop_spark replaced for a stop variant, and timed."""
    package_code(folder)
    archive = folder / LIBRARY_ZIP
    with zipfile.ZipFile(archive) as zipped:
        files = {name: zipped.read(name) for name in zipped.namelist()}
    files["spark_jobs/spark/stage_app.py"] += (STOP_VARIANTS.get(variant, "") + TIMED_STOP).encode()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for name, data in files.items():
            zipped.writestr(name, data)
    return folder


def submit(stage: str, config, run: str, code: Path, jvm_options: tuple[str, ...], timeout: float, log: Path) -> float:
    """spark-submit's wall time in seconds; None when it was still running after `timeout` (killed)."""
    argv = local_argv(stage, config, run, code)
    started = time.perf_counter()
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv, env=spark_env(jvm_options), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return None
        except BaseException:  # in a session of its own: Ctrl-C does not reach it
            os.killpg(process.pid, signal.SIGKILL)
            raise
    if returncode != 0:
        raise RuntimeError(f"{stage} failed with exit code {returncode}: see {log}")
    return time.perf_counter() - started


def run_variant(variant: str, config, run_id: str, work: Path, archives: Path, timeout: float) -> dict:
    """Each stage's wall time and body time (duration_s of its stats) in a fresh run folder."""
    run = run_folder.create_run(config, run_id)
    code = package(work / f"code-{run_id}", variant)
    times = {}
    for stage in STAGE_NAMES:
        log = work / f"{run_id}-{stage}.log"
        if variant == "no_archive":
            wall = submit(stage, config, run, code, (), timeout, log)
        else:
            with class_archive.sharing(stage, archives) as options:
                wall = submit(stage, config, run, code, options, timeout, log)
        stop = [line.split()[-1] for line in log.read_text(errors="replace").splitlines() if "BENCHMARK stop" in line]
        stop_s = float(stop[-1]) if stop else None
        if wall is None:
            times[stage] = {"wall_s": None, "body_s": None, "stop_s": stop_s}
            print(
                f"  {run_id} {stage}: still running after {timeout:.0f} s (stop_spark {stop_s} s), killed", flush=True
            )
            break  # the next stages read what it did not finish
        body = lake.read_json(run_folder.stats_uri(run, stage))["duration_s"]
        times[stage] = {"wall_s": round(wall, 2), "body_s": body, "stop_s": stop_s}
        print(f"  {run_id} {stage}: {wall:.2f} s (body {body:.2f} s, stop_spark {stop_s} s)", flush=True)
    return times


def median(values: list) -> float | None:
    values = [value for value in values if value is not None]
    return round(statistics.median(values), 2) if values else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kb", type=int, default=60, help="corpus size: the first N kB of tinyshakespeare")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--timeout", type=float, default=240, help="seconds after which an application is killed")
    parser.add_argument("--json", help="also write the figures to this file (after every run)")
    parser.add_argument("--archives", help="a folder of class archives to use and record in (default: a new one)")
    args = parser.parse_args(argv)
    variants = [name.strip() for name in args.variants.split(",") if name.strip()]
    print(f"load average before: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpt-pipeline-startup-") as folder:
        work = Path(folder)
        config = load_config(overrides=[{"corpus": str(corpus(work, args.kb)), "lake": str(work / "lake")}, *SMALL])
        archives = Path(args.archives) if args.archives else work / "archives"
        print("recording the class archive (a first run of the stages):", flush=True)
        recording = run_variant("all", config, "recording", work, archives, args.timeout)
        results = {variant: [] for variant in variants}

        def save() -> None:
            if args.json:
                Path(args.json).write_text(json.dumps({"recording": recording, "runs": results}, indent=1))

        for repeat in range(args.repeats):  # variants interleaved: a busy spell hits them alike
            for variant in variants:
                if variant == "plain_stop" and repeat > 0:
                    continue  # a check that train's spark-submit ends: once is enough if it does not
                run = run_variant(variant, config, f"{variant}-{repeat}", work, archives, args.timeout)
                results[variant].append(run)
                save()
        load = Path("/proc/loadavg").read_text().strip()
    print(f"load average after: {load}")
    table = {
        variant: {
            stage: {
                kind: median([run.get(stage, {}).get(kind) for run in runs]) for kind in ("wall_s", "body_s", "stop_s")
            }
            | {"timeouts": sum(1 for run in runs if stage in run and run[stage]["wall_s"] is None)}
            for stage in STAGE_NAMES
        }
        for variant, runs in results.items()
    }
    print(
        f"\nmedian wall s of {args.repeats} runs (plain_stop: 1) (body s, stop_spark s in brackets); "
        "recording run: first column"
    )
    print(f"{'stage':<18}{'recording':>12}" + "".join(f"{variant:>32}" for variant in variants))
    for stage in STAGE_NAMES:
        cells = [
            f"{figures['wall_s']} ({figures['body_s']}, {figures['stop_s']})"
            + (f" {figures['timeouts']}x timeout" if figures["timeouts"] else "")
            for figures in (table[variant][stage] for variant in variants)
        ]
        print(f"{stage:<18}{recording.get(stage, {}).get('wall_s')!s:>12}" + "".join(f"{cell:>32}" for cell in cells))
    sums = {
        variant: median(
            [
                sum(run[stage]["wall_s"] for stage in STAGE_NAMES)
                if all(run.get(stage, {}).get("wall_s") is not None for stage in STAGE_NAMES)
                else None
                for run in runs
            ]
        )
        for variant, runs in results.items()
    }
    print(f"{'sum of 6':<18}{'':>12}" + "".join(f"{sums[variant]!s:>32}" for variant in variants))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"recording": recording, "runs": results, "medians": table, "sums": sums, "load": load}, indent=1
            )
        )


if __name__ == "__main__":
    main()
