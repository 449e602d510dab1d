"""Stage `positional_embed`: windows/ -> embeddings/token_vectors.npy, positions.npy, meta.json.

token_vectors.npy, float32 [V, D] (V = tokenizer.vocab_size, D = embedding.dim): Spark MLlib
Word2Vec trained on training windows as sentences (token ids as words), at most
embedding.word2vec.max_sentences of them, evenly spread over the training split. Ids Word2Vec
never saw (or all ids, when embedding.word2vec.enabled is false) get seeded random rows of
standard deviation 0.02. positions.npy, float32 [T, D]: the sinusoidal table. The model adds the
two, so no per-window float tensors are ever written.
"""

from __future__ import annotations

import math
import time

import numpy as np

from pipeline import lake, run_folder
from pipeline.errors import PipelineError
from spark_jobs.spark import parts
from spark_jobs.spark.stage_app import run_stage
from spark_jobs.text import embedding_tables

STAGE = "positional_embed"


def read_sentences(every: int):
    """Executor function: a windows/ part file -> every `every`-th training window (by its index in
    the split) as a Word2Vec sentence, its token ids as words. pyarrow reads it, as every stage reads
    the lake: Spark's own reader would take a '[' or '{' in the lake's path for a glob."""

    def sentences(uri: str) -> list[tuple[list[str]]]:
        table = parts.read_parquet(uri, ["split", "idx", "ids"])
        chosen = (table.column("split").to_numpy(zero_copy_only=False) == "train") & (
            table.column("idx").to_numpy() % every == 0
        )
        return [([str(token) for token in ids],) for ids in table.column("ids").filter(chosen).to_pylist()]

    return sentences


def word2vec_vectors(spark, config, run: str, train_windows: int) -> tuple[dict[int, np.ndarray], dict, dict]:
    """Learned vectors by token id, what to record about the training, and timings."""
    from pyspark.errors import IllegalArgumentException
    from pyspark.ml.feature import Word2Vec

    settings = config.embedding.word2vec
    started = time.perf_counter()
    every = max(1, math.ceil(train_windows / settings.max_sentences))
    files = parts.stage_parquet_files(run, "window", run_folder.WINDOWS_FOLDER)
    rows = spark.sparkContext.parallelize(files, len(files)).flatMap(read_sentences(every))
    sentences = spark.createDataFrame(rows, "sentence array<string>").cache()
    n_sentences = sentences.count()
    sample_s = time.perf_counter() - started
    started = time.perf_counter()
    partitions = spark.sparkContext.defaultParallelism
    word2vec = Word2Vec(
        vectorSize=config.embedding.dim,
        windowSize=settings.window,
        minCount=settings.min_count,
        maxIter=settings.max_iter,
        seed=settings.seed,
        numPartitions=partitions,
        maxSentenceLength=config.data.block_size + 1,
        inputCol="sentence",
    )
    try:
        model = word2vec.fit(sentences)
    except IllegalArgumentException as error:
        if "vocabulary size should be > 0" not in str(error):
            raise
        raise PipelineError(
            f"embedding.word2vec.min_count ({settings.min_count}): no token occurs that often in the {n_sentences:,} "
            f"training windows Word2Vec reads (at most embedding.word2vec.max_sentences, {settings.max_sentences:,}); "
            "lower min_count or raise max_sentences"
        ) from None
    learned = {
        int(row.word): np.asarray(row.vector.toArray(), dtype=np.float32) for row in model.getVectors().collect()
    }
    sentences.unpersist()
    values = np.stack(list(learned.values())) if learned else np.zeros((0, config.embedding.dim))
    return (
        learned,
        {
            "sentences": n_sentences,
            "every_nth_window": every,
            "num_partitions": partitions,
            "learned_ids": len(learned),
            "vector_std": round(float(values.std()), 6) if learned else None,
        },
        {"sample_s": sample_s, "word2vec_s": time.perf_counter() - started},
    )


def body(spark, config, run: str) -> dict:
    tokenize = run_folder.require_stage(run, "tokenize")
    window = run_folder.require_stage(run, "window")
    vocab_size, dim, block_size = config.tokenizer.vocab_size, config.embedding.dim, config.data.block_size
    settings = config.embedding.word2vec
    learned, word2vec, timings = {}, {"enabled": settings.enabled}, {}
    if settings.enabled:
        learned, details, timings = word2vec_vectors(spark, config, run, window["splits"]["train"]["windows"])
        word2vec.update(details)
        word2vec.update(
            window=settings.window, min_count=settings.min_count, max_iter=settings.max_iter, seed=settings.seed
        )
    word2vec["coverage"] = round(len(learned) / vocab_size, 6)  # share of the V rows that Word2Vec learned
    tokenizer_vocab = tokenize["tokenizer"]["vocab_size"]

    started = time.perf_counter()
    outputs = {
        "token_vectors": lake.join(run, run_folder.TOKEN_VECTORS_PATH),
        "positions": lake.join(run, run_folder.POSITIONS_PATH),
        "meta": lake.join(run, run_folder.EMBEDDINGS_META_PATH),
    }
    embedding_tables.write_npy(
        outputs["token_vectors"], embedding_tables.token_table(vocab_size, dim, settings.seed, learned)
    )
    embedding_tables.write_npy(outputs["positions"], embedding_tables.sinusoidal(block_size, dim))
    meta = {
        "vocab_size": vocab_size,
        "tokenizer_vocab_size": tokenizer_vocab,
        "dim": dim,
        "block_size": block_size,
        "token_vectors": {
            "shape": [vocab_size, dim],
            "dtype": "float32",
            "random_row_std": embedding_tables.RANDOM_ROW_STD,
        },
        "positions": {"shape": [block_size, dim], "dtype": "float32", "kind": "sinusoidal"},
        "word2vec": word2vec,
    }
    lake.write_json(outputs["meta"], meta)
    timings["write_s"] = time.perf_counter() - started
    return {
        "word2vec": word2vec,
        "vocab_size": vocab_size,
        "dim": dim,
        "block_size": block_size,
        "timings": timings,
        "outputs": outputs,
    }


if __name__ == "__main__":
    run_stage(STAGE, body)
