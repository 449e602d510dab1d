"""The table of the pipeline's stages: each stage's name, its spark-submit application file, the
stages whose outputs it reads, the settings that shape its outputs, the files of the run folder it
reads and writes, and what sets it apart where it runs; and what depends on what.

Re-running a stage, or changing a setting of an existing run, makes the stages after it stale;
their completion markers are removed so that nothing stale counts as done.

No other module tells stages apart by their names: what the targets do differently for a stage
(its Spark settings, a private network namespace, an EMR step's executors and time limit, the
checks before a run) they read from its row here.

The EMR target also runs the cluster check (CLUSTER_CHECK), a step before the first stage that
makes nothing a stage reads: EMR_STEPS are the steps of an EMR run, in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pipeline import run_folder


@dataclass(frozen=True)
class Stage:
    """One stage: `app_file` in spark_jobs/; `inputs`, the stages whose outputs it reads;
    `settings`, config paths (a section stands for all its keys) whose value its outputs depend
    on, besides its inputs. The rest (run_name, target, lake, s3, schedule, local, emr, alerts) changes
    where and how a run goes, not what it makes.

    `reads` and `writes`: the files and folders of the run folder (pipeline.run_folder's paths) it
    reads from its inputs' outputs and makes, besides what every stage has: config.json, which it
    reads, its inputs' stats, and its own stats, error, progress and Spark event log.

    What sets a stage apart where it runs:
    `reads_corpus`: it reads the corpus; the corpus, and the room its outputs need, are checked before
      a run that includes it (include/preflight.py).
    `barrier`: it runs train.num_workers tasks of a Spark barrier stage, one per node (the TensorFlow
      training workers, or the cluster check's probes of the nodes they will run on): dynamic
      allocation off and the failed stage retried whole (include/spark_submit.py), on EMR one executor
      owning a whole core node per worker (include/emr_steps.py), and locally a training worker's
      memory is checked before a run that includes it (include/preflight.py).
    `contained`: locally it runs in a private network namespace that holds only loopback
      (include/local_spark.py, docs/network.md), since its TensorFlow workers' gRPC servers listen on
      every interface and authenticate no one; it must need nothing but the local run folder (tokenize,
      which may read an s3:// corpus, could not run there).
    `whole_node_executors`: on EMR each of its executors owns a whole core node, most of whose memory
      is left to the executor's Python workers (include/emr_steps.py); the others get Spark's sizes.
    `reports_progress`: while it runs it keeps a progress file in the run folder (run_folder.progress_path),
      which the EMR target's task logs at each poke of its step; a stage without one costs no poke a
      read of the run folder.
    `time_limit`: what its EMR step's time limit is (include/emr_steps.py): "fixed", emr.step_timeout_minutes;
      "training_budget", that plus the training's steps and evaluation batches at emr.train_seconds_per_step;
      "short", a few minutes whatever the settings.
    """

    name: str
    app_file: str
    inputs: tuple[str, ...]
    settings: tuple[str, ...]
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    reads_corpus: bool = False
    barrier: bool = False
    contained: bool = False
    whole_node_executors: bool = False
    reports_progress: bool = False
    time_limit: Literal["fixed", "training_budget", "short"] = "fixed"


# In pipeline order: a stage's inputs come before it.
STAGES: tuple[Stage, ...] = (
    Stage(
        "tokenize",
        "tokenize_corpus.py",
        inputs=(),
        settings=("corpus", "tokenizer", "data.val_fraction", "data.val_split", "data.bad_files"),
        writes=(run_folder.TOKENIZER_PATH, run_folder.TOKENS_FOLDER),
        reads_corpus=True,
        whole_node_executors=True,
    ),
    Stage(
        "window",
        "window.py",
        inputs=("tokenize",),
        settings=("data.block_size", "data.stride", "data.pack_documents"),
        reads=(run_folder.TOKENS_FOLDER, run_folder.TOKENIZER_PATH),  # the tokenizer to pack documents
        writes=(run_folder.WINDOWS_FOLDER,),
        whole_node_executors=True,
    ),
    Stage(
        "positional_embed",
        "positional_embed.py",
        inputs=("tokenize", "window"),
        settings=("embedding",),
        reads=(run_folder.WINDOWS_FOLDER,),
        writes=(run_folder.TOKEN_VECTORS_PATH, run_folder.POSITIONS_PATH, run_folder.EMBEDDINGS_META_PATH),
        whole_node_executors=True,
    ),
    Stage(
        "export",
        "export_tfrecord.py",
        inputs=("tokenize", "window"),
        settings=("data.shards",),
        reads=(run_folder.WINDOWS_FOLDER,),
        writes=(run_folder.TFRECORDS_FOLDER, run_folder.MANIFEST_PATH),
        whole_node_executors=True,
    ),
    Stage(
        "train",
        "train.py",
        inputs=("tokenize", "positional_embed", "export"),
        settings=("model", "train"),
        reads=(
            run_folder.MANIFEST_PATH,
            run_folder.TFRECORDS_FOLDER,
            run_folder.TOKEN_VECTORS_PATH,
            run_folder.POSITIONS_PATH,
            run_folder.TOKENIZER_PATH,
        ),
        # checkpoints/: its backups, which an unfinished attempt resumes from, until it completes.
        writes=(
            run_folder.MODEL_FOLDER,
            run_folder.MODEL_HF_PATH,
            run_folder.MODEL_SAVED_MODEL_PATH,
            run_folder.EPOCHS_CSV_PATH,
            run_folder.STEPS_CSV_PATH,
            run_folder.TENSORBOARD_FOLDER,
            run_folder.BACKUP_FOLDER,
        ),
        barrier=True,
        contained=True,
        whole_node_executors=True,
        reports_progress=True,
        time_limit="training_budget",
    ),
    Stage(
        "generate",
        "generate.py",
        inputs=("train",),
        settings=("generate",),
        reads=(run_folder.MODEL_FOLDER,),
        writes=(run_folder.SAMPLES_PATH, run_folder.TENSORBOARD_FOLDER),
    ),
)
STAGE_NAMES: tuple[str, ...] = tuple(stage.name for stage in STAGES)
# The stage that trains the model: the barrier stage, of which there is one.
TRAINING_STAGE: str = next(stage.name for stage in STAGES if stage.barrier)
# The Spark stages before training, which make its data.
PREPROCESSING_STAGES: tuple[str, ...] = STAGE_NAMES[: STAGE_NAMES.index(TRAINING_STAGE)]
# The EMR target's first step, on the executors the train step will ask for: the nodes' Python
# packages, each training worker's own address, YARN's largest container and the run folder on S3
# (spark_jobs/smoke.py). It fails the run before tokenize when the cluster cannot carry it; the
# local target, whose Spark is this machine's, does not run it.
CLUSTER_CHECK = Stage(
    "smoke",
    "smoke.py",
    inputs=(),
    settings=(),
    writes=(run_folder.SMOKE_PROBE_FOLDER,),  # a probe object per node, removed again
    barrier=True,
    time_limit="short",
)
EMR_STEPS: tuple[Stage, ...] = (CLUSTER_CHECK, *STAGES)
EMR_STEP_NAMES: tuple[str, ...] = tuple(stage.name for stage in EMR_STEPS)
_BY_NAME = {stage.name: stage for stage in EMR_STEPS}


def by_name(name: str) -> Stage:
    """The stage (or the cluster check) of that name, or a ValueError naming the stages there are."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; stages are {', '.join(STAGE_NAMES)}") from None


def select(names: Iterable[str] | None = None) -> tuple[Stage, ...]:
    """The stages of those names (every stage for None), in pipeline order; a ValueError for a
    name that is no stage's."""
    if names is None:
        return STAGES
    chosen = {by_name(name).name for name in names}
    return tuple(stage for stage in STAGES if stage.name in chosen)


def downstream(stage: str) -> list[str]:
    """The stages that read `stage`'s outputs, directly or through others, in pipeline order."""
    found = {stage}
    for other in STAGES:  # in pipeline order: inputs come first
        if found.intersection(other.inputs):
            found.add(other.name)
    return [name for name in STAGE_NAMES if name in found and name != stage]


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        flat |= flatten(value, f"{path}.") if isinstance(value, dict) else {path: value}
    return flat


def changed_settings(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """{setting: (old value, new value)} for every setting whose value differs."""
    before, after = flatten(old), flatten(new)
    return {
        path: (before.get(path), after.get(path))
        for path in sorted(before | after)
        if before.get(path) != after.get(path)
    }


def stale_stages(changed: list[str]) -> list[str]:
    """The stages whose outputs the changed settings make stale, with those after them."""
    stale = set()
    for stage in STAGES:
        if any(path == setting or path.startswith(f"{setting}.") for path in changed for setting in stage.settings):
            stale |= {stage.name, *downstream(stage.name)}
    return [name for name in STAGE_NAMES if name in stale]
