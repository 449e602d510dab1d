"""The run's settings from make's SET and --set."""

from __future__ import annotations

import pytest

from local_platform import airflow_home, airflow_runner, command_settings


def test_set_from_the_environment_is_split_as_a_shell_would_into_settings(monkeypatch, capsys, tmp_path):
    """make run's SET: one word per setting, as --set options give them, before the command line's --set."""
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    monkeypatch.setenv("MY_SET", "generate.prompt='To be or not' train.max_steps=3")
    assert airflow_runner.main(["run", "--set-from-env", "MY_SET", "--set", "train.max_steps=0"]) == 2
    assert "ERROR invalid configuration: train.max_steps: Input should be greater than or equal to 1" in (
        capsys.readouterr().err
    )
    assert command_settings.split_overrides("generate.prompt='To be' lake='/a #2' x=$5") == [
        "generate.prompt=To be",
        "lake=/a #2",
        "x=$5",
    ]
    with pytest.raises(SystemExit):
        airflow_runner.parse_args(["--help"])
    assert "--set-from-env" not in capsys.readouterr().out, "make's own way in is not the command's interface"
    assert not (tmp_path / "home").exists(), "Airflow's home was touched"
