"""Locks on local files that one process holds at a time: Airflow's home for one command, a run
folder for one command or task. A lock goes with its process, however that ends, and with the
children it passed it to."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline import lake, run_folder
from pipeline.errors import PipelineError

# The file descriptors of the locks this process holds: a child doing the work a lock protects
# inherits them (include/local_spark.py), and the lock lasts until the child too has ended.
_held_fds: set[int] = set()


class InUse(PipelineError):
    """Another process holds the lock."""


def held_fds() -> tuple[int, ...]:
    """The locks this process holds, as file descriptors to pass on to a child."""
    return tuple(sorted(_held_fds))


@contextmanager
def held(lock_file: Path, holder: str, in_use: Callable[[str], str]) -> Iterator[None]:
    """Hold `lock_file` while the block runs, with `holder` and this process's id written in it for
    others to see; if another process holds it, InUse with in_use(what that one wrote)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise InUse(in_use(handle.read().strip() or "another command")) from None
        handle.truncate(0)
        handle.write(f"{holder} (pid {os.getpid()})")
        handle.flush()
        _held_fds.add(handle.fileno())
        try:
            yield
        finally:
            _held_fds.discard(handle.fileno())


@contextmanager
def run_folder_held(run_dir: str, holder: str) -> Iterator[None]:
    """A local run folder for one command or task: two at once would overwrite each other's config
    and outputs, and prune_runs would remove it from under them. A run folder on S3 (target emr)
    takes none: each DAG run has its own, and one DAG run is active at a time."""
    if not run_dir.startswith("file://"):
        yield
        return
    message = lambda other: f"run folder {run_dir} is in use by {other}: wait for it to end, or use another run"  # noqa: E731
    with held(Path(lake.local_path(run_dir)) / run_folder.LOCK_FILE, holder, message):
        yield
