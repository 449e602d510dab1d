"""The train stage's checks of its inputs, and the pieces of the loop that need no cluster."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest

from pipeline import lake, run_folder
from pipeline.errors import PipelineError
from pipeline.run_folder import StageIncomplete
from spark_jobs.train import settings_warnings, train
from spark_jobs.training import input_pipeline
from spark_jobs.training.train_stats import EPOCH_COLUMNS, IntervalStats, StepTimes, epochs_csv, nats_per_char
from tests.conftest import new_run, small_config


def manifest(shards: int = 4, windows: int = 100, block_size: int = 32, val_windows: int | None = None) -> dict:
    def split(name: str) -> dict:
        count = val_windows if name == "val" and val_windows is not None else windows
        return {
            "windows": count,
            "tokens": 1000,
            "chars": 3000,
            "shards": [f"{name}/part-{index:05d}.tfrecord" for index in range(shards)],
            "shard_windows": [count // shards + (index < count % shards) for index in range(shards)],
        }

    return {
        "block_size": block_size,
        "vocab_size": 512,
        "num_shards": shards,
        "splits": {"train": split("train"), "val": split("val")},
    }


@pytest.fixture
def run_with(tmp_path, shakespeare_slice):
    config = small_config(tmp_path, shakespeare_slice)
    run = new_run(config)

    def write(content: dict):
        lake.write_json(lake.join(run, run_folder.MANIFEST_PATH), content)
        return config, run

    return write


def test_a_matching_manifest_is_accepted(run_with):
    config, run = run_with(manifest())
    assert input_pipeline.read_manifest(run, config)["vocab_size"] == 512
    # Fewer validation windows than a batch are enough, one in every shard.
    config, run = run_with(manifest(val_windows=4))
    assert input_pipeline.read_manifest(run, config)["splits"]["val"]["windows"] == 4


@pytest.mark.parametrize(
    "content, message",
    [
        (manifest(block_size=64), "block_size 64 differs from data.block_size 32"),
        (manifest(shards=3), "3 train shards cannot be split evenly across 2 workers"),
        (manifest(windows=5), "the train split has 5 windows, fewer than train.batch_size 32"),
        (manifest(val_windows=3), "the val split has 3 windows, fewer than its 4 shards, so some of the 2 workers"),
        ({"block_size": 32}, "lacks vocab_size, num_shards, splits"),
        (
            {
                **manifest(),
                "splits": {
                    "train": manifest()["splits"]["train"],
                    "val": {**manifest()["splits"]["val"], "shard_windows": [25, 25]},
                },
            },
            r"lacks the val shards' window counts \(shard_windows\): re-run the export stage",
        ),
    ],
)
def test_a_manifest_that_does_not_fit_is_named(run_with, content, message):
    config, run = run_with(content)
    with pytest.raises(PipelineError, match=message) as error:
        input_pipeline.read_manifest(run, config)
    assert run_folder.MANIFEST_PATH in str(error.value)


def test_training_before_tokenize_says_which_stage_to_run(tmp_path, shakespeare_slice):
    config = small_config(tmp_path, shakespeare_slice)
    with pytest.raises(StageIncomplete, match="stage 'tokenize' has not completed"):
        train(None, config, new_run(config))


def test_each_worker_reads_every_w_th_shard():
    shards = manifest(shards=6)
    assert input_pipeline.worker_shards(shards, "train", 1, 3) == [
        "train/part-00001.tfrecord",
        "train/part-00004.tfrecord",
    ]
    everyone = sum((input_pipeline.worker_shards(shards, "val", index, 3) for index in range(3)), [])
    assert sorted(everyone) == shards["splits"]["val"]["shards"]


def test_an_interval_row_summarises_its_steps():
    stats = IntervalStats()
    for loss, norm in [(3.0, 1.0), (2.0, 5.0)]:
        stats.add_step(loss, 0.5, norm, seconds=0.5)
    row = stats.row(
        epoch=1,
        step=2,
        duration_s=1.5,
        tokens_per_step=100,
        learning_rate=0.001,
        val_loss=2.0,
        val_accuracy=0.4,
        tokens=1000,
        chars=4000,
        workers=2,
        resumed_from_step=0,
    )
    assert row["train_loss"] == 2.5 and row["tokens_per_s"] == 200
    assert (row["grad_norm_min"], row["grad_norm_mean"], row["grad_norm_max"], row["grad_norm_var"]) == (1, 3, 5, 4)
    assert row["val_nats_per_char"] == nats_per_char(2.0, 1000, 4000) == 0.5
    assert row["val_bits_per_char"] == pytest.approx(0.5 / np.log(2))
    assert row["val_perplexity"] == pytest.approx(np.exp(2.0))
    assert row["process_memory_used_mb"] > 0
    header, line = epochs_csv([row]).splitlines()
    assert header.split(",") == list(EPOCH_COLUMNS)
    assert line.startswith("1,2,1500.0,2.5,0.5,2.0,0.4,")


def test_an_attempts_first_step_which_compiles_is_left_out_of_its_throughput():
    times, stats = StepTimes(), IntervalStats()
    for seconds in (4.0, 0.5, 0.5):  # the first step traces and compiles the training step
        stats.add_step(3.0, 0.5, 1.0, seconds if times.add(seconds) else None)
    assert (times.compile_s, times.steps, times.per_step()) == (4.0, 2, 0.5)
    row = stats.row(
        epoch=1,
        step=3,
        duration_s=5.0,
        tokens_per_step=100,
        learning_rate=0.001,
        val_loss=2.0,
        val_accuracy=0.4,
        tokens=1000,
        chars=4000,
        workers=1,
        resumed_from_step=0,
    )
    assert row["tokens_per_s"] == 200 and row["train_loss"] == 3.0  # its loss counts, its time does not
    only_compiling = IntervalStats()
    only_compiling.add_step(3.0, 0.5, 1.0, None)
    assert (
        only_compiling.row(
            epoch=1,
            step=1,
            duration_s=4.0,
            tokens_per_step=100,
            learning_rate=0.001,
            val_loss=2.0,
            val_accuracy=0.4,
            tokens=1000,
            chars=4000,
            workers=1,
            resumed_from_step=0,
        )["tokens_per_s"]
        is None
    )


def test_windows_stay_in_memory_only_while_they_fit_half_the_room_the_model_leaves():
    one_window = 128 * input_pipeline.WINDOW_BYTES_PER_TOKEN
    assert input_pipeline.keep_in_memory(1000, 128, room_bytes=2 * 1000 * one_window)
    assert not input_pipeline.keep_in_memory(1001, 128, room_bytes=2 * 1000 * one_window)
    assert not input_pipeline.keep_in_memory(1, 128, room_bytes=-5e9)  # a model bigger than its budget
    assert input_pipeline.shuffle_buffer(128) == 100_000  # the default shape keeps its buffer
    assert (
        input_pipeline.shuffle_buffer(4096) * 4096 * input_pipeline.WINDOW_BYTES_PER_TOKEN
        <= input_pipeline.SHUFFLE_BUFFER_BYTES
    )
    assert input_pipeline.shuffle_buffer(10**7) == 1_000


def test_streamed_windows_give_the_same_batches_as_windows_kept_in_memory(tmp_path):
    from spark_jobs.text import tfrecord

    block_size = 8
    windows = np.random.default_rng(7).integers(0, 500, size=(300, block_size + 1))
    path = tmp_path / "part-00000.tfrecord"
    path.write_bytes(tfrecord.windows_to_tfrecord_bytes(windows))

    def first_batches(in_memory: bool, take: int = 60, skip: int = 2) -> list[np.ndarray]:
        batches = input_pipeline.train_batches(
            [str(path)], block_size, 16, seed=3, skip_batches=skip, in_memory=in_memory
        )
        return [inputs.numpy() for inputs, _ in batches.take(take)]  # 60 batches: more than three passes

    kept, streamed = first_batches(True), first_batches(False)
    assert len(kept) == 60 and all(np.array_equal(a, b) for a, b in zip(kept, streamed, strict=True))
    # A run resumed after 2 steps takes the batches the uninterrupted run would take next.
    uninterrupted = first_batches(True, take=62, skip=0)
    assert all(np.array_equal(a, b) for a, b in zip(kept, uninterrupted[2:], strict=True))
    assert not np.array_equal(kept[0], uninterrupted[0])
    evaluated = {
        flag: [t.numpy() for _, t, _ in input_pipeline.eval_batches([str(path)], block_size, 16, flag).take(3)]
        for flag in (True, False)
    }
    assert all(np.array_equal(a, b) for a, b in zip(*evaluated.values(), strict=True))
    np.testing.assert_array_equal(evaluated[False][0], windows[:16, 1:])


def test_a_warm_up_as_long_as_the_run_is_warned_about(tmp_path, shakespeare_slice):
    short = small_config(tmp_path, shakespeare_slice, ["train.max_steps=20", "train.warmup_steps=30"])
    (message,) = settings_warnings(short)
    assert message.startswith("train.warmup_steps (30) is not below train.max_steps (20): the learning rate rises")
    assert (
        settings_warnings(small_config(tmp_path, shakespeare_slice, ["train.max_steps=31", "train.warmup_steps=30"]))
        == []
    )


def test_the_last_evaluation_covers_the_validation_split_up_to_twenty_evaluations(tmp_path, shakespeare_slice):
    """Whole on a small corpus (a figure comparable with nanoGPT's); bounded on a large one, whose
    split could take longer than the train step's time limit foresees."""
    from types import SimpleNamespace

    from spark_jobs.training.trainer import Worker

    config = small_config(tmp_path, shakespeare_slice, ["train.batch_size=16", "train.eval_batches=4"])

    def worker(val_windows: int, shard_windows: list[int] | None = None):
        content = manifest(val_windows=val_windows)
        content["splits"]["val"]["shard_windows"] = shard_windows or content["splits"]["val"]["shard_windows"]
        return SimpleNamespace(config=config, manifest=content, workers=2, per_worker_batch=8)

    # 70 windows in 4 shards (18, 18, 17, 17): worker 0 reads shards 0 and 2 (35), worker 1 the others (35).
    assert Worker.final_eval_batches(worker(70)) == 5  # ceil(35 / 8): the whole split
    # Uneven shards: every worker takes as many batches as the one with the most windows needs.
    assert Worker.final_eval_batches(worker(40, shard_windows=[30, 0, 10, 0])) == 5  # ceil(40 / 8), not 40 / 16
    assert Worker.final_eval_batches(worker(1_000_000)) == 80 == config.train.final_eval_max_batches


def test_the_whole_split_pass_scores_each_window_once_and_pads_with_weight_zero(tmp_path):
    """Workers with unequal windows take the same number of full batches; padding weighs nothing."""
    from spark_jobs.text import tfrecord

    windows = np.arange(13 * 5).reshape(13, 5)  # 13 windows of block_size 4
    path = tmp_path / "part-00000.tfrecord"
    path.write_bytes(tfrecord.windows_to_tfrecord_bytes(windows))
    batches = list(input_pipeline.whole_split_batches([str(path)], 4, batch_size=4, batches=5).as_numpy_iterator())
    assert len(batches) == 5 and all(len(inputs) == 4 for inputs, _, _ in batches)
    inputs = np.concatenate([inputs for inputs, _, _ in batches])
    weights = np.concatenate([weights for _, _, weights in batches])
    np.testing.assert_array_equal(inputs[:13], windows[:, :-1])
    assert weights.tolist() == [1.0] * 13 + [0.0] * 7
    # Fewer batches than the windows need: the first windows, once each (the limit of a large split).
    limited = list(input_pipeline.whole_split_batches([str(path)], 4, batch_size=4, batches=2).as_numpy_iterator())
    np.testing.assert_array_equal(np.concatenate([inputs for inputs, _, _ in limited]), windows[:8, :-1])


def test_a_backup_is_resumed_whatever_the_loop_reports_evaluates_or_backs_up(tmp_path, shakespeare_slice):
    """A long run stopped and run again with another progress or evaluation interval resumes; a
    setting that shapes the weights or the optimizer's state starts over."""
    from spark_jobs.training.trainer import fingerprint

    taken = lambda *overrides: fingerprint(small_config(tmp_path, shakespeare_slice, list(overrides)), manifest())  # noqa: E731
    assert (
        taken("train.log_interval=1", "train.eval_interval=7", "train.eval_batches=2", "train.checkpoint_interval=3")
        == taken()
    )
    for change in (
        "train.num_workers=1",
        "train.batch_size=64",
        "train.max_steps=301",
        "train.learning_rate=0.001",
        "train.min_learning_rate=0.0001",
        "train.warmup_steps=10",
        "train.weight_decay=0.0",
        "train.grad_clip=0.5",
        "train.seed=2",
        "model.dropout=0.1",
        "model.mlp_ratio=2",
        "data.stride=8",
        "embedding.word2vec.seed=1",
        "tokenizer.min_frequency=3",
    ):
        assert taken(change) != taken(), change
    assert fingerprint(small_config(tmp_path, shakespeare_slice), manifest(windows=101)) != taken()


def test_a_backup_taken_with_other_settings_is_ignored_naming_them(tmp_path, shakespeare_slice):
    import keras

    from spark_jobs.training import backups
    from spark_jobs.training.trainer import fingerprint, resume_settings

    def identity(config):
        return {"fingerprint": fingerprint(config, manifest()), "settings": resume_settings(config)}

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.AdamW()
    optimizer.build(model.trainable_variables)
    config = small_config(tmp_path, shakespeare_slice)
    run = new_run(config)
    backups.save_backup(run, 20, model, optimizer, [{"step": 20}], identity(config))
    quicker = small_config(tmp_path, shakespeare_slice, ["train.log_interval=1"])
    assert backups.load_backup(run, model, optimizer, identity(quicker)) == {
        "step": 20,
        "rows": [{"step": 20}],
        **identity(config),
    }
    slower = small_config(tmp_path, shakespeare_slice, ["train.learning_rate=0.001", "train.log_interval=1"])
    with pytest.raises(backups.OtherSettings) as ignored:
        backups.load_backup(run, model, optimizer, identity(slower))
    assert str(ignored.value) == (
        f"ignoring the training backup {run}/checkpoints/state.npz (step 20): it was taken with other settings: "
        f"train.learning_rate {config.train.learning_rate} -> 0.001; training starts from step 0"
    )


def test_a_local_lakes_shards_are_read_in_place_and_an_s3_lakes_are_copied(tmp_path, monkeypatch):
    from local_platform.moto_s3 import LocalS3

    shards = ["train/part-00000.tfrecord", "train/part-00002.tfrecord"]
    copies = tmp_path / "copies"
    local_run = lake.join(tmp_path.as_uri(), run_folder.RUNS_FOLDER, "r")
    for shard in shards:
        lake.write_bytes(lake.join(local_run, run_folder.TFRECORDS_FOLDER, shard), shard.encode())
    # No copy of a local lake: the lake's disk room is checked for its TFRecords once, not twice.
    assert input_pipeline.local_shards(local_run, shards, copies) == [
        lake.local_path(lake.join(local_run, run_folder.TFRECORDS_FOLDER, shard)) for shard in shards
    ]
    assert not copies.exists()
    with LocalS3(buckets=("lake",)) as s3:
        for key, value in s3.connection_env().items():
            monkeypatch.setenv(key, value)
        s3_run = "s3://lake/runs/r"
        for shard in shards:
            lake.write_bytes(lake.join(s3_run, run_folder.TFRECORDS_FOLDER, shard), shard.encode())
        paths = input_pipeline.local_shards(s3_run, shards, copies)
    assert paths == [str(copies / shard) for shard in shards]
    assert [Path(path).read_bytes() for path in paths] == [shard.encode() for shard in shards]


def test_the_learning_rate_warms_up_from_the_first_step_and_decays_to_its_minimum(tmp_path, shakespeare_slice):
    from spark_jobs.training.trainer import build_optimizer

    config = small_config(
        tmp_path,
        shakespeare_slice,
        [
            "train.learning_rate=0.001",
            "train.min_learning_rate=0.0001",
            "train.warmup_steps=9",
            "train.max_steps=100",
        ],
    )
    _, schedule = build_optimizer(config)
    rates = [float(schedule(iteration)) for iteration in range(101)]  # iteration i: the optimizer's (i + 1)-th step
    # nanoGPT's warm-up, lr * (it + 1) / (warmup + 1): no step is lost at a rate of 0.
    assert rates[0] == pytest.approx(0.001 / 10) and rates[4] == pytest.approx(0.001 / 2)
    assert rates[9] == pytest.approx(0.001) and rates[100] == pytest.approx(0.0001)
    assert all(rates[i] > rates[i + 1] for i in range(9, 100))


def model_and_optimizer(config, dim: int = 16, dropout: float = 0.5):
    """A small decoder and its optimizer, built: what a backup holds the variables of."""
    from spark_jobs.model.decoder import build_decoder
    from spark_jobs.training.trainer import build_optimizer

    model = build_decoder(vocab_size=50, block_size=8, dim=dim, n_layer=1, n_head=2, mlp_ratio=4, dropout=dropout)
    optimizer, _ = build_optimizer(config)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def test_a_backup_restores_the_dropout_layers_random_state_with_the_weights(tmp_path, shakespeare_slice):
    """A run resumed with dropout draws the masks the uninterrupted run would have drawn."""
    from spark_jobs.training import backups

    config = small_config(tmp_path, shakespeare_slice)
    run, identity = tmp_path.as_uri(), {"fingerprint": "same", "settings": {}}

    inputs = np.arange(16).reshape(2, 8) % 50
    model, optimizer = model_and_optimizer(config)
    model(inputs, training=True)  # draws masks: the random state moves on
    backups.save_backup(run, 3, model, optimizer, [], identity)
    expected = model(inputs, training=True).numpy()

    resumed, resumed_optimizer = model_and_optimizer(config)
    assert backups.load_backup(run, resumed, resumed_optimizer, identity)["step"] == 3
    np.testing.assert_array_equal(resumed(inputs, training=True).numpy(), expected)


def npz_bytes(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


DAMAGES = {  # a backup's bytes -> what a damaged copy holds
    "junk": lambda whole: b"\x00 not a backup \xff" * 50,
    "cut in half": lambda whole: whole[: len(whole) // 2],
    "no meta": lambda whole: npz_bytes(model_0=np.zeros(3)),
    "other shapes": lambda whole: whole,  # a backup of a model of another width
}
UNREADABLE = r"the training backup file://.*/checkpoints/state\.npz is unreadable \({}\); training starts from step 0"


def train_step(model, optimizer) -> None:
    import tensorflow as tf

    ids = np.arange(18).reshape(2, 9) % 50
    with tf.GradientTape() as tape:
        logits = model(ids[:, :-1], training=True)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(ids[:, 1:], logits))
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)


@pytest.mark.parametrize(
    "damage, warning",
    [
        ("junk", UNREADABLE.format("ValueError: .*pickled.*")),
        ("cut in half", UNREADABLE.format("BadZipFile: File is not a zip file")),
        ("no meta", UNREADABLE.format("ValueError: no meta entry")),
        (
            "other shapes",
            r"ignoring the training backup .* \(step 3\): it holds other variables than this model and "
            r"optimizer; training starts from step 0",
        ),
    ],
)
def test_a_damaged_backup_is_warned_about_and_training_starts_over(tmp_path, shakespeare_slice, damage, warning):
    """A backup that cannot be resumed does not stop every later attempt: each starts from step 0
    with its model as built, trains, and backs up over it."""
    from spark_jobs.training import backups

    config = small_config(tmp_path, shakespeare_slice)
    run, identity = tmp_path.as_uri(), {"fingerprint": "same", "settings": {}}
    uri = lake.join(run, run_folder.BACKUP_PATH)
    backups.save_backup(run, 3, *model_and_optimizer(config, dim=8 if damage == "other shapes" else 16), [], identity)
    lake.write_bytes(uri, DAMAGES[damage](lake.read_bytes(uri)))

    model, optimizer = model_and_optimizer(config)
    built, warnings = [variable.numpy() for variable in model.variables], []
    assert backups.resume(run, model, optimizer, identity, warnings.append) is None
    assert len(warnings) == 1 and re.fullmatch(warning, warnings[0]), warnings
    for before, variable in zip(built, model.variables, strict=True):
        np.testing.assert_array_equal(variable.numpy(), before)
    train_step(model, optimizer)
    backups.save_backup(run, 1, model, optimizer, [], identity)
    resumed, resumed_optimizer = model_and_optimizer(config)
    assert backups.resume(run, resumed, resumed_optimizer, identity, warnings.append)["step"] == 1
    assert len(warnings) == 1 and int(resumed_optimizer.iterations) == 1
