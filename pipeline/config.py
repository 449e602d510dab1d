"""The pipeline configuration's schema: PipelineConfig, one validated model used by every stage
and by the DAG, with its sections, their rules and ConfigError.

The values come from include/config/pipeline.yaml with a run's overrides: config_files.py reads
the file and validates (`load_config`), overrides.py parses `section.key=value` settings. A
problem raises ConfigError naming the field.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.errors import PipelineError, cut, shown

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_CORPUS = REPO_ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"  # pipeline.yaml's corpus


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
            f"{shown(bucket)} is not an S3 bucket name: 3 to 63 lowercase letters, digits, '.' and '-', starting and "
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
            raise ConfigError(f"unsupported URI scheme {cut(scheme)}://; use a local path, file:// or s3://")
        if scheme == "s3":
            check_bucket_name(rest.split("/", 1)[0])
        return path_or_uri
    try:
        path = Path(path_or_uri).expanduser()
    except RuntimeError as error:  # ~someone who is not a user here
        raise ValueError(f"{cut(path_or_uri)}: {error}") from None
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
    # The driver reads the sample into memory and trains BPE on it: 10 GB is far more than a merge
    # table needs, and more than many a driver holds.
    train_sample_mb: float = Field(gt=0, le=10_000)

    @property
    def sample_cap_bytes(self) -> int:
        return int(self.train_sample_mb * 1_000_000)


class DataConfig(_Section):
    block_size: int = Field(ge=2, le=65_536, description="T, tokens per model input")
    stride: int = Field(ge=1)  # at most block_size (PipelineConfig._consistent)
    val_fraction: float = Field(gt=0, lt=1)
    val_split: Literal["auto", "files", "tail"]
    pack_documents: bool
    # Each shard is a loop over every batch of windows in the export stage, and a Spark partition.
    shards: int = Field(ge=1, le=10_000)
    bad_files: Literal["fail", "skip"]


class Word2VecConfig(_Section):
    enabled: bool
    # Spark's Word2Vec visits window * 2 positions around every token, however short its sentence
    # (data.block_size + 1 tokens): a window past that costs time and adds nothing.
    window: int = Field(ge=1, le=1_000)
    min_count: int = Field(ge=1, le=2**31 - 1)  # a Java int, as Spark takes it
    max_iter: int = Field(ge=1, le=1_000)  # each a pass over every sentence
    # Cached by Spark: ten million windows are hours of Word2Vec on a cluster (docs/benchmarks.md).
    max_sentences: int = Field(ge=1, le=10_000_000)
    seed: Seed


class EmbeddingConfig(_Section):
    dim: int = Field(ge=2, le=16_384)  # GPT-3's is 12,288
    word2vec: Word2VecConfig


class ModelConfig(_Section):
    n_layer: int = Field(ge=1, le=256)  # GPT-3 has 96
    n_head: int = Field(ge=1)  # at most embedding.dim, which it divides
    dropout: float = Field(ge=0, lt=1)
    mlp_ratio: int = Field(ge=1, le=64)


FINAL_EVAL_BATCHES_PER_EVAL = 20


class TrainConfig(_Section):
    num_workers: int = Field(ge=1)
    batch_size: int = Field(ge=1)  # bounded by the memory check (spark_jobs/training/memory.py)
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
    max_new_tokens: int = Field(ge=1, le=100_000)  # per sample, one step of the model each
    strategy: Literal["greedy", "top_k", "top_p"]
    temperature: float
    top_k: int = Field(ge=1, le=1_000_000)  # no vocabulary is larger (tokenizer.vocab_size)
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


SECURITY_GROUP = r"^sg-[0-9a-f]{8,17}$"


class EmrConfig(_Section):
    release_label: str = Field(pattern=r"^emr-7\.\d+\.\d+$")
    region: str | None = Field(default=None, min_length=1)
    master_instance_type: str
    core_instance_type: str
    core_instance_count: int = Field(ge=1)
    max_core_instances: int = Field(ge=1)
    core_spot: bool
    core_ebs_gb: int | None = Field(default=None, ge=1, le=16384)
    subnet_id: str | None = Field(default=None, pattern=r"^subnet-[0-9a-f]{8,17}$")
    key_name: str | None = Field(default=None, min_length=1)
    master_security_group: str | None = Field(default=None, pattern=SECURITY_GROUP)
    slave_security_group: str | None = Field(default=None, pattern=SECURITY_GROUP)
    service_access_security_group: str | None = Field(default=None, pattern=SECURITY_GROUP)
    security_configuration: str | None = Field(default=None, min_length=1)
    log_uri: str = Field(pattern=r"^s3://")
    code_prefix: str = Field(pattern=r"^s3://")
    job_flow_role: str
    service_role: str
    idle_timeout_minutes: int = Field(ge=1, le=120)
    startup_timeout_minutes: int = Field(ge=1, le=1440)
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

    @model_validator(mode="after")
    def _core_instances_capped(self) -> EmrConfig:
        if self.core_instance_count > self.max_core_instances:
            raise ValueError(
                f"emr.core_instance_count ({self.core_instance_count}) exceeds emr.max_core_instances "
                f"({self.max_core_instances}), the deployment's cap on core nodes: lower emr.core_instance_count, "
                "or raise emr.max_core_instances in pipeline.yaml"
            )
        return self

    def shortest_idle_timeout_minutes(self) -> int:
        """Between two steps the cluster idles for up to a poke interval plus Airflow's scheduling
        delay (5 minutes allowed for it): a shorter idle timeout would end the cluster there."""
        return math.ceil((self.poke_interval_seconds + 300) / 60)


# A standard topic's ARN (a FIFO topic, ….fifo, takes only messages of a group), in any partition (aws, aws-cn, ...).
SNS_TOPIC_ARN = re.compile(r"^arn:aws(-[a-z]+)*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$")


class AlertsConfig(_Section):
    """Where a failed task of a run is reported (include/alerts.py); no alert without a topic."""

    sns_topic_arn: str | None = None
    aws_conn_id: str = Field(default="aws_default", min_length=1)

    @field_validator("sns_topic_arn")
    @classmethod
    def _standard_topic_arn(cls, value: str | None) -> str | None:
        if value is not None and not SNS_TOPIC_ARN.match(value):
            raise ValueError(
                f"{shown(value)} is not the ARN of a standard SNS topic: "
                "arn:aws:sns:<region>:<account id>:<topic name> (null: no alert)"
            )
        return value

    def topic_region(self) -> str:
        """The region the topic is in, from its ARN: SNS takes a publish only there."""
        return self.sns_topic_arn.split(":")[3]


class TrackingConfig(_Section):
    """Where runs are tracked and promoted models registered, in MLflow (include/tracking.py)."""

    uri_variable: str = Field(default="mlflow_tracking_uri", min_length=1)  # the Airflow variable holding the URI
    experiment: str = Field(default="gpt-pipeline", min_length=1, max_length=500)
    register_models: bool = True


# A standard queue's URL, as SQS gives it (https://sqs.<region>.amazonaws.com/<account id>/<name>), or a local
# endpoint's (LocalStack, moto). S3 notifies standard queues only: a FIFO queue's name, ending in .fifo, is refused.
SQS_QUEUE_URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:\d{1,5})?/\d{12}/[A-Za-z0-9_-]{1,80}$")


# Who may change a setting: a field marked DEPLOYMENT (a section as a unit) is set only by the
# deployment's config file; every other one a run may change (pipeline/deployment.py).
WHO = "who"
DEPLOYMENT = {WHO: "deployment"}


class PipelineConfig(_Section):
    run_name: str = Field(max_length=64)
    target: Literal["local", "emr"] = Field(json_schema_extra=DEPLOYMENT)
    corpus: list[str] = Field(min_length=1)
    # Where a run's corpus may come from: folders and s3:// prefixes.
    corpus_roots: list[str] = Field(
        default=[str(SHARED_CORPUS.parent)], validate_default=True, json_schema_extra=DEPLOYMENT
    )
    # The SQS queue the corpus bucket's event notifications go to: an upload starts a run (include/upload_trigger.py).
    corpus_queue: str | None = Field(default=None, json_schema_extra=DEPLOYMENT)
    lake: str = Field(json_schema_extra=DEPLOYMENT)
    keep_runs: int | None = Field(default=None, ge=1, json_schema_extra=DEPLOYMENT)
    s3: S3Config = Field(json_schema_extra=DEPLOYMENT)
    schedule: str | None = Field(default=None, json_schema_extra=DEPLOYMENT)
    tokenizer: TokenizerConfig
    data: DataConfig
    embedding: EmbeddingConfig
    model: ModelConfig
    train: TrainConfig
    generate: GenerateConfig
    local: LocalConfig = Field(default=LocalConfig(), json_schema_extra=DEPLOYMENT)
    emr: EmrConfig = Field(json_schema_extra=DEPLOYMENT)
    alerts: AlertsConfig = Field(default=AlertsConfig(), json_schema_extra=DEPLOYMENT)
    tracking: TrackingConfig = Field(default=TrackingConfig(), json_schema_extra=DEPLOYMENT)

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

    @field_validator("corpus", "corpus_roots", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("corpus", "corpus_roots")
    @classmethod
    def _uris(cls, value: list[str]) -> list[str]:
        return [to_uri(item) for item in value]

    @field_validator("corpus_queue")
    @classmethod
    def _standard_queue_url(cls, value: str | None) -> str | None:
        if value is not None and not SQS_QUEUE_URL.match(value):
            raise ValueError(
                f"{shown(value)} is not the URL of a standard SQS queue: https://sqs.<region>.amazonaws.com/"
                "<account id>/<queue name>, as `aws sqs get-queue-url` prints it (null: no retraining on upload)"
            )
        return value

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
        if self.data.stride > self.data.block_size:
            raise ValueError(
                f"data.stride ({self.data.stride}) must not exceed data.block_size ({self.data.block_size}): windows "
                f"that far apart leave {self.data.stride - self.data.block_size} token(s) between them that no window "
                f"predicts; set data.stride={self.data.block_size} or less"
            )
        if self.train.min_learning_rate > self.train.learning_rate:
            raise ValueError("train.min_learning_rate must not exceed train.learning_rate")
        if self.target == "emr" and not self.lake.startswith("s3://"):
            raise ValueError(f"lake must be an s3:// URI for target emr, got {shown(self.lake)}")
        if self.target == "local" and self.lake.startswith("s3://"):
            raise ValueError(
                f"lake must be a local path or file:// URI for target local (local Spark reads no s3://), "
                f"got {shown(self.lake)}"
            )
        runs, records = f"{self.lake}/runs", self.s3.record_folder()
        if runs == records or records.startswith(runs + "/"):
            raise ValueError(
                f"lake ({cut(self.lake)}) keeps its run folders in {cut(runs)}/, where s3.bucket and s3.prefix put "
                "the runs' records and latest pointers: prune_runs and collect would remove and overwrite each other's "
                "files; give the lake another prefix"
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
