"""Airflow on this machine, with S3 served by a moto server that lives as long as the command.

    python -m local_platform.airflow_runner run [--corpus C] [--set section.key=value ...]   (make run)
    python -m local_platform.airflow_runner ui                                               (make airflow)

`run` executes the whole DAG once with `airflow dags test` and prints where the record went, the
final validation loss and the generated sample (run_command.py). `ui` starts `airflow standalone`
(API server with the UI, scheduler, DAG processor, triggerer) on http://127.0.0.1:8080 so runs can
be triggered from the form and watched (standalone.py). Airflow's home is airflow_home/ in the
checkout (SQLite, airflow_home.py). This module reads the command line and refuses, before Airflow
starts, what the run could not do. The person running `run` is the deployer: its --corpus and the
deployment settings of its --set become the DAG's own (deployment_file.py).
"""

from __future__ import annotations

import argparse
import copy
import sys

from include import preflight
from include.schedule import cron_timetable
from local_platform import deployment_file, run_command, standalone
from local_platform.command_settings import add_settings_arguments, add_verbose_argument, settings
from pipeline import corpus_files
from pipeline.config import PipelineConfig
from pipeline.config_files import defaults_path, load_config, read_yaml
from pipeline.errors import PipelineError, name_some
from pipeline.overrides import apply_overrides
from spark_jobs.text import corpus


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("run", "ui"))
    parser.add_argument("--corpus", help="run: corpus path, glob or URI (empty: the one in pipeline.yaml)")
    add_settings_arguments(parser, help_prefix="run: ")
    add_verbose_argument(parser, help_prefix="run: ")
    return parser.parse_args(argv)


def check_target(overrides: list[str]) -> None:
    """Refuse target emr before validation (whose complaints about an emr config, such as its
    file:// lake, would miss the point)."""
    defaults = read_yaml(defaults_path())
    target = apply_overrides(copy.deepcopy(defaults), overrides).get("target")
    if target == "emr":  # any other value than local is the config model's to name
        origin = defaults_path() if target == defaults.get("target") else "SET"
        raise PipelineError(
            f"target: {target!r} (from {origin}): `make run` and `make airflow` run the DAG with "
            "target 'local', their S3 a moto server on this machine; run target 'emr' from an Airflow with "
            "an AWS connection (README: Running on AWS EMR)"
        )


def warn_unusable_corpus(config: PipelineConfig) -> None:
    """Say so when the default corpus would fail a run: the UI still starts, for runs that name
    another corpus in the trigger form."""
    try:
        corpus.check_fits(config, corpus_files.corpus_files(config))
    except PipelineError as error:
        print(
            f"WARNING {error}: a run needs another corpus in the trigger form, or {defaults_path().name}'s",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        overrides = settings(args)
        check_target(overrides)
        # Checked here too so that a bad value stops before Airflow starts; the DAG checks it again.
        # In the DAG's order (include/trigger_form.py): the form's corpus, then the overrides.
        config = load_config(overrides=([{"corpus": args.corpus}] if args.corpus else []) + overrides)
        if config.schedule is not None:
            cron_timetable(config.schedule)  # the DAG would not parse
        on_s3 = [uri for uri in config.corpus if uri.startswith("s3://")]
        if on_s3:
            raise PipelineError(
                f"corpus {name_some(on_s3)}: the S3 of `make run` and `make airflow` is a moto server on this machine "
                "that starts empty; give a local path or file:// URI, or read the corpus from S3 with the local "
                "runner (`.venv/bin/python -m local_platform.stage_runner`, with your AWS credentials) or target 'emr'"
            )
        # The DAG's first task checks all again; `make airflow` leaves the corpus, memory and disk
        # checks to it, since each triggered run's form may change the corpus, the model and the windows.
        if args.command == "ui":
            warn_unusable_corpus(config)
            return standalone.ui(config)
        checked = preflight.check_run(config, corpus_files.corpus_files(config))
        if checked.exposure:
            print(f"WARNING {checked.exposure}", file=sys.stderr)
        deployers, runs = deployment_file.split(overrides)
        return run_command.run(config, args.corpus, deployers, runs, args.verbose)
    except PipelineError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
