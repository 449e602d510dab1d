"""Who may change what: the deployment settings the schema marks, and the checks of a run's
settings and corpus against the deployment's (the DAG's refusals: tests/dags/test_dag.py and
tests/dags/test_dag_emr.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import deployment
from pipeline.config import SHARED_CORPUS, ConfigError, PipelineConfig
from pipeline.config_files import DEFAULT_CONFIG_PATH, load_config, read_yaml
from pipeline.overrides import config_names

RUN_SECTIONS = ("run_name", "corpus", "tokenizer", "data", "embedding", "model", "train", "generate")


def test_every_setting_is_of_one_kind_the_deployment_ones_marked_in_the_schema():
    assert deployment.deployment_sections() == [
        "target",
        "corpus_roots",
        "corpus_queue",
        "lake",
        "keep_runs",
        "s3",
        "schedule",
        "local",
        "emr",
        "alerts",
        "tracking",
    ]
    for name in config_names():
        section = name.split(".")[0]
        assert deployment.is_deployment_setting(name) != (section in RUN_SECTIONS), name
    assert {
        "emr.region",
        "emr.max_cost_usd",
        "emr.tags",
        "s3.bucket",
        "local.allow_exposed_workers",
        "alerts.sns_topic_arn",
        "tracking.uri_variable",
    } <= set(deployment.deployment_settings())


def test_the_default_corpus_roots_are_the_default_corpuss_folder():
    config = load_config()
    assert config.corpus_roots == [SHARED_CORPUS.parent.resolve().as_uri()]
    deployment.check_corpus_roots(config.corpus, config.corpus_roots)


@pytest.fixture
def roots(tmp_path):
    """A corpus root with a book, a link in it leading out, and a secret beside it."""
    root = tmp_path / "corpora"
    (root / "books").mkdir(parents=True)
    (root / "books" / "a.txt").write_text("text\n")
    (tmp_path / "secret.txt").write_text("key\n")
    (root / "books" / "link.txt").symlink_to(tmp_path / "secret.txt")
    (root / "out").symlink_to(tmp_path, target_is_directory=True)
    return root


def run_corpus(roots: Path, corpus: str) -> PipelineConfig:
    return load_config(overrides=[{"corpus": corpus, "corpus_roots": [str(roots), "s3://books-bucket/corpus/"]}])


@pytest.mark.parametrize(
    "corpus",
    [
        "{root}/books/a.txt",
        "{root}/books",
        "{root}/books/*.txt",
        "{root}/../corpora/books/a.txt",
        "file://{root}/books/**/*.txt",
        "s3://books-bucket/corpus/",
        "s3://books-bucket/corpus/shakespeare/*.txt",
    ],
)
def test_a_corpus_within_the_roots_is_accepted(roots, corpus):
    config = run_corpus(roots, corpus.format(root=roots))
    deployment.check_corpus_roots(config.corpus, config.corpus_roots)


@pytest.mark.parametrize(
    "corpus, resolved",
    [
        ("~/.aws/credentials", "{home}/.aws/credentials"),
        ("{root}/../secret.txt", "{tmp}/secret.txt"),
        ("file://{root}/../secret.txt", "{tmp}/secret.txt"),
        ("{root}/books/link.txt", "{tmp}/secret.txt"),
        ("file://{root}/out/secret.txt", "{tmp}/secret.txt"),
        ("file://{root}/out/*.txt", "{tmp}/*.txt"),
        ("file:///etc/passwd", "/etc/passwd"),
        ("{root}x/a.txt", "{root}x/a.txt"),
    ],
    ids=[
        "home",
        "dot-dot",
        "uri-dot-dot",
        "link",
        "linked-folder",
        "glob-in-linked-folder",
        "uri",
        "prefix-not-folder",
    ],
)
def test_a_corpus_outside_the_roots_is_refused_naming_it_what_it_resolved_to_and_the_roots(
    roots, tmp_path, corpus, resolved
):
    names = {"root": roots, "tmp": tmp_path, "home": Path.home().resolve()}
    config = run_corpus(roots, corpus.format(**names))
    with pytest.raises(ConfigError) as refused:
        deployment.check_corpus_roots(config.corpus, config.corpus_roots)
    message = str(refused.value)
    assert message.startswith(f"corpus: {config.corpus[0]} (resolved: file://{resolved.format(**names)}) is outside")
    assert message.endswith(f"corpus_roots: {roots.as_uri()}, s3://books-bucket/corpus/")


@pytest.mark.parametrize(
    "corpus", ["s3://books-bucket/corpus-private/a.txt", "s3://books-bucket/a.txt", "s3://other/x"]
)
def test_an_s3_corpus_outside_the_prefixes_is_refused(roots, corpus):
    config = run_corpus(roots, corpus)
    with pytest.raises(ConfigError, match=f"corpus: {corpus} \\(resolved: {corpus}\\) is outside"):
        deployment.check_corpus_roots(config.corpus, config.corpus_roots)


def test_a_glob_holding_dot_dot_is_refused(roots):
    config = run_corpus(roots, f"file://{roots}/*/../../secret.txt")
    with pytest.raises(ConfigError, match=r"a glob may not hold '\.\.'"):
        deployment.check_corpus_roots(config.corpus, config.corpus_roots)


def test_a_listed_file_that_leads_out_of_the_roots_is_refused(roots, tmp_path):
    files = [(roots / "books" / "a.txt").as_uri(), (roots / "books" / "link.txt").as_uri(), "s3://x/y.txt"]
    with pytest.raises(ConfigError, match=f"resolved: file://{tmp_path}/secret.txt"):
        deployment.check_corpus_files(files, [roots.as_uri()])
    deployment.check_corpus_files(files[:1], [roots.as_uri()])


def test_the_deployments_own_corpus_is_not_held_to_its_roots(roots, tmp_path):
    deployed = load_config(overrides=[{"corpus": str(tmp_path / "secret.txt")}])
    deployment.check_run_settings(deployed, deployed, "pipeline.yaml")
    run = load_config(overrides=[{"corpus": str(tmp_path / "other.txt")}])
    with pytest.raises(ConfigError, match="is outside the folders and prefixes this deployment lets a run read"):
        deployment.check_run_settings(deployed, run, "pipeline.yaml")


@pytest.mark.parametrize("name", deployment.deployment_settings())
def test_an_override_of_any_deployment_setting_is_refused_naming_it(name):
    with pytest.raises(ConfigError) as refused:
        deployment.check_overrides([f"{name}=changed-by-a-run"], read_yaml(DEFAULT_CONFIG_PATH), "pipeline.yaml")
    assert str(refused.value).startswith(f"{name}: a deployment setting, which a run cannot change: this DAG's {name}")
    assert str(refused.value).endswith("(got 'changed-by-a-run'); edit pipeline.yaml to change it")


def test_an_override_giving_a_deployment_setting_its_own_value_or_a_run_setting_passes():
    deployed = read_yaml(DEFAULT_CONFIG_PATH)
    deployment.check_overrides(
        ["target=local", "s3.prefix=runs", "train.max_steps=5", {"data": {"stride": 8}}], deployed, "x"
    )
    with pytest.raises(ConfigError, match=r"^emr\.region: a deployment setting"):
        deployment.check_overrides([{"emr": {"region": "us-west-2"}}], deployed, "x")


def test_a_validated_run_that_differs_in_a_deployment_setting_is_refused():
    deployed = load_config()
    run = load_config(overrides=["keep_runs=3"])
    with pytest.raises(
        ConfigError, match=r"^keep_runs: a deployment setting, .* this DAG's keep_runs is None, read from"
    ):
        deployment.check_run_settings(deployed, run, "pipeline.yaml")
    deployment.check_run_settings(deployed, load_config(overrides=["train.max_steps=5"]), "pipeline.yaml")
