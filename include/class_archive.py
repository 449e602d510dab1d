"""Class-data-sharing archives for the local Spark JVMs: about 2 s less per spark-submit.

A Spark application's JVM spends seconds loading and verifying the same ~10,000 classes every
time (Spark core, Spark SQL, Parquet, MLlib), first at start-up and again at its first query.
Java's dynamic CDS keeps them, already parsed and verified, in an archive that later JVMs map
from disk. Each stage gets its own archive (the classes it loads), recorded the first time the
stage runs (-XX:ArchiveClassesAtExit, a few seconds more that once) and used from then on
(-XX:SharedArchiveFile). An archive fits one JDK build and one Spark: it is named after both, so
a new JDK or pyspark records a new one. One that does not fit anyway (a JVM checks) is ignored by
the JVM with a warning, never an error. Local target only: on EMR every cluster is new.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

# In the virtual environment, so that rebuilding it (a new pyspark) starts afresh.
ARCHIVE_DIR = Path(sys.prefix) / "spark-class-archives"


def java_binary() -> Path | None:
    """The java spark-submit runs: $JAVA_HOME/bin/java, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    found = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path(stage: str, folder: Path = ARCHIVE_DIR) -> Path | None:
    """The stage's archive for this JDK build and this pyspark; None when java cannot be found."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    libjvm = next(java.parent.parent.glob("lib/server/libjvm.so"), java)
    build = f"{java}:{libjvm.stat().st_size}:{libjvm.stat().st_mtime_ns}:{pyspark.__version__}"
    return folder / f"{stage}-{hashlib.sha256(build.encode()).hexdigest()[:12]}.jsa"


@contextlib.contextmanager
def sharing(stage: str, folder: Path = ARCHIVE_DIR) -> Iterator[tuple[str, ...]]:
    """The JVM options for a run of `stage`: use its archive, or record it during this run.

    A recording is written under a name of its own and takes the archive's name only once the
    run has succeeded, so concurrent runs never share a half-written file.
    """
    archive = archive_path(stage, folder)
    if archive is None:
        yield ()
        return
    if archive.exists():
        yield (f"-XX:SharedArchiveFile={archive}",)
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    if not os.access(folder, os.W_OK):  # e.g. a read-only environment: run without an archive
        yield ()
        return
    recording = archive.with_suffix(f".{os.getpid()}.recording")
    print(f"{stage}: recording its JVM class archive (once, a few seconds) in {folder}", flush=True)
    try:
        # cds=off: the recording JVM lists every class it cannot archive (signed jars, ...) as a warning.
        yield (f"-XX:ArchiveClassesAtExit={recording}", "-Xlog:cds=off")
        if recording.exists():
            os.replace(recording, archive)
    finally:
        recording.unlink(missing_ok=True)
