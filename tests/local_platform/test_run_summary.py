"""The summary a local run ends with."""

from __future__ import annotations

from local_platform.run_summary import print_report
from pipeline import run_folder
from pipeline.config_files import load_config


def test_the_run_summary_rounds_the_losses_and_offers_more_samples_of_the_runs_prompt(capsys, tmp_path):
    folder = tmp_path / "lake" / run_folder.RUNS_FOLDER / "r"
    folder.mkdir(parents=True)
    config = load_config(overrides=[{"generate": {"prompt": "Ἀχιλῆος, he said"}}])
    (folder / run_folder.CONFIG_FILE).write_text(config.to_json())
    report = {
        "run_folder": folder.as_uri(),
        "s3_uri": "s3://b/runs/r/",
        "final_val_loss": 4.378682374954224,
        "val_nats_per_char": 1.7099787123061774,
        "warnings": ["a file is short"],
        "sample": "ROMEO: hark",
    }
    print_report(report, "s3://b/runs/latest/r.json", {"model": "s3://b/runs/r/model/"}, ["r-1", "r-0"])
    out = capsys.readouterr().out
    assert (
        "keep_runs:        removed 2 older run folder(s), their only copy (the S3 records of earlier make runs "
        "ended with them): r-0, r-1\n" in out
    )
    assert (
        f"run folder:       {folder.as_uri()}\nreport:           {folder.as_uri()}/report.md\n"
        f"report page:      {folder.as_uri()}/report.html\n" in out
    )
    assert "final val loss:   4.3787 nats/token\nval nats/char:    1.7100\nwarning:          a file is short\n" in out
    assert "generated sample:\nROMEO: hark\n" in out
    assert out.endswith(
        f"more samples:     .venv/bin/python -m spark_jobs.generate --model-dir {folder}/model "
        "--prompt 'Ἀχιλῆος, he said'\n"
    )
