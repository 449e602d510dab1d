"""The stage runner (`python -m local_platform.stage_runner`): a bad setting is named before any
Spark starts, and a stage that stopped says why on the runner's last line."""

from __future__ import annotations

from contextlib import contextmanager

from include import local_spark
from local_platform import stage_runner
from pipeline import lake, run_folder


def test_a_bad_setting_is_named_before_any_stage_runs(tmp_path, shakespeare_slice, capsys):
    argv = ["--corpus", str(shakespeare_slice), "--set", f"lake={tmp_path / 'lake'}", "--set", "data.stride=0"]
    assert stage_runner.main(argv) == 2
    assert "ERROR invalid configuration: data.stride: Input should be greater than or equal to 1" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "lake").exists()


def test_a_stage_that_stopped_on_bad_input_ends_the_runner_with_its_recorded_error(
    tmp_path, shakespeare_slice, monkeypatch, capsys
):
    """spark-submit stands in for a stage that stops as stage_app does: its error in the run
    folder, exit code 2."""
    message = f"corpus file {shakespeare_slice.as_uri()} is not UTF-8 text (byte 0xe9 at offset 3)"

    def stage_stops(argv, env):
        run = argv[argv.index("--run-dir") + 1]
        lake.write_json(lake.join(run, run_folder.error_path("tokenize")), {"error": message, "bad_input": True})
        return 2

    monkeypatch.setattr(local_spark, "run_spark_submit", stage_stops)
    monkeypatch.setattr(local_spark.class_archive, "sharing", contextmanager(lambda stage: (yield ())))
    argv = ["--corpus", str(shakespeare_slice), "--set", f"lake={tmp_path / 'lake'}", "--stages", "tokenize"]
    assert stage_runner.main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"ERROR stage tokenize failed with exit code 2: {message}"
