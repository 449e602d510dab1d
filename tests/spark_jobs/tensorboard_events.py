"""Reading a run's TensorBoard event files back, with TensorFlow's own reader, for the tests."""

from __future__ import annotations

import posixpath
import tempfile
from pathlib import Path

from pipeline import lake
from spark_jobs.training import tensorboard_log


def read_events(run: str) -> dict[str, dict[str, dict[int, object]]]:
    """{event file name: {tag: {step: value}}} of the run's tensorboard/ (file:// or s3://); a
    scalar's value is a float, a text's a str."""
    import tensorflow as tf

    files = {}
    with tempfile.TemporaryDirectory() as local:
        for uri in lake.list_files(tensorboard_log.folder_uri(run)):
            name = posixpath.basename(uri)
            tags: dict[str, dict[int, object]] = {}
            for event in tf.compat.v1.train.summary_iterator(str(lake.download_file(uri, Path(local) / name))):
                for value in event.summary.value:
                    array = tf.make_ndarray(value.tensor)
                    tags.setdefault(value.tag, {})[event.step] = (
                        array.item().decode() if array.dtype == object else float(array)
                    )
            files[name] = tags
    return files
