"""One TensorFlow training worker: `python -m spark_jobs.training.trainer --run-dir URI --threads N --result FILE`.

The train stage starts one of these per barrier task with TF_CONFIG naming all workers. They
train one model together under MultiWorkerMirroredStrategy: each worker reads its own shards,
the gradients are summed across workers every step, so every worker holds the same weights.
With Keras 3, `model.fit` fails under multi-worker MirroredStrategy (keras-team/keras#20585), so
the loop is written out here: an XLA-compiled forward/backward pass inside `strategy.run`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import psutil

from pipeline import lake, log, run_folder
from pipeline.config import PipelineConfig
from pipeline.errors import PipelineError
from spark_jobs.text import embedding_tables
from spark_jobs.text.sliding_windows import SPLITS
from spark_jobs.training import backups, input_pipeline, memory, tensorboard_log
from spark_jobs.training.train_stats import IntervalStats, StepTimes, epochs_csv, read_steps_csv, steps_csv

# Exit code of a worker stopped by its settings (e.g. a diverging loss): a retry would fail the
# same way, so the stage fails at once instead of Spark retrying the barrier stage.
SETTINGS_FAILURE_EXIT = 3
# By its module's name, also when it runs as __main__ (python -m): under spark_jobs (lib/log.py).
logger = logging.getLogger("spark_jobs.training.trainer")


# Training settings that only say how often the loop reports, evaluates and backs up: they change
# no weight and no optimizer state, so a backup taken with other values of them is resumed.
LOOP_SETTINGS = {"log_interval", "eval_interval", "eval_batches", "checkpoint_interval"}


def resume_settings(config: PipelineConfig) -> dict:
    """The settings that shape the weights and the optimizer's state step by step: the text, its
    tokens and windows, the embedding, the model, and every training setting but the loop's."""
    settings = config.model_dump(include={"corpus", "tokenizer", "data", "embedding", "model"})
    settings["train"] = config.train.model_dump(exclude=LOOP_SETTINGS)
    return settings


def fingerprint(config: PipelineConfig, manifest: dict) -> str:
    """What a backup must match to be resumed: the same resume settings and TFRecords."""
    return hashlib.sha256(json.dumps([resume_settings(config), manifest], sort_keys=True).encode()).hexdigest()[:16]


def weights_digest(model) -> str:
    digest = hashlib.sha256()
    for weights in model.get_weights():
        digest.update(np.ascontiguousarray(weights).tobytes())
    return digest.hexdigest()[:16]


def build_optimizer(config: PipelineConfig):
    import keras

    class AllReducedAdamW(keras.optimizers.AdamW):
        """AdamW fed gradients the step has already summed across workers (so the step can clip
        by the global norm of the whole batch's gradient; Keras would clip each worker's part)."""

        def _all_reduce_sum_gradients(self, grads_and_vars):
            return list(grads_and_vars)

    train = config.train
    # Warm-up from learning_rate / (warmup_steps + 1) at the first step, as nanoGPT's: a first step at 0 would be lost.
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=train.learning_rate / (train.warmup_steps + 1),
        decay_steps=max(1, train.max_steps - train.warmup_steps),
        alpha=train.min_learning_rate / train.learning_rate,
        warmup_target=train.learning_rate,
        warmup_steps=train.warmup_steps,
    )
    optimizer = AllReducedAdamW(learning_rate=schedule, weight_decay=train.weight_decay, beta_2=0.99)
    # As in GPT-2 training: no decay for biases and norm parameters.
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer, schedule


class Worker:
    """The model, optimizer, data and compiled steps of one worker."""

    def __init__(self, config: PipelineConfig, run: str, strategy, local_dir: Path):
        import tensorflow as tf

        from spark_jobs.model.decoder import decoder_for, initialise_embedding

        self.tf, self.config, self.run, self.strategy = tf, config, run, strategy
        resolver = strategy.cluster_resolver
        self.index = resolver.task_id if resolver and resolver.task_id is not None else 0
        self.workers = strategy.num_replicas_in_sync
        self.is_chief = self.index == 0
        self.manifest = input_pipeline.read_manifest(run, config)
        self.block_size = self.manifest["block_size"]
        self.per_worker_batch = config.train.batch_size // self.workers
        self.files = files = {
            split: input_pipeline.local_shards(
                run, input_pipeline.worker_shards(self.manifest, split, self.index, self.workers), local_dir
            )
            for split in SPLITS
        }
        with strategy.scope():
            self.model = decoder_for(config, vocab_size=self.manifest["vocab_size"], block_size=self.block_size)
            initialise_embedding(self.model, *read_embedding_tables(config, run))
            self.optimizer, self.schedule = build_optimizer(config)
            self.optimizer.build(self.model.trainable_variables)
        # What a backup must have been taken with to be resumed, and the settings, to name any that differ.
        self.identity = {"fingerprint": fingerprint(config, self.manifest), "settings": resume_settings(config)}
        self.warnings: list[str] = []
        backup = backups.resume(run, self.model, self.optimizer, self.identity, self.warn)
        self.start_step = backup["step"] if backup else 0
        self.rows = backup["rows"] if backup else []
        self.points = self.earlier_points(self.start_step) if self.is_chief else []
        self.board = tensorboard_log.TrainingLog(run, resumed=backup is not None) if self.is_chief else None
        windows = sum(self.manifest["splits"][split]["windows"] for split in SPLITS) // self.workers
        self.in_memory = input_pipeline.keep_in_memory(windows, self.block_size, self.memory_room_bytes())
        if not self.in_memory and self.is_chief:
            logger.info(
                "%s windows per worker do not fit in memory: every pass reads them from local disk", f"{windows:,}"
            )
        self.train_iterator = self._distributed(
            # A seed per worker: with equal shard sizes one seed would put the same positions of
            # every worker's shards (often overlapping neighbour windows) in the same batch.
            lambda: input_pipeline.train_batches(
                files["train"],
                self.block_size,
                self.per_worker_batch,
                config.train.seed + self.index,
                self.start_step,
                self.in_memory,
            )
        )
        self.val_iterator = self._distributed(
            lambda: input_pipeline.eval_batches(files["val"], self.block_size, self.per_worker_batch, self.in_memory)
        )
        self._compile_steps()

    def warn(self, message: str) -> None:
        """A warning in the stage's log: the chief's at once on stderr, and through the workers'
        results in the driver's log and the stage's stats when the training ends."""
        self.warnings.append(message)
        if self.is_chief:
            logger.warning(message)

    def memory_room_bytes(self) -> float:
        """What the model leaves of this worker's memory: its budget or what is free, if less."""
        need_mb = memory.worker_peak_mb(self.config, self.manifest["vocab_size"])["total"]
        budget_mb = min(memory.worker_budget_mb(self.config), psutil.virtual_memory().available / memory.MB)
        return (budget_mb - need_mb) * memory.MB

    def _distributed(self, make_dataset):
        """An iterator feeding this worker's own batches (already cut to its share) to its replica."""
        return iter(self.strategy.distribute_datasets_from_function(lambda _: make_dataset()))

    def _compile_steps(self):
        tf, model, workers = self.tf, self.model, self.workers
        clip = self.config.train.grad_clip

        def token_losses_and_hits(logits, targets):
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
            return losses, tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), targets), tf.float32)

        @tf.function(jit_compile=True)
        def forward_backward(inputs, targets):
            with tf.GradientTape() as tape:
                losses, hits = token_losses_and_hits(model(inputs, training=True), targets)
                share = (
                    tf.reduce_mean(losses) / workers
                )  # summed over workers: the gradient of the whole batch's mean loss
            grads = tape.gradient(share, model.trainable_variables)
            # Dense (the embedding's gradient comes as IndexedSlices), for one packed all-reduce.
            return share, tf.reduce_mean(hits) / workers, [tf.convert_to_tensor(g) for g in grads]

        @tf.function(jit_compile=True)
        def forward(inputs, targets, weights):
            """Sums over the windows, each counted with its weight (0: padding), and the tokens counted."""
            losses, hits = token_losses_and_hits(model(inputs, training=False), targets)
            weights = tf.broadcast_to(weights[:, None], tf.shape(losses))
            return tf.reduce_sum(losses * weights), tf.reduce_sum(hits * weights), tf.reduce_sum(weights)

        def replica_train_step(inputs, targets):
            loss, accuracy, grads = forward_backward(inputs, targets)
            # One packed all-reduce: the batch-mean gradient and the batch's loss and accuracy.
            summed = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, [*grads, loss, accuracy]
            )
            grads, norm = tf.clip_by_global_norm(summed[:-2], clip)
            self.optimizer.apply(grads, model.trainable_variables)
            return summed[-2], summed[-1], norm

        def replica_eval_step(inputs, targets, weights):
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, list(forward(inputs, targets, weights))
            )

        def local(values):
            return [self.strategy.experimental_local_results(value)[0] for value in values]

        self.train_step = tf.function(
            lambda: local(self.strategy.run(replica_train_step, args=next(self.train_iterator)))
        )
        self.eval_step_of = lambda iterator: tf.function(
            lambda: local(self.strategy.run(replica_eval_step, args=next(iterator)))
        )
        self.eval_step = self.eval_step_of(self.val_iterator)

    def evaluate(self, eval_step, batches: int) -> tuple[float, float]:
        """Mean loss and accuracy per predicted token over `batches` batches of every worker."""
        loss, hits, tokens = np.sum([[float(value) for value in eval_step()] for _ in range(batches)], axis=0)
        return float(loss / tokens), float(hits / tokens)

    def final_eval_batches(self) -> int:
        """Batches per worker for one pass over the whole validation split, up to 20 x train.eval_batches."""
        windows = input_pipeline.most_windows_per_worker(self.manifest, "val", self.workers)
        return min(max(1, math.ceil(windows / self.per_worker_batch)), self.config.train.final_eval_max_batches)

    def evaluate_whole_split(self) -> tuple[float, float]:
        """Every validation window once (within the limit of final_eval_batches), whatever passes came before."""
        batches = self.final_eval_batches()
        iterator = self._distributed(
            lambda: input_pipeline.whole_split_batches(
                self.files["val"], self.block_size, self.per_worker_batch, batches
            )
        )
        return self.evaluate(self.eval_step_of(iterator), batches)

    def train(self) -> dict:
        train = self.config.train
        stats, interval_started = IntervalStats(), time.perf_counter()
        loop_started, times = time.perf_counter(), StepTimes()
        for step in range(self.start_step + 1, train.max_steps + 1):
            started = time.perf_counter()
            loss, accuracy, norm = (float(value) for value in self.train_step())
            seconds = time.perf_counter() - started
            timed = seconds if times.add(seconds) else None
            stats.add_step(loss, accuracy, norm, timed)
            if not math.isfinite(loss):  # the same on every worker: the loss is all-reduced
                raise PipelineError(f"training loss became {loss} at step {step}; lower train.learning_rate")
            if self.board:
                self.board.add_step(norm, timed)
            if self.is_chief and (step % train.log_interval == 0 or step == train.max_steps):
                rate = self.tokens_per_step / seconds
                logger.info("step %d/%d loss %.4f %s tokens/s", step, train.max_steps, loss, f"{rate:,.0f}")
                self.report_progress(step, loss, rate, times.per_step() or seconds)
                learning_rate = float(self.schedule(step - 1))
                self.board.progress(step, loss, learning_rate, self.tokens_per_step)
                self.points.append(
                    {"step": step, "train_loss": loss, "learning_rate": learning_rate, "tokens_per_s": rate}
                )
            last = step == train.max_steps
            if step % train.eval_interval == 0 or last:
                self.record_interval(step, stats, time.perf_counter() - interval_started, last)
                stats, interval_started = IntervalStats(), time.perf_counter()
            if step % train.checkpoint_interval == 0 and not last and self.is_chief:
                self.board.events.upload()  # first: a run resumed from the backup has its log up to it
                backups.save_backup(self.run, step, self.model, self.optimizer, self.rows, self.identity)
        return self.summary(time.perf_counter() - loop_started, times)

    def earlier_points(self, start_step: int) -> list[dict]:
        """The training curve's points up to the step a resumed training starts from."""
        uri = lake.join(self.run, run_folder.STEPS_CSV_PATH)
        return read_steps_csv(lake.read_text(uri), start_step) if start_step and lake.exists(uri) else []

    def report_progress(self, step: int, loss: float, tokens_per_s: float, seconds_per_step: float) -> None:
        """progress/train.json in the run folder: how far training is, for whoever watches the run."""
        last = self.config.train.max_steps
        progress = {
            "step": step,
            "max_steps": last,
            "loss": round(loss, 4),
            "tokens_per_s": round(tokens_per_s),
            "seconds_left": round((last - step) * seconds_per_step),
            "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            lake.write_json(lake.join(self.run, run_folder.progress_path("train")), progress)
        except OSError as error:  # progress is for watching: a failed write must not stop training
            logger.info("progress not written: %s", error)

    @property
    def tokens_per_step(self) -> int:
        return self.config.train.batch_size * self.block_size

    def record_interval(self, step: int, stats: IntervalStats, seconds: float, last: bool) -> None:
        """Evaluate (on the whole validation split after the last step, within a limit) and add
        the interval's row to stats/epochs.csv."""
        split = self.manifest["splits"]["val"]
        val_loss, val_accuracy = (
            self.evaluate_whole_split() if last else self.evaluate(self.eval_step, self.config.train.eval_batches)
        )
        row = stats.row(
            epoch=len(self.rows) + 1,
            step=step,
            duration_s=seconds,
            tokens_per_step=self.tokens_per_step,
            learning_rate=float(self.schedule(step - 1)),
            val_loss=val_loss,
            val_accuracy=val_accuracy,
            tokens=split["tokens"],
            chars=split["chars"],
            workers=self.workers,
            resumed_from_step=self.start_step,
        )
        self.rows.append(row)
        if self.is_chief:
            self.board.validation(row)
            rate = row["tokens_per_s"]  # None after the compiling step alone
            logger.info(
                "step %d: val loss %.4f, %.4f nats/char%s",
                step,
                val_loss,
                row["val_nats_per_char"],
                f", {rate:,.0f} tokens/s" if rate is not None else "",
            )
            lake.write_text(lake.join(self.run, run_folder.EPOCHS_CSV_PATH), epochs_csv(self.rows))
            lake.write_text(lake.join(self.run, run_folder.STEPS_CSV_PATH), steps_csv(self.points))

    def summary(self, wall_s: float, times: StepTimes) -> dict:
        """This worker's result: the attempt's steps and speed (its first step, which compiles, apart),
        and the final evaluation."""
        final = self.rows[-1] if self.rows else {}
        return {
            "worker": self.index,
            "workers": self.workers,
            "resumed_from_step": self.start_step,
            "steps": self.config.train.max_steps - self.start_step,
            "train_wall_s": round(wall_s, 3),
            "compile_s": round(times.compile_s, 3) if times.compile_s is not None else None,
            "tokens_per_s": round(times.steps * self.tokens_per_step / times.seconds, 1) if times.steps else None,
            "final_val_loss": final.get("val_loss"),
            "final_val_nats_per_char": final.get("val_nats_per_char"),
            "final_val_accuracy": final.get("val_accuracy"),
            "parameters": int(sum(np.prod(w.shape) for w in self.model.trainable_weights)),
            "windows_in_memory": self.in_memory,
            "optimizer_iterations": int(self.optimizer.iterations.numpy()),
            "warnings": self.warnings,
        }

    def save(self) -> None:
        tokenizer = lake.read_bytes(lake.join(self.run, run_folder.TOKENIZER_PATH))
        backups.save_model(self.run, self.model, tokenizer, self.config.generate, self.is_chief)
        if self.board:
            self.board.events.close()


def read_embedding_tables(config: PipelineConfig, run: str) -> tuple[np.ndarray | None, np.ndarray]:
    """The Word2Vec token vectors (None when disabled) and the position table."""

    def load(path: str) -> np.ndarray:
        return embedding_tables.read_npy(lake.join(run, path))

    token_vectors = load(run_folder.TOKEN_VECTORS_PATH) if config.embedding.word2vec.enabled else None
    return token_vectors, load(run_folder.POSITIONS_PATH)


def configure_tensorflow(threads: int):
    import tensorflow as tf

    # Each worker gets its share of the node's cores; concurrent workers on one node would
    # otherwise each start a thread per core and fight over them.
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    return tf


def make_strategy(tf):
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        bytes_per_pack=64 * 1024 * 1024,  # all gradients in one collective per step
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def train_worker(config: PipelineConfig, run: str, threads: int) -> dict:
    import keras

    tf = configure_tensorflow(threads)
    keras.utils.set_random_seed(config.train.seed)
    strategy = make_strategy(tf)
    local_dir = Path(tempfile.mkdtemp(prefix="gpt-pipeline-shards-"))
    try:
        worker = Worker(config, run, strategy, local_dir)
        result = worker.train()
        worker.save()
    finally:
        shutil.rmtree(local_dir, ignore_errors=True)
    result["weights_digest"] = weights_digest(worker.model)
    result["threads"] = threads
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="One multi-worker training process (started by the train stage).")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--result", required=True, help="local file the worker's summary is written to")
    args = parser.parse_args(argv)
    log.setup("train")  # this process's lines: the chief's progress and warnings in the stage's log
    run = args.run_dir.rstrip("/")
    exit_code = 1
    try:
        result = train_worker(run_folder.read_config(run), run, args.threads)
        Path(args.result).write_text(json.dumps(result))
        exit_code = 0
    except PipelineError as error:
        Path(args.result).write_text(json.dumps({"error": str(error)}))
        exit_code = SETTINGS_FAILURE_EXIT
    except BaseException:
        traceback.print_exc()
    finally:
        # Leave without interpreter shutdown: TensorFlow's multi-worker runtime can wait there for
        # minutes for peers that have already left. Everything is written by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)


if __name__ == "__main__":
    main()
