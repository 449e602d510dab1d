"""The check before a run starts, one for every way to start one (the DAG's validate_config, the
stage runner, `make run`): the corpus fits the windows and the validation split, the run's windows
and TFRecords fit the lake (on EMR each core node's volume), and training fits a worker's memory on
this machine (target local; for EMR include/emr_tasks.py checks it against the core node type),
and local training can keep its TensorFlow workers off the network (include/local_spark.py).

The caller lists the corpus (from the lake, or through an S3 hook on EMR) and reports the errors:
each raises PipelineError (ConfigError) naming the settings to change.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from include import local_spark
from pipeline import disk_room
from pipeline import stages as stage_table
from pipeline.config import PipelineConfig
from spark_jobs.text import corpus
from spark_jobs.training import memory


@dataclass(frozen=True)
class RunCheck:
    """What the checks found: the corpus's files and bytes, a local training worker's memory
    estimate (memory.describe words it), None where not checked; and the warning of a local run
    that accepts training workers exposed to the network (local.allow_exposed_workers)."""

    corpus_files: int | None = None
    corpus_bytes: int | None = None
    training: dict[str, float] | None = None
    exposure: str | None = None


def check_run(config: PipelineConfig, sizes: dict[str, int] | None, stages: Collection[str] | None = None) -> RunCheck:
    """Check a run of `stages` (default: the whole pipeline) before any Spark or cluster starts.
    `sizes` is the corpus ({URI: bytes}), which only the stage that reads it (tokenize) needs: a
    run without that stage may give None. The corpus and disk checks go with that stage, the memory
    check with the barrier stage and the network check with a contained one (both train; see
    pipeline.stages)."""
    chosen = stage_table.select(stages)
    found = RunCheck()
    if any(stage.reads_corpus for stage in chosen):
        if sizes is None:
            raise ValueError("a run with tokenize needs the corpus's sizes")
        corpus.check_fits(config, sizes)
        if config.target == "emr":
            disk_room.check_core_node_room(config, sizes)
        else:
            disk_room.check_lake_room(config, sizes)
        found = RunCheck(corpus_files=len(sizes), corpus_bytes=sum(sizes.values()))
    if config.target == "local" and any(stage.barrier for stage in chosen):
        found = replace(found, training=memory.check_local_training(config))
    if config.target == "local" and any(stage.contained for stage in chosen):
        found = replace(found, exposure=local_spark.exposure_warning(config))
    return found
