"""Run folders (pipeline.run_folder): create_run clearing the completion markers of the
stages an existing run's changed settings make stale, stage markers, and the stage runner's run folders."""

from __future__ import annotations

import json
import os
import re

import pytest

from pipeline import lake, run_folder
from pipeline.config import ConfigError
from pipeline.config_files import load_config
from pipeline.errors import PipelineError
from pipeline.stages import STAGE_NAMES
from spark_jobs.spark.stage_app import parse_args, run_stage
from tests.conftest import new_run, small_config


def complete(run: str, *names: str) -> None:
    for name in names:
        run_folder.complete_stage(run, name, {"stage": name})


def completed(run: str) -> list[str]:
    return [name for name in STAGE_NAMES if lake.exists(run_folder.stats_uri(run, name))]


def test_an_existing_run_with_changed_settings_keeps_only_what_they_do_not_touch(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    run = new_run(small_config(tmp_path, corpus), "r")
    complete(run, *STAGE_NAMES)
    assert run_folder.create_run(small_config(tmp_path, corpus), "r") == run  # same settings: nothing changes
    assert completed(run) == list(STAGE_NAMES)

    run_folder.create_run(small_config(tmp_path, corpus, ["train.max_steps=7"]), "r")
    assert completed(run) == ["tokenize", "window", "positional_embed", "export"]
    default = load_config().train.max_steps
    assert (
        f"changed train.max_steps: {default} -> 7; stage(s) train, generate no longer complete"
        in capsys.readouterr().err
    )
    assert lake.read_json(lake.join(run, run_folder.CONFIG_FILE))["train"]["max_steps"] == 7

    run_folder.create_run(small_config(tmp_path, corpus, ["train.max_steps=7", "data.stride=8"]), "r")
    assert completed(run) == ["tokenize"]


def test_clearing_a_stage_clears_the_stages_that_read_it(tmp_path):
    run = new_run(small_config(tmp_path, tmp_path / "c.txt"), "r")
    complete(run, *STAGE_NAMES)
    assert run_folder.clear_stage(run, "export") == ["export", "train", "generate"]
    assert completed(run) == ["tokenize", "window", "positional_embed"]
    assert run_folder.clear_stage(run, "export") == []


def test_the_local_runner_keeps_an_existing_runs_settings(tmp_path):
    from local_platform import stage_runner

    corpus = tmp_path / "c.txt"
    run = new_run(small_config(tmp_path, corpus, ["train.max_steps=7"]), "r")
    args = stage_runner.parse_args(
        ["--run-id", "r", "--set", f"lake={tmp_path / 'lake'}", "--set", "train.batch_size=4"]
    )
    config = stage_runner.resolve_config(args)
    # One setting per --set: a second word after it is not a setting.
    assert args.overrides == [f"lake={tmp_path / 'lake'}", "train.batch_size=4"]
    with pytest.raises(SystemExit):
        stage_runner.parse_args(["--set", f"lake={tmp_path / 'lake'}", "train.batch_size=4", "--run-id", "r"])
    assert run_folder.run_dir(config, "r") == run
    assert (config.corpus, config.train.max_steps, config.train.batch_size) == ([corpus.as_uri()], 7, 4)
    assert config.data.block_size == small_config(tmp_path, corpus).data.block_size != load_config().data.block_size
    # A new run starts from the defaults.
    args = stage_runner.parse_args(["--run-id", "new", "--set", f"lake={tmp_path / 'lake'}"])
    assert stage_runner.resolve_config(args).train.max_steps == load_config().train.max_steps


def test_the_local_runners_run_id_is_made_a_folder_name_as_it_is_read():
    from local_platform import stage_runner

    assert stage_runner.parse_args(["--run-id", "books 2026:11"]).run_id.startswith("books_2026_11-")
    assert stage_runner.parse_args(["--run-id", ""]).run_id is None  # a new run, as without --run-id


def test_an_existing_run_checks_a_change_against_its_own_settings(tmp_path):
    """n_head=6 divides this run's embedding.dim of 96, though not the default 128."""
    from local_platform import stage_runner

    new_run(small_config(tmp_path, tmp_path / "c.txt", ["embedding.dim=96", "model.n_head=3"]), "r")
    args = stage_runner.parse_args(["--run-id", "r", "--set", f"lake={tmp_path / 'lake'}", "--set", "model.n_head=6"])
    config = stage_runner.resolve_config(args)
    assert (config.embedding.dim, config.model.n_head) == (96, 6)
    bad = stage_runner.parse_args(["--run-id", "r", "--set", f"lake={tmp_path / 'lake'}", "--set", "model.n_head=5"])
    with pytest.raises(ConfigError, match=r"embedding.dim \(96\) must be divisible by model.n_head \(5\)"):
        stage_runner.resolve_config(bad)


def test_the_done_line_counts_long_lists_instead_of_printing_them():
    from spark_jobs.spark.stage_app import brief

    stats = {"sequences": [{"doc_id": i} for i in range(300)], "splits": {"train": {"tokens": 5}}, "skipped": [1, 2]}
    assert brief(stats, run_folder.stats_path("window")) == {
        "sequences": "300 entries, see stats/window.json",
        "splits": {"train": {"tokens": 5}},
        "skipped": [1, 2],
    }


def test_the_local_runner_describes_each_stage_in_a_few_lines():
    from local_platform.stage_runner import describe

    export = {
        "duration_s": 2.5,
        "outputs": {"tfrecords": "file:///lake/runs/r/tfrecords"},
        "splits": {"train": {"windows": 12345, "chars": 9000}},
    }
    assert describe("export", export) == [
        "  export (2.5 s)",
        "    tfrecords: file:///lake/runs/r/tfrecords",
        "    train: windows 12,345, chars 9,000",
    ]
    train = {
        "stage": "train",
        "duration_s": 11.8,
        "steps": 300,
        "final_val_loss": 4.378682374954224,
        "worker_results": [{"worker": 0}, {"worker": 1}],
        "warnings": ["short"],
        "resumed": False,
    }
    assert describe("train", train) == ["  train (11.8 s)", "    steps 300, final_val_loss 4.379, resumed False"]


def test_a_run_folder_used_again_is_no_longer_a_collected_run(tmp_path):
    """Its report goes as soon as a command takes it up again, so prune_runs leaves it alone."""
    run = new_run(small_config(tmp_path, tmp_path / "c.txt"), "r")
    for report in run_folder.REPORTS:
        lake.write_text(lake.join(run, report), "{}")
    run_folder.create_run(small_config(tmp_path, tmp_path / "c.txt"), "r")
    assert not any(lake.exists(lake.join(run, report)) for report in run_folder.REPORTS)


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path):
    from local_platform import stage_runner

    config = small_config(tmp_path, tmp_path / "c.txt")
    ids = [stage_runner.new_run_id(config, "books-20261123T072216Z") for _ in range(3)]
    assert ids == ["books-20261123T072216Z", "books-20261123T072216Z-2", "books-20261123T072216Z-3"]
    assert all(lake.exists(run_folder.run_dir(config, run_id)) for run_id in ids)


def test_a_run_folder_in_use_is_refused_to_a_second_command(tmp_path, capsys):
    from include import locks
    from local_platform import stage_runner

    run = new_run(small_config(tmp_path, tmp_path / "c.txt"), "r")
    complete(run, *STAGE_NAMES)
    with locks.run_folder_held(run, "the DAG's task train"):
        code = stage_runner.main(["--run-id", "r", "--stages", "generate", "--set", f"lake={tmp_path / 'lake'}"])
    assert code == 2
    assert capsys.readouterr().err.startswith(
        f"ERROR run folder {run} is in use by the DAG's task train (pid {os.getpid()}): wait for it to end"
    )
    assert completed(run) == list(STAGE_NAMES), "nothing of the run was touched"


def test_the_local_runner_runs_target_local_only(tmp_path, capsys):
    from local_platform import stage_runner

    code = stage_runner.main(["--set", "target=emr", "--set", "lake=s3://some-bucket/lake"])
    assert code == 2
    assert "ERROR target is emr: this command runs stages on this machine" in capsys.readouterr().err


def test_the_local_runner_stops_a_corpus_too_small_for_a_window_before_spark(tmp_path, capsys):
    from local_platform import stage_runner

    (tmp_path / "tiny.txt").write_text("Hi.\n")
    code = stage_runner.main(["--corpus", str(tmp_path / "tiny.txt"), "--set", f"lake={tmp_path / 'lake'}"])
    assert code == 2
    assert capsys.readouterr().err.startswith("ERROR the corpus holds 4 bytes, so at most 4 tokens")
    assert not (tmp_path / "lake").exists()


def test_the_local_runner_stops_whole_file_validation_of_a_single_file_before_spark(
    tmp_path, capsys, shakespeare_slice
):
    from local_platform import stage_runner

    code = stage_runner.main(
        ["--corpus", str(shakespeare_slice), "--set", f"lake={tmp_path / 'lake'}", "--set", "data.val_split=files"]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        f"ERROR data.val_split=files: the corpus is one file ({shakespeare_slice.as_uri()}), and validation would "
        "take it whole; use data.val_split=tail (or auto) or more files\n"
    )
    assert not (tmp_path / "lake").exists()


def test_a_runs_config_is_read_back_as_create_run_wrote_it(tmp_path):
    config = small_config(tmp_path, tmp_path / "c.txt", ["train.max_steps=7"])
    run = new_run(config, "r")
    assert run_folder.read_config(run) == config
    assert run_folder.read_config_data(run) == json.loads(config.to_json())
    with pytest.raises(PipelineError, match=f"^run folder {tmp_path.as_uri()}/none has no config.json: create the run"):
        run_folder.read_config(f"{tmp_path.as_uri()}/none")


def test_a_runs_config_is_read_through_the_reader_given(tmp_path):
    """As Airflow's tasks read a run folder on S3, through their connection: never through the lake."""
    config = small_config(tmp_path, tmp_path / "c.txt")
    files = {run_folder.CONFIG_FILE: config.to_json().encode()}
    assert run_folder.read_config("s3://nowhere/runs/r", files.__getitem__) == config
    assert run_folder.read_config_data("s3://nowhere/runs/r", files.__getitem__)["run_name"] == config.run_name


def test_a_broken_or_invalid_config_json_is_named(tmp_path):
    config = small_config(tmp_path, tmp_path / "c.txt")
    run = new_run(config, "r")
    config_json = lake.join(run, run_folder.CONFIG_FILE)
    lake.write_text(config_json, "{broken")
    with pytest.raises(ConfigError, match=f"^resolved config {re.escape(config_json)} is not valid JSON: "):
        run_folder.read_config_data(run)
    # Settings that no longer validate (say, a run folder of another version): only the raw reader takes them.
    lake.write_json(config_json, {"run_name": "old", "train": {"max_steps": 0}})
    assert run_folder.read_config_data(run) == {"run_name": "old", "train": {"max_steps": 0}}
    older = config.model_dump()
    older["train"]["max_steps"] = 0
    lake.write_json(config_json, older)
    with pytest.raises(ConfigError, match=r"train\.max_steps: Input should be greater than or equal to 1"):
        run_folder.read_config(run)


def test_a_lake_where_no_folder_can_be_made_is_named(tmp_path):
    (tmp_path / "a-file").write_text("")
    config = load_config(overrides=[{"lake": str(tmp_path / "a-file" / "lake")}])
    with pytest.raises(
        PipelineError,
        match=rf"^lake {(tmp_path / 'a-file' / 'lake').as_uri()}: cannot create the run folder .*/runs/r: "
        r".*Not a directory",
    ):
        run_folder.create_run(config, "r")


def test_a_stage_takes_its_run_folder_as_a_path_or_a_uri(tmp_path, capsys):
    assert (
        parse_args("window", ["--run-dir", str(tmp_path / run_folder.RUNS_FOLDER / "r1") + "/"]).run_dir
        == f"file://{tmp_path}/runs/r1"
    )
    assert parse_args("window", ["--run-dir", "s3://lake/runs/r1"]).run_dir == "s3://lake/runs/r1"
    with pytest.raises(SystemExit) as stop:
        run_stage("window", lambda *_: {}, ["--run-dir", str(tmp_path / "nothing")])
    assert stop.value.code == 2
    assert (
        capsys.readouterr().err
        == f"ERROR [window] run folder file://{tmp_path}/nothing has no config.json: create the run first\n"
    )
    with pytest.raises(SystemExit) as stop:
        parse_args("window", ["--run-dir", "gs://lake/runs/r1"])
    assert stop.value.code == 2
    assert (
        "argument --run-dir: unsupported URI scheme gs://; use a local path, file:// or s3://"
        in capsys.readouterr().err
    )


def test_the_local_runner_runs_named_stages_in_pipeline_order():
    from local_platform import stage_runner

    assert stage_runner.chosen_stages("generate,window, tokenize,window") == ("tokenize", "window", "generate")
    with pytest.raises(PipelineError, match="unknown stage"):
        stage_runner.chosen_stages("tokenize,bogus")
    with pytest.raises(PipelineError, match="--stages names no stage"):
        stage_runner.chosen_stages(",")


def test_the_local_runner_refuses_a_new_run_without_the_stages_its_stages_read(tmp_path, capsys):
    from local_platform import stage_runner

    code = stage_runner.main(["--run-id", "fresh", "--stages", "train,generate", "--set", f"lake={tmp_path / 'lake'}"])
    assert code == 2
    assert capsys.readouterr().err == (
        "ERROR run fresh does not exist yet, and stage train reads the outputs of tokenize, positional_embed, "
        "export: add them to --stages, or give the --run-id of a run where they have completed\n"
    )
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize(
    "run_id, folder",
    [
        ("manual__2026-11-22T19:54:54+00:00", "manual__2026-11-22T19_54_54_00_00-0176b673"),
        ("my run", "my_run-d33e7609"),
        ("..", "_.-5ec1f7e7"),
        (".", "_-cdb4ee2a"),
        ("../../etc", "_._.._etc-74ccf3c5"),
        ("v1.2", "v1.2"),
    ],
)
def test_a_run_id_never_names_a_hidden_folder_or_one_outside_runs(tmp_path, run_id, folder):
    config = load_config(overrides=[{"lake": str(tmp_path / "lake")}])
    assert run_folder.safe_run_id(run_id) == folder
    assert run_folder.run_dir(config, run_folder.safe_run_id(run_id)) == f"file://{tmp_path}/lake/runs/{folder}"
    if run_id != folder:  # made safe where it comes in, never again: run_dir refuses one that is not
        with pytest.raises(PipelineError, match=f"run id {re.escape(repr(run_id))} is not a folder name"):
            run_folder.run_dir(config, run_id)
    with pytest.raises(PipelineError, match="a run id must not be empty"):
        run_folder.run_dir(config, "")


def test_run_ids_that_differ_only_where_they_were_made_safe_never_share_a_run_folder():
    run_ids = [
        "manual__2026-11-22T19:54:54+00:00",
        "manual__2026-11-22T19_54_54+00_00",
        "manual__2026-11-22T19_54_54_00_00",
    ]
    folders = [run_folder.safe_run_id(run_id) for run_id in run_ids]
    assert len(set(folders)) == len(run_ids)
    assert folders[2] == run_ids[2]  # a folder name already stays as it is
    assert all(run_folder.safe_run_id(folder) == folder for folder in folders)  # made safe once


def test_a_run_whose_windows_cannot_fit_the_lakes_disk_is_refused_before_anything_runs(tmp_path, capsys):
    from local_platform import stage_runner

    huge = tmp_path / "huge.txt"
    with huge.open("wb") as file:
        file.truncate(2 * 10**12)  # 2 TB, sparse: with stride 1, hundreds of TB of windows
    code = stage_runner.main(["--corpus", str(huge), "--set", f"lake={tmp_path / 'lake'}", "--set", "data.stride=1"])
    assert code == 2
    error = capsys.readouterr().err
    assert error.startswith("ERROR the run's windows and TFRecords need at least ")
    assert f"GB free for lake file://{tmp_path}/lake: raise data.stride, or put the lake on a larger disk" in error
    assert not (tmp_path / "lake").exists()


def test_a_small_stride_multiplies_what_the_windows_take():
    from pipeline import disk_room

    wide, dense = (disk_room.least_run_bytes(load_config(overrides=[f"data.stride={s}"]), 10**9) for s in (64, 1))
    assert dense["windows"] == 64 * wide["windows"] and dense["tfrecords_bytes"] == 64 * wide["tfrecords_bytes"]
    s3_lake = load_config(overrides=["target=emr", "lake=s3://bucket/lake"])
    disk_room.check_lake_room(s3_lake, {"s3://bucket/huge.txt": 10**18})  # no disk to fill on S3


def test_a_stages_resume_folder_goes_only_once_the_stage_is_complete(tmp_path, monkeypatch, capsys):
    """train's backups: a failure before the completion marker resumes from them, a completed stage
    removes them, and a completed stage run again starts over even if they were left behind."""
    from spark_jobs.spark import stage_app

    monkeypatch.setattr(stage_app, "spark_session", lambda name: None)
    monkeypatch.setattr(stage_app, "stop_spark", lambda spark: None)
    run = new_run(load_config(overrides=[{"lake": str(tmp_path / "lake")}]))
    backup = lake.join(run, run_folder.BACKUP_PATH)
    seen = []

    def training(spark, config, run):
        seen.append(lake.exists(backup))
        lake.write_text(backup, "state")
        return {}

    def marker_fails(run, name, stats):
        raise OSError("the lake went away")

    with monkeypatch.context() as failing:
        failing.setattr(run_folder, "complete_stage", marker_fails)
        with pytest.raises(OSError):
            run_stage("train", training, ["--run-dir", run], resume_folder=run_folder.BACKUP_FOLDER)
    assert lake.exists(backup), "not complete: the next attempt resumes"
    run_stage("train", training, ["--run-dir", run], resume_folder=run_folder.BACKUP_FOLDER)
    assert seen == [False, True]
    assert lake.exists(run_folder.stats_uri(run, "train")) and not lake.exists(lake.join(run, run_folder.BACKUP_FOLDER))

    lake.write_text(backup, "left by a driver that died after the marker")
    run_stage(
        "train",
        lambda *_: seen.append(lake.exists(backup)) or {},
        ["--run-dir", run],
        resume_folder=run_folder.BACKUP_FOLDER,
    )
    assert seen[-1] is False, "a completed stage run again starts over"


def test_the_run_folder_contract_names_the_documented_paths():
    """The paths the README and the design give the run folder, spelled out once here."""
    assert run_folder.run_dir(load_config(overrides=[{"lake": "/lake"}]), "r1") == "file:///lake/runs/r1"
    assert [run_folder.stats_path("train"), run_folder.error_path("train"), run_folder.progress_path("train")] == [
        "stats/train.json",
        "errors/train.json",
        "progress/train.json",
    ]
    assert run_folder.smoke_probe_path(1) == "_smoke/node-1"  # the cluster check's probe, hidden from readers
    assert (run_folder.TOKENIZER_PATH, run_folder.TOKENS_FOLDER, run_folder.WINDOWS_FOLDER) == (
        "tokenizer/tokenizer.json",
        "tokens",
        "windows",
    )
    assert (run_folder.TOKEN_VECTORS_PATH, run_folder.POSITIONS_PATH, run_folder.EMBEDDINGS_META_PATH) == (
        "embeddings/token_vectors.npy",
        "embeddings/positions.npy",
        "embeddings/meta.json",
    )
    assert (run_folder.MANIFEST_PATH, run_folder.BACKUP_PATH, run_folder.EPOCHS_CSV_PATH) == (
        "tfrecords/manifest.json",
        "checkpoints/state.npz",
        "stats/epochs.csv",
    )
    assert (run_folder.MODEL_FOLDER, run_folder.MODEL_FILE, run_folder.MODEL_TOKENIZER_FILE) == (
        "model",
        "model.keras",
        "tokenizer.json",
    )
    assert (run_folder.CONFIG_FILE, run_folder.SAMPLES_PATH, run_folder.REPORTS, run_folder.TENSORBOARD_FOLDER) == (
        "config.json",
        "samples.txt",
        ("report.json", "report.md", "report.html"),
        "tensorboard",
    )


def test_a_stage_requires_every_stage_it_reads_to_have_completed(tmp_path):
    run = new_run(small_config(tmp_path, tmp_path / "c.txt"))
    complete(run, "tokenize", "positional_embed")
    with pytest.raises(run_folder.StageIncomplete, match="stage 'export' has not completed in run folder .*: run it"):
        run_folder.require_inputs(run, "train")
    complete(run, "export")
    assert run_folder.require_inputs(run, "train") == {
        name: {"stage": name} for name in ("tokenize", "positional_embed", "export")
    }
    assert run_folder.require_inputs(run, "tokenize") == {}
