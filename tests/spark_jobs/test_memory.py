"""The training memory estimate (spark_jobs/training/memory.py) and the refusals built on it. How close
the estimate comes to a real worker's peak is checked by tests/spark_jobs/test_train.py and measured, for
several model shapes, by benchmarks/train_memory.py."""

from __future__ import annotations

import pytest

from include import emr_steps, emr_tasks
from local_platform import airflow_home, airflow_runner
from pipeline.config import ConfigError
from pipeline.config_files import load_config
from spark_jobs.training import memory

EMR = {"target": "emr", "lake": "s3://gpt-pipeline/lake", "corpus": "s3://gpt-pipeline/corpus/*.txt"}


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        [
            "tokenizer.vocab_size=300",
            "data.block_size=2",
            "data.stride=2",
            "embedding.dim=6",
            "model.n_head=3",
            "model.n_layer=1",
        ],
        ["embedding.dim=384", "model.n_head=6", "model.n_layer=7", "model.mlp_ratio=2", "data.block_size=512"],
    ],
)
def test_the_parameter_count_is_the_models(overrides):
    from spark_jobs.model.decoder import decoder_for

    config = load_config(overrides=overrides)
    assert memory.parameters(config) == decoder_for(config).count_params()


def test_the_estimate_grows_with_the_square_of_the_block_size_in_attention_only():
    short, long = (memory.worker_peak_mb(load_config(overrides=[f"data.block_size={t}"])) for t in (256, 512))
    assert long["attention_scores"] == pytest.approx(4 * short["attention_scores"], rel=0.01)
    assert long["activations"] == pytest.approx(2 * short["activations"], rel=0.01)
    assert long["total"] == sum(value for name, value in long.items() if name != "total") > short["total"]


def test_the_activations_grow_with_the_mlps_width():
    """Measured with D=256, L=4, T=32, b=256 on one worker: peaks of about 1,780 MB at
    model.mlp_ratio=4 and 3,605 to 3,719 MB at 16 (benchmarks/train_memory.py), all but 144 MB of
    the difference in activations: 4.4 copies of b*T*L*D (32 MB) per unit of ratio."""
    shape = ["train.num_workers=1", "embedding.dim=256", "data.block_size=32", "data.stride=16", "train.batch_size=256"]
    estimate = {
        ratio: memory.worker_peak_mb(load_config(overrides=[*shape, f"model.mlp_ratio={ratio}"]), 2048)
        for ratio in (1, 4, 16)
    }
    assert estimate[4]["activations"] == 22 * 32  # the default ratio keeps the fitted constant
    assert estimate[16]["activations"] - estimate[4]["activations"] == pytest.approx(12 * 4.4 * 32, abs=1)
    assert estimate[4]["activations"] - estimate[1]["activations"] == pytest.approx(3 * 4.4 * 32, abs=1)
    assert 3719 <= estimate[16]["total"] <= 1.25 * 3719


def test_a_model_too_big_for_a_worker_is_refused_naming_the_settings():
    config = load_config(overrides=["tokenizer.vocab_size=2048", "data.block_size=4096", "train.batch_size=32"])
    with pytest.raises(ConfigError) as error:
        memory.check_training_fits(config, 11_000, "on this machine")
    message = str(error.value)
    assert message.startswith("training needs about 37,644 MB per worker (runtime 1,000, ")
    assert "attention scores 32,768" in message and "a batch of 16 x 4096 tokens per worker" in message
    assert message.endswith(
        "more than the 11,000 MB a worker has on this machine: attention scores take the most; "
        "lower data.block_size, train.batch_size, model.n_head or model.n_layer"
    )
    assert memory.check_training_fits(load_config(), 11_000, "here")["total"] < 2_000
    # A large vocabulary: its logits and weights, not the block size.
    with pytest.raises(ConfigError, match="logits take the most; lower tokenizer.vocab_size, train.batch_size or "):
        memory.check_training_fits(load_config(overrides=["tokenizer.vocab_size=1000000"]), 11_000, "here")


def test_local_workers_share_the_machine():
    config = load_config(overrides=["train.num_workers=4", "train.batch_size=32"])
    assert memory.local_worker_mb(config, machine_mb=16_384) == (16_384 - memory.LOCAL_RESERVED_MB) // 4


def test_a_worker_takes_its_budget_from_the_emr_executor_or_else_from_this_machine(monkeypatch):
    config = load_config()
    monkeypatch.delenv(memory.WORKER_BUDGET_ENV, raising=False)
    assert memory.worker_budget_mb(config) == memory.local_worker_mb(config)
    monkeypatch.setenv(memory.WORKER_BUDGET_ENV, "16896")
    assert memory.worker_budget_mb(config) == 16896


def test_a_containers_memory_limit_counts_when_it_is_lower(tmp_path):
    physical = memory.machine_memory_mb(limit_files=())
    v2, v1, unlimited = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes", tmp_path / "unlimited"
    v2.write_text("max\n")
    v1.write_text(f"{3 * 2**30}\n")
    unlimited.write_text("9223372036854771712\n")
    assert memory.machine_memory_mb(limit_files=(str(v2), str(unlimited), str(tmp_path / "missing"))) == physical
    assert memory.machine_memory_mb(limit_files=(str(v2), str(v1))) == min(physical, 3072)


def test_make_run_refuses_a_model_too_big_for_this_machine_before_airflow_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    # A batch per worker whose attention scores alone outgrow any machine this runs on.
    too_big = ["--set", "train.batch_size=200000", "--set", "model.n_layer=64"]
    assert airflow_runner.main(["run", *too_big]) == 2
    error = capsys.readouterr().err
    assert "ERROR training needs about " in error and "a worker has on this machine (" in error
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"


def test_emr_refuses_a_model_too_big_for_its_core_nodes_before_any_upload():
    big = load_config(overrides=[EMR, "data.block_size=4096"])
    with pytest.raises(ConfigError, match="more than the 16,896 MB a worker has on an m5.2xlarge core node"):
        emr_tasks.prepare(big, "run-1", big)  # raises before it talks to S3
    larger_nodes = load_config(overrides=[EMR, "data.block_size=4096", "emr.core_instance_type=m5.4xlarge"])
    need = memory.check_training_fits(larger_nodes, emr_steps.train_executor_memory_mb(larger_nodes)[1], "")
    assert need["total"] < emr_steps.train_executor_memory_mb(larger_nodes)[1]
