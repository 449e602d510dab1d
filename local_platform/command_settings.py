"""The arguments the local commands that run the DAG share (`make run`, `make rehearse`): the
run's settings, from --set and from make's SET, and --verbose."""

from __future__ import annotations

import argparse
import os
import shlex

from pipeline.config import ConfigError
from pipeline.overrides import add_set_argument


def add_verbose_argument(parser: argparse.ArgumentParser, help_prefix: str = "") -> None:
    parser.add_argument(
        "--verbose",
        action="store_true",
        help=f"{help_prefix}all of Airflow's, Spark's and TensorFlow's output on the console too, not only in the log",
    )


def add_settings_arguments(parser: argparse.ArgumentParser, help_prefix: str = "") -> None:
    """--set, repeatable, and make's way in: SET reaches the command through the environment, as
    typed, named by --set-from-env (see settings)."""
    add_set_argument(parser, help_prefix=help_prefix)
    parser.add_argument(
        "--set-from-env",
        metavar="NAME",
        help=argparse.SUPPRESS,  # the settings in variable NAME, split as a shell would, each one --set
    )


def settings(args: argparse.Namespace) -> list[str]:
    """The settings of --set-from-env's variable, then those of each --set."""
    from_env = args.set_from_env
    return (split_overrides(os.environ.get(from_env, ""), from_env) if from_env else []) + args.overrides


def split_overrides(words: str, name: str = "SET") -> list[str]:
    """make's SET (environment variable `name`) as settings, one per --set:
    `train.max_steps=50 generate.prompt='To be'` holds two."""
    try:
        return shlex.split(words)
    except ValueError as error:  # an unmatched quote
        raise ConfigError(
            f"{name} {words!r}: {error}; put a value holding a quote in the other kind of quotes, "
            'as in generate.prompt="O\'er the hill"'
        ) from None
