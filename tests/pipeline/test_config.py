"""The config schema: each field's rules and the rules across fields, named in one line."""

import re

import pytest

from pipeline.config import REPO_ROOT, ConfigError, corpus_name
from pipeline.config_files import DEFAULT_CONFIG_PATH, load_config, read_yaml, validate


@pytest.mark.parametrize(
    "override, field",
    [
        ("data.stride=0", "data.stride"),
        ("data.stride=-3", "data.stride"),
        ("data.block_size=1", "data.block_size"),
        ("tokenizer.vocab_size=200", "tokenizer.vocab_size"),
        ("data.shards=0", "data.shards"),
        ("train.batch_size=many", "train.batch_size"),
        ("data.val_fraction=1.5", "data.val_fraction"),
        ("target=gpu", "target"),
        ("data.bad_files=ignore", "data.bad_files"),
        ("generate.strategy=beam", "generate.strategy"),
        ("emr.release_label=emr-6.15.0", "emr.release_label"),
    ],
)
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=rf"{field}:"):
        load_config(overrides=[override])


@pytest.mark.parametrize(
    "override, field",
    [
        ("corpus=gs://bucket/books/*.txt", "corpus"),
        ("corpus=https://example.com/a.txt", "corpus"),
        ("lake=hdfs://namenode/lake", "lake"),
        ("lake=s3a://bucket/lake", "lake"),
    ],
)
def test_a_uri_the_lake_cannot_read_is_named_before_anything_runs(override, field):
    scheme = override.split("=", 1)[1].split("://")[0]
    with pytest.raises(
        ConfigError, match=rf"{field}: unsupported URI scheme {scheme}://; use a local path, file:// or s3://"
    ):
        load_config(overrides=[override])


@pytest.mark.parametrize(
    "override, message",
    [
        ("corpus=2024", r"corpus: Input should be a valid list \(got 2024\)"),
        ("corpus=[[a.txt]]", "corpus.0: Input should be a valid string"),
        ("corpus=~nosuchuser/books", "corpus: ~nosuchuser/books: Could not determine home directory"),
        ("s3.bucket=my bucket", "s3.bucket: 'my bucket' is not an S3 bucket name"),
        ("corpus=s3://books-*/a.txt", "corpus: 'books-\\*' is not an S3 bucket name: .* \\(and no glob\\)"),
        ("emr.log_uri=s3://EMR_logs/", "emr.log_uri: 'EMR_logs' is not an S3 bucket name"),
    ],
)
def test_odd_values_get_one_line_naming_the_field_not_a_traceback(override, message):
    with pytest.raises(ConfigError, match=rf"^invalid configuration: {message}"):
        load_config(overrides=[override])


@pytest.mark.parametrize(
    "arn",
    [
        "gpt-pipeline-alerts",
        "arn:aws:sqs:us-east-1:123456789012:gpt-pipeline-alerts",
        "arn:aws:sns:us-east-1:123456789012:gpt-pipeline-alerts.fifo",
    ],
    ids=["name", "queue", "fifo"],
)
def test_an_alert_topic_must_be_a_standard_sns_topics_arn(arn):
    with pytest.raises(
        ConfigError, match=r"^invalid configuration: alerts.sns_topic_arn: .* is not the ARN of a standard SNS topic"
    ):
        load_config(overrides=[{"alerts": {"sns_topic_arn": arn}}])


def test_an_alert_topics_region_is_its_arns_and_none_is_set_by_default():
    assert load_config().alerts.sns_topic_arn is None
    arn = "arn:aws-us-gov:sns:us-gov-west-1:123456789012:gpt-pipeline-alerts"
    assert load_config(overrides=[{"alerts": {"sns_topic_arn": arn}}]).alerts.topic_region() == "us-gov-west-1"


@pytest.mark.parametrize(
    "override",
    [
        "tokenizer.train_sample_mb=.inf",
        "train.grad_clip=.inf",
        "generate.temperature=.inf",
        "train.learning_rate=.nan",
        "emr.max_cost_usd=.inf",
        "emr.train_seconds_per_step=.inf",
    ],
)
def test_infinity_and_nan_are_refused_where_json_would_make_them_null(override):
    """A run's config.json holds no infinity: it would come back as null and fail every stage."""
    field = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^invalid configuration: {field}: Input should be a finite number"):
        load_config(overrides=[override])


def test_a_gradient_clip_past_what_float32_holds_is_refused():
    with pytest.raises(
        ConfigError, match=r"^invalid configuration: train.grad_clip: Input should be less than or equal to 1000000000"
    ):
        load_config(overrides=["train.grad_clip=1.0e39"])


@pytest.mark.parametrize("field", ["train.seed", "embedding.word2vec.seed", "generate.seed"])
def test_a_seed_is_refused_where_numpy_would_refuse_it(field):
    # keras.utils.set_random_seed (np.random.seed) takes 0 to 2**32 - 1, np.random.default_rng no negative seed.
    with pytest.raises(
        ConfigError, match=rf"^invalid configuration: {field}: Input should be greater than or equal to 0 \(got -1\)$"
    ):
        load_config(overrides=[f"{field}=-1"])
    with pytest.raises(
        ConfigError, match=rf"^invalid configuration: {field}: Input should be less than or equal to 4294967295"
    ):
        load_config(overrides=[f"{field}={2**32}"])
    assert load_config(overrides=[f"{field}={2**32 - 1}"]) is not None


def test_unknown_keys_are_rejected():
    with pytest.raises(ConfigError, match="data.window_size: unknown key"):
        load_config(overrides=["data.window_size=64"])
    with pytest.raises(ConfigError, match="optimizer: unknown key$"):
        load_config(overrides=[{"optimizer": {"name": "sgd"}}])


@pytest.mark.parametrize(
    "override, meant",
    [
        ("train.stride=0", "data.stride"),
        ("train.max_step=3", "train.max_steps"),
        ("trian.max_steps=3", "train"),
        ("embedding.word2vec.mincount=2", "embedding.word2vec.min_count"),
    ],
)
def test_an_unknown_key_names_the_setting_it_may_have_meant(override, meant):
    unknown = override.split("=")[0] if meant != "train" else "trian"
    with pytest.raises(
        ConfigError,
        match=rf"^invalid configuration: {re.escape(unknown)}: unknown key \(did you mean {re.escape(meant)}\?\)$",
    ):
        load_config(overrides=[override])


def test_missing_key_is_named():
    data = read_yaml_default()
    del data["train"]["max_steps"]
    with pytest.raises(ConfigError, match="train.max_steps: Field required"):
        validate(data)


def test_cross_field_rules():
    # A rule across fields names its fields: no section to put in front of it.
    with pytest.raises(
        ConfigError,
        match=r"^invalid configuration: data.shards \(3\) must be a multiple of train.num_workers \(2\): set "
        r"data.shards=2 or 4$",
    ):
        load_config(overrides=["data.shards=3"])
    with pytest.raises(
        ConfigError, match=r"data.shards \(1\) must be a multiple of train.num_workers \(2\): set data.shards=2$"
    ):
        load_config(overrides=["data.shards=1"])
    with pytest.raises(ConfigError, match=r"train.batch_size \(33\) must be .* \(2\): set train.batch_size=32 or 34$"):
        load_config(overrides=["train.batch_size=33"])
    with pytest.raises(  # a larger stride would skip text
        ConfigError,
        match=r"^invalid configuration: data.stride \(32\) must not exceed data.block_size \(16\): windows that far "
        r"apart leave 16 token\(s\) between them that no window predicts; set data.stride=16 or less$",
    ):
        load_config(overrides=["data.block_size=16"])
    assert load_config(overrides=["data.block_size=32", "data.stride=32"]).data.stride == 32
    with pytest.raises(ConfigError, match="embedding.dim .* divisible by model.n_head"):
        load_config(overrides=["model.n_head=5"])
    with pytest.raises(ConfigError, match="train.min_learning_rate must not exceed train.learning_rate"):
        load_config(overrides=["train.learning_rate=0.001", "train.min_learning_rate=0.002"])
    constant = load_config(overrides=["train.learning_rate=0.001", "train.min_learning_rate=0.001"]).train  # no decay
    assert constant.min_learning_rate == constant.learning_rate
    with pytest.raises(ConfigError, match=r"data.val_fraction: Input should be less than 1"):
        load_config(overrides=["data.val_fraction=1"])  # no text left to train on
    with pytest.raises(ConfigError, match="lake must be an s3:// URI for target emr"):
        load_config(overrides=["target=emr"])
    with pytest.raises(
        ConfigError, match=r"lake must be a local path or file:// URI for target local \(local Spark reads no s3://\)"
    ):
        load_config(overrides=["lake=s3://bucket/lake"])
    emr = ["target=emr", "lake=s3://bucket/lake", "emr.poke_interval_seconds=120"]
    with pytest.raises(
        ConfigError,
        match=r"emr.idle_timeout_minutes \(6\) must be at least 7: a stage's step is added up to "
        r"emr.poke_interval_seconds \(120\)",
    ):
        load_config(overrides=[*emr, "emr.idle_timeout_minutes=6"])
    assert load_config(overrides=[*emr, "emr.idle_timeout_minutes=7"]).emr.idle_timeout_minutes == 7


@pytest.mark.parametrize(
    "setting, most",
    [
        ("data.shards", 10_000),
        ("data.block_size", 65_536),
        ("generate.max_new_tokens", 100_000),
        ("generate.top_k", 1_000_000),
        ("tokenizer.train_sample_mb", 10_000),
        ("embedding.dim", 16_384),
        ("embedding.word2vec.window", 1_000),
        ("embedding.word2vec.min_count", 2**31 - 1),
        ("embedding.word2vec.max_iter", 1_000),
        ("embedding.word2vec.max_sentences", 10_000_000),
        ("model.n_layer", 256),
        ("model.mlp_ratio", 64),
    ],
)
def test_a_size_that_would_exhaust_the_machine_is_refused(setting, most):
    with pytest.raises(
        ConfigError, match=rf"^invalid configuration: {setting}: Input should be less than or equal to {most} "
    ):
        load_config(overrides=[f"{setting}={most * 10}"])


LONG = "x" * 100_000  # a file pasted into a field by mistake


@pytest.mark.parametrize(
    "overrides, start",
    [
        ([f"data.stride={LONG}"], "data.stride: Input should be a valid integer, unable to parse string as an integer"),
        ([f"data.{LONG}=1"], "data.xxx"),
        ([f"s3.bucket={LONG}"], "s3.bucket: 'xxx"),
        ([f"lake=hdfs{LONG}://a"], "lake: unsupported URI scheme hdfsxxx"),
        (["target=emr", f"lake=/{LONG}"], "lake must be an s3:// URI for target emr, got 'file:///"),
        ([f"corpus=[{'1, ' * 3000}]"], "corpus.0: Input should be a valid string (got 1); corpus.1: "),
    ],
    ids=["pydantics-message", "unknown-key", "a-checks-message", "a-uri", "a-rule-across-fields", "many-items"],
)
def test_a_value_is_repeated_cut_to_a_few_hundred_characters(overrides, start):
    with pytest.raises(ConfigError) as error:
        load_config(overrides=overrides)
    message = str(error.value)
    assert message.startswith(f"invalid configuration: {start}") and len(message) < 1000, message[:2000]


@pytest.mark.parametrize(
    "lake, prefix",
    [("s3://gpt-pipeline", "runs"), ("s3://gpt-pipeline/", "/runs/"), ("s3://gpt-pipeline/lake", "lake/runs/records")],
)
def test_a_lake_whose_run_folders_hold_the_records_is_refused(lake, prefix):
    """prune_runs removes run folders: they must not be where collect keeps records and latest pointers."""
    settings = ["target=emr", f"lake={lake}", f"s3.prefix={prefix}"]
    with pytest.raises(
        ConfigError,
        match=r"lake \(s3://gpt-pipeline.*\) keeps its run folders in s3://gpt-pipeline/.*runs/, where "
        r"s3.bucket and s3.prefix put",
    ):
        load_config(overrides=settings)
    assert load_config(
        overrides=["target=emr", f"lake={lake.rstrip('/')}/lake", "s3.prefix=runs"]
    ).s3.record_folder() == ("s3://gpt-pipeline/runs")
    assert load_config(overrides=["target=emr", "lake=s3://gpt-pipeline", "s3.prefix="]).s3.record_folder() == (
        "s3://gpt-pipeline"
    )


@pytest.mark.parametrize(
    "corpus, name",
    [
        ("../shared/data/tinyshakespeare.txt", "tinyshakespeare"),
        ("/data/books/*.txt", "books"),
        (["s3://bucket/corpora/wiki/part-*.txt", "/data/more.txt"], "wiki"),
        ("/data/Été 2020.md", "Ete-2020"),
        ("/data/books/*/*.txt", "books"),
        ("s3://bucket/books/**/*.txt", "books"),
        ("/data/books/", "books"),
        ("/data/Илиада.txt", "Илиада"),  # other scripts keep their letters: no two corpora named "corpus"
        ("/data/論語/*.txt", "論語"),
        ("/data/Les Misérables #1.txt", "Les-Miserables-1"),
        ("texts/*.txt", "texts"),
        ("*.txt", corpus_name(REPO_ROOT.as_posix())),  # relative to the repository root, as the corpus is
        ("./*.txt", corpus_name(REPO_ROOT.as_posix())),
        ("/*.txt", "corpus"),
    ],
)
def test_run_name_defaults_to_the_corpus_name(corpus, name):
    assert load_config(overrides=[{"corpus": corpus}]).run_name == name
    assert load_config(overrides=[{"corpus": corpus, "run_name": "mine"}]).run_name == "mine"


@pytest.mark.parametrize("name", ["my books", "_hidden", "-x", "a/b", "x" * 65])
def test_a_run_name_of_other_characters_is_refused_saying_which_it_takes(name):
    with pytest.raises(ConfigError, match=r"^invalid configuration: run_name: "):
        load_config(overrides=[{"run_name": name}])
    message = "must be letters, digits, '-', '_' and '.', starting with a letter or digit"
    if len(name) <= 64:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(overrides=[{"run_name": name}])


def test_a_corpus_file_named_with_glob_characters_names_the_run(tmp_path):
    (tmp_path / "plays").mkdir()
    (tmp_path / "plays" / "Hamlet [1603].txt").write_text("text\n")
    for corpus in (tmp_path / "plays" / "Hamlet [1603].txt", "file://" + str(tmp_path / "plays" / "Hamlet [1603].txt")):
        assert load_config(overrides=[{"corpus": str(corpus)}]).run_name == "Hamlet-1603"
    # No such file: a glob, named after the folder it starts in.
    assert load_config(overrides=[{"corpus": str(tmp_path / "plays" / "Hamlet [12].txt")}]).run_name == "plays"


def read_yaml_default():
    return read_yaml(DEFAULT_CONFIG_PATH)
