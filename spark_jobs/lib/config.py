"""The pipeline configuration: one validated model used by every stage and by the DAG.

Defaults live in include/config/pipeline.yaml. `load_config` applies overrides
(dotted `section.key=value` strings or a nested dict) and validates the result; any problem
raises ConfigError naming the field.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import math
import os
import posixpath
import re
import types
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spark_jobs.lib.errors import PipelineError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG_PATH = REPO_ROOT / "include" / "config" / "pipeline.yaml"
SHARED_CORPUS = REPO_ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"  # pipeline.yaml's corpus


def defaults_path() -> Path:
    """The defaults file: GPT_PIPELINE_CONFIG when set (e.g. a copy with target: emr), else pipeline.yaml."""
    return Path(os.environ.get("GPT_PIPELINE_CONFIG") or DEFAULT_CONFIG_PATH)


# Byte-level BPE starts from 256 byte symbols; the special tokens come on top.
SPECIAL_TOKENS = ("<|endoftext|>",)
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + 1


# A random seed: numpy's legacy seeding (np.random.seed, and so keras.utils.set_random_seed) takes
# 0 to 2**32 - 1, np.random.default_rng no negative seed; Spark's Word2Vec and TensorFlow take more.
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]

URI_SCHEMES = ("file", "s3")  # what the lake reads and writes (pyarrow) and Spark reads on EMR


S3_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def check_bucket_name(bucket: str) -> str:
    if not S3_BUCKET_NAME.match(bucket):
        raise ValueError(
            f"{bucket!r} is not an S3 bucket name: 3 to 63 lowercase letters, digits, '.' and '-', starting and "
            "ending with a letter or digit (and no glob)"
        )
    return bucket


def to_uri(path_or_uri: str) -> str:
    """A URI stays as it is; a local path (relative to the repository root) becomes file://."""
    if not path_or_uri.strip():
        raise ValueError("must not be empty")
    if "://" in path_or_uri:
        scheme, rest = path_or_uri.split("://", 1)
        if scheme not in URI_SCHEMES:
            raise ConfigError(f"unsupported URI scheme {scheme}://; use a local path, file:// or s3://")
        if scheme == "s3":
            check_bucket_name(rest.split("/", 1)[0])
        return path_or_uri
    try:
        path = Path(path_or_uri).expanduser()
    except RuntimeError as error:  # ~someone who is not a user here
        raise ValueError(f"{path_or_uri}: {error}") from None
    return "file://" + (path if path.is_absolute() else REPO_ROOT / path).resolve().as_posix()


def is_glob(name: str) -> bool:
    """Whether a path component is a glob: `*`, `?` or `[…]` in it."""
    return any(char in name for char in "*?[")


def is_local_file_or_folder(path_or_uri: str) -> bool:
    """Whether a path or URI names a file or folder on local disk as it is, glob characters
    ('Hamlet [1603].txt') included."""
    try:
        uri = to_uri(path_or_uri)
    except ValueError:
        return False
    return uri.startswith("file://") and os.path.exists(uri.removeprefix("file://"))


def corpus_name(corpus: str) -> str:
    """A run name from a corpus path, glob or URI: the file name without its extension, or the
    name of the folder a glob starts in ("data/books/*.txt" and "data/books/*/*.txt" -> "books").
    A local name holding a glob's characters is a glob only when no such file or folder exists,
    as the corpus listing takes it (an S3 one always is: the config is read without S3 at hand).
    A relative path is taken from the repository root, as the corpus is ("*.txt" -> its name)."""
    if "://" not in corpus and not corpus.startswith(("/", "~")):
        corpus = os.path.normpath(REPO_ROOT / corpus)
    path = corpus.split("://", 1)[-1].rstrip("/")
    components = path.split("/")
    globbed = [] if is_local_file_or_folder(corpus) else [i for i, part in enumerate(components) if is_glob(part)]
    name = components[globbed[0] - 1] if globbed else components[-1]
    # Latin letters lose their accents (Misérables -> Miserables); other scripts' letters stay (Илиада, 論語).
    stem = unicodedata.normalize("NFC", posixpath.splitext(name)[0])
    name = "".join(unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode() or char for char in stem)
    name = re.sub(r"[^\w.-]+", "-", name).lstrip("_.-").rstrip("-")
    return name[:40] or "corpus"


def nearest_multiples(value: int, factor: int) -> str:
    """The multiples of factor either side of value, as a suggestion ("6 or 9")."""
    below = value // factor * factor
    return f"{below} or {below + factor}" if below else str(factor)


RUN_NAME = re.compile(r"[^\W_][\w.-]*")  # letters of any script, digits, '_', '.', '-'


class ConfigError(PipelineError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or impossible."""


class _Section(BaseModel):
    # No infinity or NaN: JSON has neither (a run's config.json would hold null), and no knob means it.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class S3Config(_Section):
    bucket: str
    prefix: str = "runs"
    promote: Literal["always", "if_better"] = "always"

    @field_validator("bucket")
    @classmethod
    def _bucket_name(cls, value: str) -> str:
        return check_bucket_name(value)

    def record_folder(self) -> str:
        """s3://{bucket}/{prefix}: where collect puts the runs' records and latest pointers."""
        return posixpath.join(f"s3://{self.bucket}", self.prefix.strip("/")).rstrip("/")


class TokenizerConfig(_Section):
    vocab_size: int = Field(ge=MIN_VOCAB_SIZE, le=1_000_000)
    min_frequency: int = Field(ge=1)
    train_sample_mb: float = Field(gt=0)

    @property
    def sample_cap_bytes(self) -> int:
        return int(self.train_sample_mb * 1_000_000)


class DataConfig(_Section):
    block_size: int = Field(ge=2, description="T, tokens per model input")
    stride: int = Field(ge=1)
    val_fraction: float = Field(gt=0, lt=1)
    val_split: Literal["auto", "files", "tail"]
    pack_documents: bool
    shards: int = Field(ge=1)
    bad_files: Literal["fail", "skip"]


class Word2VecConfig(_Section):
    enabled: bool
    window: int = Field(ge=1)
    min_count: int = Field(ge=1)
    max_iter: int = Field(ge=1)
    max_sentences: int = Field(ge=1)
    seed: Seed


class EmbeddingConfig(_Section):
    dim: int = Field(ge=2)
    word2vec: Word2VecConfig


class ModelConfig(_Section):
    n_layer: int = Field(ge=1)
    n_head: int = Field(ge=1)
    dropout: float = Field(ge=0, lt=1)
    mlp_ratio: int = Field(ge=1)


FINAL_EVAL_BATCHES_PER_EVAL = 20


class TrainConfig(_Section):
    num_workers: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    max_steps: int = Field(ge=1)
    learning_rate: float = Field(gt=0)
    min_learning_rate: float = Field(ge=0)
    warmup_steps: int = Field(ge=0)
    weight_decay: float = Field(ge=0)
    grad_clip: float = Field(gt=0, le=1e9)  # 1e9 clips nothing; far larger ones overflow float32 to nan
    eval_interval: int = Field(ge=1)
    log_interval: int = Field(ge=1)
    eval_batches: int = Field(ge=1)
    checkpoint_interval: int = Field(ge=1)
    seed: Seed

    @property
    def final_eval_max_batches(self) -> int:
        """The evaluation after the last step covers the whole validation split, up to this many
        batches (200 at the defaults, as many as nanoGPT's estimate): a large corpus's split would
        otherwise take hours, which the train step's time limit could not foresee."""
        return FINAL_EVAL_BATCHES_PER_EVAL * self.eval_batches


class GenerateConfig(_Section):
    prompt: str  # empty: a new document, from <|endoftext|>
    max_new_tokens: int = Field(ge=1)
    strategy: Literal["greedy", "top_k", "top_p"]
    temperature: float
    top_k: int = Field(ge=1)
    top_p: float = Field(gt=0, le=1)
    seed: Seed
    num_samples: int = Field(default=1, ge=1, le=100)

    @field_validator("temperature")
    @classmethod
    def _temperature_above_zero(cls, value: float) -> float:
        if not value > 0:  # NaN included
            raise ValueError("must be above 0; strategy greedy takes the most likely token every time")
        return value


class LocalConfig(_Section):
    """Target local only (docs/network.md)."""

    allow_exposed_workers: bool = False


class EmrConfig(_Section):
    release_label: str = Field(pattern=r"^emr-7\.\d+\.\d+$")
    region: str | None = Field(default=None, min_length=1)
    master_instance_type: str
    core_instance_type: str
    core_instance_count: int = Field(ge=1)
    core_spot: bool
    core_ebs_gb: int | None = Field(default=None, ge=1, le=16384)
    subnet_id: str | None = Field(default=None, pattern=r"^subnet-[0-9a-f]{8,17}$")
    key_name: str | None = Field(default=None, min_length=1)
    security_configuration: str | None = Field(default=None, min_length=1)
    log_uri: str = Field(pattern=r"^s3://")
    code_prefix: str = Field(pattern=r"^s3://")
    job_flow_role: str
    service_role: str
    idle_timeout_minutes: int = Field(ge=1, le=10080)
    max_cost_usd: float | None = Field(default=None, gt=0)
    tags: dict[str, str] = {}
    aws_conn_id: str = Field(min_length=1)
    step_timeout_minutes: int = Field(ge=1)
    train_seconds_per_step: float = Field(gt=0)
    poke_interval_seconds: int = Field(ge=1)

    @field_validator("log_uri", "code_prefix")
    @classmethod
    def _s3_uri(cls, value: str) -> str:
        return to_uri(value)

    def shortest_idle_timeout_minutes(self) -> int:
        """Between two steps the cluster idles for up to a poke interval plus Airflow's scheduling
        delay (5 minutes allowed for it): a shorter idle timeout would end the cluster there."""
        return math.ceil((self.poke_interval_seconds + 300) / 60)


class PipelineConfig(_Section):
    run_name: str = Field(max_length=64)
    target: Literal["local", "emr"]
    corpus: list[str] = Field(min_length=1)
    lake: str
    keep_runs: int | None = Field(default=None, ge=1)
    s3: S3Config
    schedule: str | None = None
    tokenizer: TokenizerConfig
    data: DataConfig
    embedding: EmbeddingConfig
    model: ModelConfig
    train: TrainConfig
    generate: GenerateConfig
    local: LocalConfig = LocalConfig()
    emr: EmrConfig

    @model_validator(mode="before")
    @classmethod
    def _run_name_from_corpus(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("run_name") and data.get("corpus"):
            corpus = data["corpus"]
            first = corpus[0] if isinstance(corpus, list) else corpus
            # A corpus that is not text fails its own field's check; no second complaint here.
            data = {**data, "run_name": corpus_name(first) if isinstance(first, str) else "corpus"}
        return data

    @field_validator("run_name")
    @classmethod
    def _run_name_characters(cls, value: str) -> str:
        if not RUN_NAME.fullmatch(value):
            raise ValueError("must be letters, digits, '-', '_' and '.', starting with a letter or digit")
        return value

    @field_validator("corpus", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("corpus")
    @classmethod
    def _corpus_uris(cls, value: list[str]) -> list[str]:
        return [to_uri(item) for item in value]

    @field_validator("lake")
    @classmethod
    def _lake_uri(cls, value: str) -> str:
        return to_uri(value).rstrip("/")

    @model_validator(mode="after")
    def _consistent(self) -> PipelineConfig:
        if self.embedding.dim % self.model.n_head:
            raise ValueError(
                f"embedding.dim ({self.embedding.dim}) must be divisible by model.n_head ({self.model.n_head})"
            )
        for name, value in (("data.shards", self.data.shards), ("train.batch_size", self.train.batch_size)):
            if value % self.train.num_workers:
                raise ValueError(
                    f"{name} ({value}) must be a multiple of train.num_workers ({self.train.num_workers}): "
                    f"set {name}={nearest_multiples(value, self.train.num_workers)}"
                )
        if self.train.min_learning_rate > self.train.learning_rate:
            raise ValueError("train.min_learning_rate must not exceed train.learning_rate")
        if self.target == "emr" and not self.lake.startswith("s3://"):
            raise ValueError(f"lake must be an s3:// URI for target emr, got {self.lake!r}")
        if self.target == "local" and self.lake.startswith("s3://"):
            raise ValueError(
                f"lake must be a local path or file:// URI for target local (local Spark reads no s3://), "
                f"got {self.lake!r}"
            )
        runs, records = f"{self.lake}/runs", self.s3.record_folder()
        if runs == records or records.startswith(runs + "/"):
            raise ValueError(
                f"lake ({self.lake}) keeps its run folders in {runs}/, where s3.bucket and s3.prefix put the runs' "
                "records and latest pointers: prune_runs and collect would remove and overwrite each other's files; "
                "give the lake another prefix"
            )
        if self.target == "emr" and self.emr.idle_timeout_minutes < self.emr.shortest_idle_timeout_minutes():
            raise ValueError(
                f"emr.idle_timeout_minutes ({self.emr.idle_timeout_minutes}) must be at least "
                f"{self.emr.shortest_idle_timeout_minutes()}: a stage's step is added up to emr.poke_interval_seconds "
                f"({self.emr.poke_interval_seconds}) and Airflow's scheduling delay after the one before ends, and the "
                "cluster would terminate itself in between"
            )
        if self.target == "emr" and self.emr.core_instance_count < self.train.num_workers:
            raise ValueError(
                f"emr.core_instance_count ({self.emr.core_instance_count}) must be at least train.num_workers "
                f"({self.train.num_workers}): each TensorFlow worker needs its own core node"
            )
        return self

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key" + "".join(f" (did you mean {known}?)" for known in closest_settings(field)[:1])
        elif "input" in item and not isinstance(item["input"], dict):
            message += f" (got {item['input']!r})"
        # A check across fields (loc empty) names its fields itself.
        lines.append(f"{field}: {message}" if field else message)
    return "invalid configuration: " + "; ".join(lines)


# Read from pipeline.yaml when Airflow parses the DAG, so a run (its form, SET) cannot change them:
# they shape the DAG itself (its tasks, its schedule, the model asset's URI).
DAG_SETTINGS = ("target", "schedule", "s3.bucket", "s3.prefix")


def setting(data: dict, name: str) -> Any:
    """The value of a dotted setting name in a config's data (None where there is none):
    setting(data, "emr.region")."""
    return functools.reduce(
        lambda section, key: section.get(key) if isinstance(section, dict) else None, name.split("."), data
    )


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.max_steps=200' -> (['train', 'max_steps'], 200). Values are parsed as YAML; what YAML
    cannot parse (e.g. schedule=@weekly) stays a string, and so does an unquoted value with a '#'
    in it (lake=/data/lake #2), which YAML would cut at the '#' as a comment. A text setting takes
    the text as typed whatever YAML makes of it: generate.prompt=yes is 'yes', not True, and
    generate.prompt=ROMEO: Hark is not a mapping."""
    key, sep, raw = text.partition("=")
    path, raw = key.strip().split("."), raw.strip()
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form section.key=value (quote a value that holds spaces)")
    if "#" in raw and raw[:1] not in ("'", '"'):
        return path, raw
    try:
        value = parse_yaml(raw) if raw else ""
    except yaml.YAMLError:
        return path, raw
    if value is not None and not isinstance(value, str) and _takes_text(path):
        return path, raw
    return path, value


def _takes_text(path: list[str]) -> bool:
    """Whether the setting at path takes text (str, or str or None): a value for it is never read
    as a number, a boolean or a collection."""
    annotation = field_annotation(path)
    if get_origin(annotation) in (Union, types.UnionType):
        return str in get_args(annotation)
    return annotation is str


def field_annotation(path: list[str]) -> Any:
    """The type of the setting at path (["train", "learning_rate"] -> float), None for no such setting."""
    section: type[BaseModel] = PipelineConfig
    for part in path[:-1]:
        field = section.model_fields.get(part)
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        section = field.annotation
    field = section.model_fields.get(path[-1])
    return None if field is None else field.annotation


def config_names(section: type[BaseModel] = PipelineConfig, prefix: str = "") -> list[str]:
    """The dotted name of every section and setting: ["run_name", ..., "train", "train.learning_rate", ...]."""
    names = []
    for name, field in section.model_fields.items():
        names.append(f"{prefix}{name}")
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            names += config_names(field.annotation, f"{prefix}{name}.")
    return names


def closest_settings(unknown: str) -> list[str]:
    """Settings an unknown name may have meant: the same key in another section (train.stride ->
    data.stride), else a name spelled alike (train.max_step -> train.max_steps)."""
    names = config_names()
    key = unknown.rsplit(".", 1)[-1]
    return [name for name in names if name.rsplit(".", 1)[-1] == key] or difflib.get_close_matches(unknown, names, n=1)


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    """A command line's --set: one or more section.key=value overrides, and --set may be repeated."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="extend",
        nargs="+",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config overrides: --set train.max_steps=500 data.block_size=64",
    )


def apply_overrides(data: dict, overrides: list[str | dict] | dict | None) -> dict:
    """Merge overrides into raw config data: `section.key=value` strings and/or nested dicts.
    Unknown keys are left for validation to reject."""
    if not overrides:
        return data
    if isinstance(overrides, dict):
        return _deep_merge(data, overrides)
    for text in overrides:
        if isinstance(text, dict):
            data = _deep_merge(data, text)
            continue
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return data


def _deep_merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def validate(data: dict) -> PipelineConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"configuration must be a mapping, got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice in one mapping. PyYAML keeps the last one silently,
    so a second `train:` section at the end of the file would replace the first one whole."""

    def construct_mapping(self, node, deep=False):
        self.flatten_mapping(node)
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key: the base class names it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice in the same section", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(text_or_file) -> Any:
    return yaml.load(text_or_file, Loader=_StrictLoader)


def read_yaml(path: Path | str) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        with path.open(encoding="utf-8") as file:  # so that an error names the file and line
            return parse_yaml(file) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ConfigError(f"config file {path} is not valid YAML: {error}") from None


def load_config(path: Path | str | None = None, overrides: list[str] | dict | None = None) -> PipelineConfig:
    """Read the YAML defaults, apply overrides, validate."""
    data = read_yaml(path or defaults_path())
    return validate(apply_overrides(data, overrides))


def from_json(text: str) -> PipelineConfig:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"resolved config is not valid JSON: {error}") from None
    return validate(data)
