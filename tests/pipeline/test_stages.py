"""The stage table (pipeline.stages): the stages in pipeline order, what each reads, and
which stages a re-run or a changed setting makes stale."""

from __future__ import annotations

import pytest

from pipeline import stages
from pipeline.config import REPO_ROOT
from pipeline.stages import PREPROCESSING_STAGES, STAGE_NAMES, STAGES


def test_the_stage_table_covers_the_pipeline_in_order():
    assert STAGE_NAMES == ("tokenize", "window", "positional_embed", "export", "train", "generate")
    assert PREPROCESSING_STAGES == STAGE_NAMES[: STAGE_NAMES.index("train")]
    for position, stage in enumerate(STAGES):
        assert stages.by_name(stage.name) is stage
        assert all(STAGE_NAMES.index(source) < position for source in stage.inputs)
        assert (REPO_ROOT / "spark_jobs" / stage.app_file).is_file()


def test_an_unknown_stage_is_named_with_the_stages_there_are():
    with pytest.raises(ValueError, match="unknown stage 'tokenise'; stages are tokenize, window, "):
        stages.by_name("tokenise")


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
