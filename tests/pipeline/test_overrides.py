"""Overrides: section.key=value settings read as YAML, text settings as typed, one per --set."""

import argparse

import pytest

from pipeline.config import ConfigError
from pipeline.config_files import load_config
from pipeline.overrides import add_set_argument, parse_override


def test_overrides_parse_yaml_values_and_globs_stay_strings():
    assert parse_override("train.max_steps=200") == (["train", "max_steps"], 200)
    assert parse_override("embedding.word2vec.enabled=false") == (["embedding", "word2vec", "enabled"], False)
    config = load_config(overrides=[{"corpus": "/data/*.txt"}, "train.max_steps=7"])
    assert config.corpus == ["file:///data/*.txt"] and config.train.max_steps == 7
    with pytest.raises(ConfigError, match="not of the form"):
        parse_override("train.max_steps")


def test_a_hash_in_an_unquoted_override_is_text_not_a_yaml_comment():
    assert parse_override("lake=/tmp/my lake #2") == (["lake"], "/tmp/my lake #2")
    assert parse_override("generate.prompt=#1 ROMEO:") == (["generate", "prompt"], "#1 ROMEO:")
    assert parse_override("corpus=/data/a#b.txt") == (["corpus"], "/data/a#b.txt")
    assert parse_override("run_name='007'") == (["run_name"], "007")  # quoted: YAML still reads it
    assert parse_override("generate.prompt='a #b'") == (["generate", "prompt"], "a #b")


@pytest.mark.parametrize(
    "override, path, value",
    [
        ("generate.prompt=yes", ["generate", "prompt"], "yes"),
        ("generate.prompt=1599", ["generate", "prompt"], "1599"),
        ("generate.prompt=ROMEO: Hark", ["generate", "prompt"], "ROMEO: Hark"),
        ("generate.prompt=- a dash", ["generate", "prompt"], "- a dash"),
        ("run_name=2024", ["run_name"], "2024"),
        ("s3.bucket=123", ["s3", "bucket"], "123"),
        ("schedule=0 3 * * 1", ["schedule"], "0 3 * * 1"),
        # Not text settings, or not text values: YAML's reading stays.
        ("schedule=null", ["schedule"], None),
        ("generate.prompt='quoted: yes'", ["generate", "prompt"], "quoted: yes"),
        ("emr.tags={team: ml}", ["emr", "tags"], {"team": "ml"}),
        ("corpus=[a.txt, b.txt]", ["corpus"], ["a.txt", "b.txt"]),
        ("model.dropout=0.1", ["model", "dropout"], 0.1),
        ("generate.nope=yes", ["generate", "nope"], True),
        # YAML's anchors and aliases are refused; a text setting takes them as typed.
        ("generate.prompt=&Sons were here", ["generate", "prompt"], "&Sons were here"),
        ("generate.prompt=*emphasis* is", ["generate", "prompt"], "*emphasis* is"),
    ],
)
def test_a_text_setting_takes_the_text_as_typed_whatever_yaml_makes_of_it(override, path, value):
    assert parse_override(override) == (path, value)


def test_a_prompt_that_yaml_reads_as_a_boolean_or_mapping_is_still_a_prompt():
    config = load_config(overrides=["generate.prompt=yes", "run_name=2024"])
    assert config.generate.prompt == "yes" and config.run_name == "2024"
    assert load_config(overrides=["generate.prompt=ROMEO: Hark"]).generate.prompt == "ROMEO: Hark"


def test_set_takes_one_setting_and_is_repeated_for_more(capsys):
    parser = argparse.ArgumentParser()
    add_set_argument(parser)
    assert parser.parse_args([]).overrides == []
    args = parser.parse_args(["--set", "train.max_steps=5", "--set=generate.prompt=To be", "--set", "lake=/a b"])
    assert args.overrides == ["train.max_steps=5", "generate.prompt=To be", "lake=/a b"]
    with pytest.raises(SystemExit):  # a second setting after one --set is not taken for another
        parser.parse_args(["--set", "train.max_steps=5", "data.stride=8"])
    assert "unrecognized arguments: data.stride=8" in capsys.readouterr().err


def alias_bomb(levels: int) -> str:
    """A YAML list of `levels` lists, each of nine aliases of the one before: 9 ** levels strings
    from a few hundred characters (the "billion laughs")."""
    lists = ["&l0 [x, x, x, x, x, x, x, x, x]"]
    lists += [f"&l{level} [{', '.join([f'*l{level - 1}'] * 9)}]" for level in range(1, levels)]
    return f"[{', '.join(lists)}]"


@pytest.mark.timeout(10, method="thread")  # a bomb that goes off takes the memory of the machine, then fails
@pytest.mark.parametrize("setting", ["data.shards", "corpus", "emr.tags"])
def test_a_yaml_alias_bomb_is_refused_in_a_line_naming_the_setting(setting):
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=[f"{setting}={alias_bomb(10)}"])
    message = str(refused.value)
    assert message == f"invalid configuration: {setting}: anchors and aliases (&name, *name) are not supported"
    assert len(message) < 2000


def test_a_value_nested_deeper_than_any_setting_is_refused():
    with pytest.raises(ConfigError, match=r"^invalid configuration: corpus: nested more than 32 levels deep$"):
        load_config(overrides=[f"corpus={'[' * 5000}{']' * 5000}"])


def test_an_integer_of_more_digits_than_python_reads_is_named_not_a_traceback():
    with pytest.raises(ConfigError, match=r"^invalid configuration: data.shards: .* \(got '9{50}"):
        load_config(overrides=["data.shards=" + "9" * 5000])
