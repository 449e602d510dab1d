"""The decoder as a TensorFlow SavedModel, which TensorFlow (tf.saved_model.load, TF Serving) runs with
no code of this project: its `serve` function and `serving_default` signature take ids int32
[batch, time] (time up to the block size) and return the next-token logits float32 [batch, time, vocab]
(the signature's output is named output_0)."""

from __future__ import annotations

from pathlib import Path


def write_saved_model(model, folder: Path) -> None:
    """The model (without dropout: inference) as a SavedModel in a local folder."""
    model.export(str(folder), format="tf_saved_model", verbose=False)
