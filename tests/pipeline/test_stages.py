"""The stage table (pipeline.stages): the stages in pipeline order, what each reads and writes,
what sets each apart where it runs, and which stages a re-run or a changed setting makes stale."""

from __future__ import annotations

from typing import get_args, get_type_hints

import pytest

from include import record
from pipeline import run_folder, stages
from pipeline.config import REPO_ROOT
from pipeline.stages import (
    CLUSTER_CHECK,
    EMR_STEP_NAMES,
    EMR_STEPS,
    PREPROCESSING_STAGES,
    STAGE_NAMES,
    STAGES,
    TRAINING_STAGE,
    Stage,
)


def test_the_stage_table_covers_the_pipeline_in_order():
    assert STAGE_NAMES == ("tokenize", "window", "positional_embed", "export", "train", "generate")
    assert PREPROCESSING_STAGES == STAGE_NAMES[: STAGE_NAMES.index("train")]
    for position, stage in enumerate(STAGES):
        assert stages.by_name(stage.name) is stage
        assert all(STAGE_NAMES.index(source) < position for source in stage.inputs)
        assert (REPO_ROOT / "spark_jobs" / stage.app_file).is_file()


def test_the_emr_target_checks_its_cluster_first_and_the_local_target_never():
    assert EMR_STEPS == (CLUSTER_CHECK, *STAGES) and EMR_STEP_NAMES == ("smoke", *STAGE_NAMES)
    assert CLUSTER_CHECK.name not in STAGE_NAMES and stages.select() == STAGES  # not a stage of a local run
    assert stages.by_name("smoke") is CLUSTER_CHECK and (REPO_ROOT / "spark_jobs" / CLUSTER_CHECK.app_file).is_file()
    # It runs where training will (a barrier stage of a task per node), reads and makes nothing a stage
    # reads, so no setting or re-run makes it, or anything after it, stale.
    assert CLUSTER_CHECK.barrier and CLUSTER_CHECK.time_limit == "short"
    assert CLUSTER_CHECK.inputs == CLUSTER_CHECK.settings == CLUSTER_CHECK.reads == ()
    assert stages.downstream("smoke") == [] and not any(CLUSTER_CHECK.name in stage.inputs for stage in STAGES)
    assert set(CLUSTER_CHECK.writes) <= RUN_FOLDER_PATHS
    assert all(path.startswith("_") for path in CLUSTER_CHECK.writes)  # hidden from the run folder's readers
    assert TRAINING_STAGE == "train"


def test_an_unknown_stage_is_named_with_the_stages_there_are():
    with pytest.raises(ValueError, match="unknown stage 'tokenise'; stages are tokenize, window, "):
        stages.by_name("tokenise")
    with pytest.raises(ValueError, match="unknown stage 'tokenise'"):
        stages.select(["window", "tokenise"])


def test_stages_are_selected_in_pipeline_order():
    assert stages.select() == stages.select(None) == STAGES
    assert [stage.name for stage in stages.select(["generate", "tokenize", "generate"])] == ["tokenize", "generate"]
    assert stages.select([]) == ()


def marked(field: str) -> list[str]:
    return [stage.name for stage in STAGES if getattr(stage, field)]


def test_what_sets_each_stage_apart_where_it_runs():
    assert marked("reads_corpus") == ["tokenize"]
    assert marked("barrier") == ["train"]
    assert marked("contained") == ["train"]
    assert marked("whole_node_executors") == ["tokenize", "window", "positional_embed", "export", "train"]
    assert [stage.name for stage in STAGES if stage.time_limit == "training_budget"] == ["train"]
    assert {stage.time_limit for stage in STAGES} <= set(get_args(get_type_hints(Stage)["time_limit"]))


def test_the_one_barrier_stage_trains_on_what_the_preprocessing_stages_make():
    (barrier,) = [stage for stage in STAGES if stage.barrier]
    assert barrier.name == TRAINING_STAGE
    # The preprocessing stages: every stage whose outputs training reads, directly or through others.
    assert PREPROCESSING_STAGES == tuple(name for name in STAGE_NAMES if TRAINING_STAGE in stages.downstream(name))
    for stage in STAGES:
        if stage.barrier:  # one TensorFlow worker per executor, each owning a core node; its time grows with training
            assert stage.whole_node_executors and stage.time_limit == "training_budget"
        if stage.contained:
            # The namespace keeps a barrier stage's TensorFlow workers off the network, and holds
            # nothing but loopback: a contained stage reaches no s3:// corpus.
            assert stage.barrier and not stage.reads_corpus


RUN_FOLDER_PATHS = {value for name, value in vars(run_folder).items() if name.isupper() and isinstance(value, str)}
# What a stage writes that no later stage reads and the record does not keep.
UNREAD = {
    run_folder.EMBEDDINGS_META_PATH: "what the embedding tables hold, for whoever looks",
    run_folder.BACKUP_FOLDER: "train's backups, which an unfinished attempt resumes from, removed once it completes",
}


def same_files(path: str, other: str) -> bool:
    """The paths name the same files, or one is a folder holding the other."""
    return path == other or path.startswith(f"{other}/") or other.startswith(f"{path}/")


def test_what_a_stage_reads_and_writes_are_run_folder_paths():
    for stage in STAGES:
        assert stage.writes, stage.name
        assert set(stage.reads) | set(stage.writes) <= RUN_FOLDER_PATHS, stage.name


def test_a_stage_reads_what_its_inputs_write():
    for stage in STAGES:
        for path in stage.reads:
            writers = [
                source
                for source in stage.inputs
                if any(same_files(path, written) for written in stages.by_name(source).writes)
            ]
            assert writers, f"{stage.name} reads {path}, which none of its inputs ({', '.join(stage.inputs)}) writes"


def test_every_output_is_read_by_a_later_stage_or_kept_in_the_record():
    kept = [*record.RECORD_FILES, *(folder.rstrip("/") for folder in record.RECORD_FOLDERS)]
    for position, stage in enumerate(STAGES):
        later = [path for other in STAGES[position + 1 :] for path in other.reads]
        for path in stage.writes:
            read = any(same_files(path, other) for other in later)
            recorded = any(path == folder or path.startswith(f"{folder}/") for folder in kept)
            assert read or recorded or path in UNREAD, f"{stage.name} writes {path}, which nothing reads or keeps"
            assert not (path in UNREAD and (read or recorded)), f"{path} is read or kept: not UNREAD"


def readme_stage_table() -> dict[str, tuple[str, str]]:
    """{stage: (its reads column, its writes column)} of the README's stage table."""
    rows = {}
    for line in (REPO_ROOT / "README.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].strip("`") in STAGE_NAMES:
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def test_the_readmes_stage_table_names_what_each_stage_reads_and_writes():
    table = readme_stage_table()
    assert list(table) == list(STAGE_NAMES)
    for stage in STAGES:
        reads, writes = table[stage.name]
        assert ("corpus files" in reads) == stage.reads_corpus, stage.name
        for column, paths in ((reads, stage.reads), (writes, stage.writes)):
            for path in paths:
                # the path itself, something in it, or the folder that holds it
                names = (f"`{path}`", f"`{path}/", f"`{path.split('/')[0]}/`")
                assert any(name in column for name in names), f"README: {stage.name} {path} not in {column!r}"


def test_downstream_stages():
    assert stages.downstream("tokenize") == ["window", "positional_embed", "export", "train", "generate"]
    assert stages.downstream("positional_embed") == ["train", "generate"]  # export does not read embeddings
    assert stages.downstream("generate") == []


def test_changed_settings_make_their_stages_and_later_ones_stale():
    old = {"data": {"block_size": 128, "stride": 64}, "train": {"max_steps": 600}, "run_name": "a"}
    new = {"data": {"block_size": 128, "stride": 32}, "train": {"max_steps": 900}, "run_name": "b"}
    changed = stages.changed_settings(old, new)
    assert changed == {"data.stride": (64, 32), "run_name": ("a", "b"), "train.max_steps": (600, 900)}
    assert stages.stale_stages(list(changed)) == ["window", "positional_embed", "export", "train", "generate"]
    assert stages.stale_stages(["train.max_steps"]) == ["train", "generate"]
    assert stages.stale_stages(["embedding.word2vec.window"]) == ["positional_embed", "train", "generate"]
    assert stages.stale_stages(["run_name", "emr.core_instance_count", "lake"]) == []


@pytest.mark.parametrize(
    "setting, first_stale",
    [
        ("corpus", "tokenize"),
        ("tokenizer.vocab_size", "tokenize"),
        ("data.val_fraction", "tokenize"),
        ("data.val_split", "tokenize"),
        ("data.bad_files", "tokenize"),
        ("data.block_size", "window"),
        ("data.stride", "window"),
        ("data.pack_documents", "window"),
        ("embedding.dim", "positional_embed"),
        ("embedding.word2vec.max_sentences", "positional_embed"),
        ("data.shards", "export"),
        ("model.n_layer", "train"),
        ("train.learning_rate", "train"),
        ("generate.prompt", "generate"),
    ],
)
def test_each_setting_makes_the_stage_that_reads_it_stale(setting, first_stale):
    assert stages.stale_stages([setting]) == [first_stale, *stages.downstream(first_stale)]
