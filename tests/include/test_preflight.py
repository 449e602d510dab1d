"""The check before a run: what each target and each choice of stages checks."""

import pytest

from include import preflight
from pipeline.config import ConfigError
from pipeline.config_files import load_config
from pipeline.errors import PipelineError

EMR = {"target": "emr", "lake": "s3://gpt-pipeline/lake", "corpus": "s3://gpt-pipeline/corpus/*.txt"}
CORPUS = {"file:///data/a.txt": 600_000, "file:///data/b.txt": 400_000}


def test_a_local_run_checks_corpus_lake_and_memory_and_says_what_it_found(tmp_path):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}])
    found = preflight.check_run(config, CORPUS)
    assert (found.corpus_files, found.corpus_bytes) == (2, 1_000_000)
    assert found.training is not None and found.training["total"] > 0


def test_a_corpus_too_small_for_a_window_is_refused():
    with pytest.raises(PipelineError, match="the corpus holds 24 bytes"):
        preflight.check_run(load_config(), {"file:///data/note.txt": 24})


def test_a_lake_without_room_for_the_windows_is_refused(tmp_path):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}, "data.stride=1"])
    with pytest.raises(PipelineError, match="raise data.stride, or put the lake on a larger disk"):
        preflight.check_run(config, {"file:///data/huge.txt": 2 * 10**12})


def test_stages_choose_the_checks():
    """Without tokenize the corpus is neither read nor checked; without train, the memory."""
    too_big = load_config(overrides=["train.batch_size=200000", "model.n_layer=64"])
    found = preflight.check_run(too_big, None, stages=("window", "export"))
    assert found == preflight.RunCheck()
    with pytest.raises(ConfigError, match="a worker has on this machine"):
        preflight.check_run(too_big, None, stages=("train",))
    with pytest.raises(ValueError, match="needs the corpus's sizes"):
        preflight.check_run(load_config(), None, stages=("tokenize",))


def test_emr_checks_the_core_nodes_volume_and_leaves_memory_to_the_cluster_check():
    config = load_config(overrides=[EMR, "emr.core_ebs_gb=1", "data.stride=1"])
    with pytest.raises(PipelineError, match="more than its emr.core_ebs_gb = 1 GB volume"):
        preflight.check_run(config, {"s3://gpt-pipeline/corpus/a.txt": 10**9})
    big_model = load_config(overrides=[EMR, "train.batch_size=200000", "model.n_layer=64"])
    found = preflight.check_run(big_model, {"s3://gpt-pipeline/corpus/a.txt": 10**6})
    assert found.training is None and found.corpus_bytes == 10**6
