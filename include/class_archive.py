"""Class-data-sharing archive for the local Spark JVMs: about 2 s less per spark-submit.

A Spark application's JVM spends seconds loading and verifying the same ~10,000 classes every
time (Spark core, Spark SQL, Parquet), first at start-up and again at its first query. Java's
dynamic CDS keeps them, already parsed and verified, in an archive that later JVMs map from disk.
The stages share one archive: the first Spark application on a machine records the classes it
loaded (-XX:ArchiveClassesAtExit, some 9 s more that once) and every later one, of any stage, maps
it (-XX:SharedArchiveFile); a class the recording JVM never loaded (MLlib's, for one) comes from
its jar as before. One archive per stage saved no more and cost the first run some 45 s more.
An archive fits one JDK build and one Spark where it is installed: it is named after both, so a
new JDK or pyspark, or a moved virtual environment, records a new one. One that does not fit
anyway (a JVM checks) is ignored by the JVM with a warning; one cut short would crash it, so the
name also carries the size.
Local target only: on EMR every cluster is new.
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
MIN_FREE_BYTES = 1 << 30  # an archive takes 60-160 MB


def java_binary() -> Path | None:
    """The java spark-submit runs: $JAVA_HOME/bin/java, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    found = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_prefix(folder: Path = ARCHIVE_DIR) -> Path | None:
    """Where the archive for this JDK build and this pyspark goes, without its size and suffix;
    None when java cannot be found."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    libjvm = next(java.parent.parent.glob("lib/server/libjvm.so"), java)
    # Spark's jars by path too: the JVM refuses an archive recorded with another class path (the
    # virtual environment moved or copied, archives and all), and would never record a new one.
    spark_jars = Path(pyspark.__file__).parent / "jars"
    build = f"{java}:{libjvm.stat().st_size}:{libjvm.stat().st_mtime_ns}:{pyspark.__version__}:{spark_jars}"
    return folder / f"spark-{hashlib.sha256(build.encode()).hexdigest()[:12]}"


def recorded_archive(prefix: Path) -> Path | None:
    """The archive recorded under `prefix`, if whole. Its name carries the size it was recorded
    with: a JVM that maps a truncated archive crashes (SIGBUS) instead of ignoring it, so one of
    another size is deleted and recorded again."""
    for path in prefix.parent.glob(f"{prefix.name}-*.jsa"):
        if path.name == f"{prefix.name}-{path.stat().st_size}.jsa":
            return path
        path.unlink(missing_ok=True)
    return None


def current_archive(folder: Path = ARCHIVE_DIR) -> Path | None:
    """The whole archive for this JDK and pyspark, if it has been recorded."""
    prefix = archive_prefix(folder)
    return None if prefix is None else recorded_archive(prefix)


def can_record(folder: Path) -> bool:
    """A writable folder with room: a JVM that cannot write its whole archive exits with an error,
    which would fail a stage that had done its work."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return os.access(folder, os.W_OK) and shutil.disk_usage(folder).free >= MIN_FREE_BYTES
    except OSError:
        return False


def path_option(option: str, path: Path) -> str:
    """A JVM option naming a file, quoted: the options reach the JVM through SPARK_SUBMIT_OPTS,
    which Spark's launcher splits at spaces outside quotes, and a checkout's path may hold one."""
    return f'{option}="{path}"'


@contextlib.contextmanager
def sharing(stage: str, folder: Path = ARCHIVE_DIR) -> Iterator[tuple[str, ...]]:
    """The JVM options for a run of `stage`: use the archive, or record it during this run.

    A recording is written under a name of its own and takes the archive's name only once the
    run has succeeded, so concurrent runs never share a half-written file.
    """
    archive = current_archive(folder)
    if archive is not None:
        yield (path_option("-XX:SharedArchiveFile", archive),)
        return
    prefix = archive_prefix(folder)  # again only on the one run that records
    if prefix is None or not can_record(folder):  # e.g. a read-only environment: no archive
        yield ()
        return
    recording = prefix.with_name(f"{prefix.name}.{os.getpid()}.recording")
    print(f"{stage}: recording the JVM class archive of the Spark stages (once, a few seconds) in {folder}", flush=True)
    try:
        # cds=off: the recording JVM lists every class it cannot archive (signed jars, ...) as a warning.
        yield (path_option("-XX:ArchiveClassesAtExit", recording), "-Xlog:cds=off")
        if recording.exists():
            archive = prefix.with_name(f"{prefix.name}-{recording.stat().st_size}.jsa")
            os.replace(recording, archive)
            for other in folder.glob("*.jsa"):  # an older JDK's or pyspark's, or an older layout's
                if other != archive:
                    other.unlink(missing_ok=True)
    finally:
        recording.unlink(missing_ok=True)
