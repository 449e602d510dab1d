"""The memory one training worker needs, so that a model too big for its machine is refused before
a run starts (before a cluster exists on EMR) instead of being killed mid-training.

One worker's peak resident memory is about

    RUNTIME_MB + 4 bytes x (activation copies x b*T*L*D     activations kept for the backward pass
                           + SCORE_COPIES x b*H*T*T*L      attention scores, T x T per head and layer
                           + LOGIT_COPIES x b*T*V          logits and their softmax gradient
                           + PARAMETER_COPIES x P)         weights, gradients, AdamW's two moments, ...

with b the worker's share of the batch, T the block size, L layers of width D with H heads, V the
vocabulary and P the parameters (float32 throughout). The activations' copies grow with the MLP's
width, mlp_ratio x D: ACTIVATION_COPIES at the default ratio of 4, MLP_ACTIVATION_COPIES more per
unit of ratio above it (fewer below). The constants are fitted on peaks measured by
benchmarks/train_memory.py and rounded up; the runtime (TensorFlow, XLA compiling the step, the
input pipeline) is the largest part for small models. The training windows come on top when the
worker keeps them in memory, which it does only while they fit (train_data.keep_in_memory).
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config import ConfigError, PipelineConfig

MB = 2**20
RUNTIME_MB = 1000
ACTIVATION_COPIES = 22
MLP_ACTIVATION_COPIES = 4.4
DEFAULT_MLP_RATIO = 4
SCORE_COPIES = 2
LOGIT_COPIES = 2
PARAMETER_COPIES = 6
# Set on EMR's train executors (include/emr_steps.train_resources): the memory their worker has.
WORKER_BUDGET_ENV = "GPT_PIPELINE_WORKER_MEMORY_MB"
# Left on a local machine for Spark's driver, Airflow, the S3 server and the system.
LOCAL_RESERVED_MB = 2048
# A container's memory limit, where cgroup v2 and v1 show it to the processes inside.
CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def parameters(config: PipelineConfig, vocab_size: int | None = None) -> int:
    """The decoder's parameter count (spark_jobs.model.decoder.build_decoder)."""
    vocab = vocab_size or config.tokenizer.vocab_size
    dim, mlp = config.embedding.dim, config.model.mlp_ratio
    block = (4 + 2 * mlp) * dim * dim + (9 + mlp) * dim  # attention, MLP and two norms
    embeddings = (vocab + config.data.block_size) * dim
    return embeddings + config.model.n_layer * block + 2 * dim  # the output projection is the token table


def activation_copies(mlp_ratio: int) -> float:
    """Copies of b*T*L*D the backward pass keeps: the MLP's hidden activations (mlp_ratio x D wide,
    before and after the GELU) grow with its ratio, the rest of a block's do not."""
    return ACTIVATION_COPIES + MLP_ACTIVATION_COPIES * (mlp_ratio - DEFAULT_MLP_RATIO)


def worker_peak_mb(config: PipelineConfig, vocab_size: int | None = None) -> dict[str, float]:
    """The estimate's parts and their `total`, in MB."""
    vocab = vocab_size or config.tokenizer.vocab_size
    batch = config.train.batch_size // config.train.num_workers
    length, layers, dim = config.data.block_size, config.model.n_layer, config.embedding.dim
    parts = {
        "runtime": RUNTIME_MB,
        "activations": 4 * activation_copies(config.model.mlp_ratio) * batch * length * layers * dim / MB,
        "attention_scores": 4 * SCORE_COPIES * batch * config.model.n_head * length * length * layers / MB,
        "logits": 4 * LOGIT_COPIES * batch * length * vocab / MB,
        "parameters": 4 * PARAMETER_COPIES * parameters(config, vocab) / MB,
    }
    return {**{name: round(value) for name, value in parts.items()}, "total": round(sum(parts.values()))}


def machine_memory_mb(limit_files: tuple[str, ...] = CGROUP_LIMIT_FILES) -> int:
    """This machine's memory, or the container's limit when it is lower (Docker's --memory, say)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limits = []
    for path in limit_files:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) or a huge number (v1) means no limit
            limits.append(int(text))
    return min([physical, *limits]) // MB


def local_worker_mb(config: PipelineConfig, machine_mb: int | None = None) -> int:
    """What each local worker has: the machine's memory, less what the rest of the run uses,
    shared by train.num_workers TensorFlow processes."""
    return ((machine_mb or machine_memory_mb()) - LOCAL_RESERVED_MB) // config.train.num_workers


def worker_budget_mb(config: PipelineConfig) -> int:
    """What this training worker may use: set by the EMR step for its node type, else its share of
    this machine (target local)."""
    return int(os.environ.get(WORKER_BUDGET_ENV) or local_worker_mb(config))


def check_training_fits(config: PipelineConfig, worker_mb: float, where: str) -> dict[str, float]:
    """The estimate, or a ConfigError naming the settings that make it too big for `worker_mb`."""
    need = worker_peak_mb(config)
    if need["total"] > worker_mb:
        batch = config.train.batch_size // config.train.num_workers
        raise ConfigError(
            f"training needs {describe(need, f'; a batch of {batch} x {config.data.block_size} tokens per worker')}, "
            f"more than the {worker_mb:,.0f} MB a worker has {where}: {remedy(need)}"
        )
    return need


# The settings each part of the estimate grows with, the ones that shrink it most first.
PART_SETTINGS = {
    "activations": ("train.batch_size", "data.block_size", "model.n_layer", "embedding.dim", "model.mlp_ratio"),
    "attention_scores": ("data.block_size", "train.batch_size", "model.n_head", "model.n_layer"),
    "logits": ("tokenizer.vocab_size", "train.batch_size", "data.block_size"),
    "parameters": ("tokenizer.vocab_size", "embedding.dim", "model.n_layer", "model.mlp_ratio"),
}


def remedy(need: dict[str, float]) -> str:
    """What to lower: the settings of the estimate's largest part."""
    largest = max(PART_SETTINGS, key=lambda part: need[part])
    settings = PART_SETTINGS[largest]
    return f"{largest.replace('_', ' ')} take the most; lower {', '.join(settings[:-1])} or {settings[-1]}"


def describe(need: dict[str, float], note: str = "") -> str:
    """'about 1,183 MB per worker (runtime 1,000, activations 88, ...)' for an estimate."""
    parts = ", ".join(f"{name.replace('_', ' ')} {value:,}" for name, value in need.items() if name != "total")
    return f"about {need['total']:,} MB per worker ({parts}{note})"


def check_local_training(config: PipelineConfig) -> dict[str, float]:
    """check_training_fits for workers that share this machine (target local)."""
    machine = machine_memory_mb()
    where = (
        f"on this machine ({machine:,} MB, less {LOCAL_RESERVED_MB:,} MB for the rest of the run, "
        f"shared by train.num_workers = {config.train.num_workers})"
    )
    return check_training_fits(config, local_worker_mb(config, machine), where)
