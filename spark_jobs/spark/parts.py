"""Files that executors write straight to the lake with pyarrow (Parquet parts, TFRecord shards).

Each is a lake.AtomicFile, whole or absent. Part names are deterministic per task, so a retried
task replaces its earlier attempt instead of adding a duplicate.
"""

from __future__ import annotations

import posixpath

from pipeline import lake, run_folder


def part_name(task: int, suffix: str) -> str:
    return f"part-{task:05d}{suffix}"


def parquet_files(folder_uri: str) -> list[str]:
    """The Parquet part files of a folder, in name order (hidden and temporary files left out)."""
    return [
        uri
        for uri in lake.list_files(folder_uri)
        if uri.endswith(".parquet") and not posixpath.basename(uri).startswith((".", "_"))
    ]


def stage_parquet_files(run: str, stage: str, folder: str) -> list[str]:
    """The Parquet part files of a completed stage's output folder in this run folder (never a
    path from its stats, which a copied or moved run folder would still point elsewhere with)."""
    files = parquet_files(lake.join(run, folder))
    if not files:
        raise run_folder.StageIncomplete(
            f"stage {stage!r} is marked complete in run folder {run}, but its {folder}/ holds no Parquet part file: "
            f"run {stage} again"
        )
    return files


def read_parquet(uri: str, columns: list[str] | None = None):
    import pyarrow.parquet as pq

    fs, path = lake.filesystem(uri)
    return pq.read_table(path, filesystem=fs, columns=columns)


class ParquetPart:
    """A Parquet file written batch by batch (bounded memory), committed whole."""

    def __init__(self, uri: str, schema):
        import pyarrow.parquet as pq

        self.file = lake.AtomicFile(uri)
        self.writer = pq.ParquetWriter(self.file.stream, schema)
        self.rows = 0

    def write(self, data) -> None:
        """Write a pyarrow RecordBatch or Table."""
        self.writer.write(data)
        self.rows += data.num_rows

    def __enter__(self) -> ParquetPart:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.writer.close()
            self.file.commit()
            return
        try:
            self.writer.close()
        finally:
            self.file.abort()
