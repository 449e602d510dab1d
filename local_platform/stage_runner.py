"""Run stages with spark-submit on this machine (target: local), without Airflow.

`python -m local_platform.stage_runner` runs the preprocessing and training stages in order on a
corpus (or the stages named, in an existing run folder) and prints where the outputs are.
"""

from __future__ import annotations

import argparse
import itertools
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path

from include import locks, preflight
from include.local_spark import StageFailed, headline, submit_stage
from include.spark_submit import packaged_code
from pipeline import corpus_files, lake, run_folder
from pipeline.config import ConfigError, PipelineConfig, to_uri
from pipeline.config_files import defaults_path, load_config, read_yaml, validate
from pipeline.errors import PipelineError
from pipeline.overrides import add_set_argument, apply_overrides
from pipeline.stages import STAGE_NAMES, by_name, select


def describe(stage: str, stats: dict) -> list[str]:
    """Where a completed stage's outputs are and their counts, from its stats file; for a stage
    without outputs there (train, generate), its headline figures."""
    lines = [f"  {stage} ({stats.get('duration_s', '?')} s)"]
    lines += [f"    {name}: {uri}" for name, uri in stats.get("outputs", {}).items()]
    for split, counts in stats.get("splits", {}).items():
        lines.append(f"    {split}: " + ", ".join(f"{key} {figure(value)}" for key, value in counts.items()))
    if "outputs" not in stats:
        figures = {key: value for key, value in headline(stats).items() if key not in ("stage", "duration_s")}
        lines.append("    " + ", ".join(f"{key} {figure(value)}" for key, value in figures.items()))
    return lines


def figure(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"


def run_pipeline(config: PipelineConfig, run_id: str, stages: tuple[str, ...] | None = None) -> str:
    stages = STAGE_NAMES if stages is None else stages
    run_dir = run_folder.create_run(config, run_id)
    with packaged_code() as code_dir:
        for stage in stages:
            print(f"== {stage}", flush=True)
            submit_stage(stage, config, run_dir, code_dir)
    return run_dir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML defaults (default: include/config/pipeline.yaml)")
    parser.add_argument("--corpus", help="corpus path, glob or URI (overrides the config's corpus)")
    add_set_argument(parser)
    parser.add_argument(
        "--run-id",
        type=run_id_argument,
        help="run folder name (default: {run_name}-{UTC timestamp}); an existing run keeps its settings, "
        "--corpus and --set change them",
    )
    parser.add_argument(
        "--stages",
        default=",".join(STAGE_NAMES),
        help="comma-separated stages to run; they run in pipeline order (default: all)",
    )
    return parser.parse_args(argv)


def run_id_argument(text: str) -> str | None:
    """--run-id as the run folder's name (run_folder.safe_run_id), which is all the runner uses;
    empty, a new run."""
    return run_folder.safe_run_id(text) if text else None


def chosen_stages(names: str) -> tuple[str, ...]:
    """--stages as stages in pipeline order, whatever order they were named in."""
    named = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in named if name not in STAGE_NAMES]
    if unknown:
        raise ConfigError(f"unknown stage(s) {', '.join(unknown)}; stages are {', '.join(STAGE_NAMES)}")
    if not named:
        raise ConfigError(f"--stages names no stage; stages are {', '.join(STAGE_NAMES)}")
    return tuple(stage for stage in STAGE_NAMES if stage in named)


def new_run_id(config: PipelineConfig, name: str) -> str:
    """`name`, or name-2, name-3, ... when a command started in the same second took it: its folder
    is made here, at once, so that two commands never share one."""
    for number in itertools.count(1):
        run_id = name if number == 1 else f"{name}-{number}"
        folder = Path(lake.local_path(run_folder.run_dir(config, run_id)))
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir()
            return run_id
        except FileExistsError:
            continue


def check_new_run_has_inputs(stages: tuple[str, ...], run_id: str | None) -> None:
    """In a new run folder nothing has completed: every stage's inputs must run too."""
    run = f"run {run_id} does not exist yet" if run_id else "without --run-id the run is new"
    for stage in stages:
        missing = [source for source in by_name(stage).inputs if source not in stages]
        if missing:
            raise ConfigError(
                f"{run}, and stage {stage} reads the outputs of {', '.join(missing)}: "
                f"add {'them' if len(missing) > 1 else 'it'} to --stages, or give the --run-id of a run where "
                f"{'they have' if len(missing) > 1 else 'it has'} completed"
            )


def resolve_config(args: argparse.Namespace) -> PipelineConfig:
    """The defaults with --corpus and --set applied; for an existing --run-id, the run's own
    config.json with them applied, so that re-running a stage keeps the run's settings."""
    # The corpus goes in as a dict so that a glob such as *.txt is not read as YAML.
    overrides = args.overrides + ([{"corpus": args.corpus}] if args.corpus else [])
    if args.run_id:
        existing = existing_run_config(args.config, overrides, args.run_id)
        if existing is not None:  # the overrides are checked against the run's settings, not the defaults
            return validate(apply_overrides(existing, overrides))
    return load_config(args.config, overrides)


def existing_run_config(config_path: str | None, overrides: list, run_id: str) -> dict | None:
    """The config.json of run `run_id`, in the lake the defaults and overrides name, if it exists."""
    settings = apply_overrides(read_yaml(config_path or defaults_path()), overrides)
    try:
        lake_uri = to_uri(str(settings.get("lake") or ""))
    except ValueError:
        return None  # a bad lake: the config model names it
    run = lake.join(run_folder.runs_folder(lake_uri), run_id)
    return run_folder.read_config_data(run) if lake.exists(lake.join(run, run_folder.CONFIG_FILE)) else None


def interrupt(_signum, _frame) -> None:
    """SIGTERM (`kill`, a CI job's time-out) stops the runner as Ctrl-C does: on the way out
    run_spark_submit stops the running stage's spark-submit, and its Python and TensorFlow workers
    follow it, instead of training on as orphans."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        config = resolve_config(args)
        if config.target != "local":
            raise ConfigError(
                f"target is {config.target}: this command runs stages on this machine (target local), "
                "target emr runs from the DAG; to run here, add --set target=local --set lake=lake"
            )
        stages = chosen_stages(args.stages)
        if not (
            args.run_id and lake.exists(lake.join(run_folder.run_dir(config, args.run_id), run_folder.CONFIG_FILE))
        ):
            check_new_run_has_inputs(stages, args.run_id)
        sizes = corpus_files.corpus_files(config) if any(stage.reads_corpus for stage in select(stages)) else None
        if exposed := preflight.check_run(config, sizes, stages).exposure:
            print(f"WARNING {exposed}", file=sys.stderr)
        run_id = args.run_id or new_run_id(config, f"{config.run_name}-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}")
        with locks.run_folder_held(run_folder.run_dir(config, run_id), "python -m local_platform.stage_runner"):
            run_dir = run_pipeline(config, run_id, stages)
    except (PipelineError, StageFailed) as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stopped: the running stage did not complete", file=sys.stderr)
        return 130
    print(f"run folder: {run_dir}")
    for stage in stages:
        print("\n".join(describe(stage, lake.read_json(run_folder.stats_uri(run_dir, stage)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
