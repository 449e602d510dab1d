"""The config files: the defaults, and what a broken or doubled YAML file gets."""

import pytest

from pipeline.config import ConfigError
from pipeline.config_files import DEFAULT_CONFIG_PATH, load_config, read_yaml


def test_defaults_are_valid_and_resolve_paths():
    config = load_config()
    assert config.corpus[0].startswith("file:///") and config.corpus[0].endswith("tinyshakespeare.txt")
    assert config.lake.startswith("file:///")
    assert config.data.shards % config.train.num_workers == 0


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
    broken.write_bytes(b"run_name: caf\xe9\n")
    with pytest.raises(ConfigError, match="not valid YAML.*utf-8"):
        load_config(broken)


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    """YAML itself would keep the last one: a second `train:` section would replace the first whole."""
    doubled = tmp_path / "doubled.yaml"
    doubled.write_text(DEFAULT_CONFIG_PATH.read_text() + "\ntrain:\n  max_steps: 500\n")
    line = len(DEFAULT_CONFIG_PATH.read_text().splitlines()) + 2
    with pytest.raises(
        ConfigError, match=rf"'train' is given twice in the same section\n  in \"{doubled}\", line {line}"
    ):
        load_config(doubled)
    doubled.write_text("train:\n  max_steps: 5\n  max_steps: 6\n")
    with pytest.raises(ConfigError, match="'max_steps' is given twice"):
        read_yaml(doubled)


def test_anchors_and_aliases_in_the_file_are_refused_with_their_line(tmp_path):
    aliased = tmp_path / "aliased.yaml"
    aliased.write_text(DEFAULT_CONFIG_PATH.read_text() + "\nx-sizes: &sizes {n_layer: 2}\nmodel: *sizes\n")
    line = len(DEFAULT_CONFIG_PATH.read_text().splitlines()) + 2
    with pytest.raises(
        ConfigError,
        match=rf"is not valid YAML: anchors and aliases \(&name, \*name\) are not supported\n  in \"{aliased}\", "
        rf"line {line}",
    ):
        load_config(aliased)
