"""How local spark-submit starts: the JVMs' class-data-sharing archives and the environment,
with the real spark-submit and JVM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from include import class_archive
from include.local_spark import spark_env

pytestmark = pytest.mark.spark  # most of them start spark-submit's JVMs

SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")


def spark_submit(args: list[str], jvm_options: tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SPARK_SUBMIT, *args], env=spark_env(jvm_options), capture_output=True, text=True, timeout=120
    )


def test_a_recorded_archive_is_mapped_by_the_next_jvm(tmp_path):
    folder = tmp_path / "my checkout" / ".venv"  # a space in the path: one JVM option all the same
    with class_archive.sharing("probe", folder) as options:
        assert options[0].startswith("-XX:ArchiveClassesAtExit=")
        recorded = spark_submit(["--version"], options)
        assert recorded.returncode == 0, recorded.stderr
    archives = list(folder.iterdir())
    assert [archive.suffix for archive in archives] == [".jsa"], archives  # no recording left behind
    assert archives[0].stat().st_size > 1_000_000

    with class_archive.sharing("probe", folder) as options:
        assert options == (f'-XX:SharedArchiveFile="{archives[0]}"',)
        used = spark_submit(["--version"], (*options, "-Xlog:class+load=info"))
    assert used.returncode == 0, used.stderr
    # Spark's own classes now come from the archive, not from its jars.
    assert "org.apache.spark.deploy.SparkSubmit source: shared objects file (top)" in used.stdout


def test_a_failed_run_leaves_no_archive(tmp_path):
    with pytest.raises(RuntimeError, match="exit code"):
        with class_archive.sharing("probe", tmp_path) as options:
            failed = spark_submit([str(tmp_path / "no-such-app.py")], options)
            assert list(tmp_path.glob("*.recording"))  # the JVM did write one
            raise RuntimeError(f"exit code {failed.returncode}")
    assert failed.returncode != 0
    assert list(tmp_path.iterdir()) == []


def test_a_truncated_archive_is_recorded_again(tmp_path):
    with class_archive.sharing("probe", tmp_path) as options:
        assert spark_submit(["--version"], options).returncode == 0
    [archive] = tmp_path.iterdir()
    archive.write_bytes(archive.read_bytes()[:1_000_000])  # a JVM mapping this would crash
    with class_archive.sharing("probe", tmp_path) as options:
        assert options[0].startswith("-XX:ArchiveClassesAtExit=")
        assert spark_submit(["--version"], options).returncode == 0
    [archive] = tmp_path.iterdir()
    assert archive.name.endswith(f"-{archive.stat().st_size}.jsa")


def test_each_build_has_its_own_archive(tmp_path, monkeypatch):
    archive = class_archive.archive_prefix(tmp_path)
    assert archive.parent == tmp_path
    monkeypatch.setattr("pyspark.__version__", "0.0.0")
    assert class_archive.archive_prefix(tmp_path) != archive
    monkeypatch.undo()
    # The same Spark elsewhere (a moved or copied environment) has another class path, which the JVM checks.
    monkeypatch.setattr("pyspark.__file__", str(tmp_path / "elsewhere" / "pyspark" / "__init__.py"))
    assert class_archive.archive_prefix(tmp_path) != archive


def test_one_stage_records_the_archive_that_the_others_map(tmp_path):
    with class_archive.sharing("tokenize", tmp_path) as options:
        assert options[0].startswith("-XX:ArchiveClassesAtExit=")
        assert spark_submit(["--version"], options).returncode == 0
    [archive] = tmp_path.iterdir()
    with class_archive.sharing("window", tmp_path) as options:
        assert options == (f'-XX:SharedArchiveFile="{archive}"',)


def test_recording_removes_the_archives_of_an_older_layout(tmp_path):
    """Earlier versions kept one archive per stage (tokenize-<build>-<size>.jsa): 0.5 GB."""
    (tmp_path / "tokenize-0123456789ab-5.jsa").write_bytes(b"12345")
    with class_archive.sharing("probe", tmp_path) as options:
        assert spark_submit(["--version"], options).returncode == 0
    [archive] = tmp_path.iterdir()
    assert archive.name.startswith("spark-")


def test_recording_for_a_new_build_removes_the_old_builds_archive(tmp_path, monkeypatch):
    with class_archive.sharing("probe", tmp_path) as options:
        assert spark_submit(["--version"], options).returncode == 0
    [old_build] = tmp_path.iterdir()
    monkeypatch.setattr("pyspark.__version__", "0.0.0")  # as after a pyspark upgrade
    with class_archive.sharing("probe", tmp_path) as options:
        assert options[0].startswith("-XX:ArchiveClassesAtExit=")
        assert spark_submit(["--version"], options).returncode == 0
    [new_build] = tmp_path.iterdir()
    assert new_build.name != old_build.name


def test_no_archive_where_the_folder_cannot_be_made(tmp_path):
    (tmp_path / "a-file").write_text("")
    with class_archive.sharing("probe", tmp_path / "a-file" / "archives") as options:
        assert options == ()


def test_no_recording_without_room_for_it(tmp_path, monkeypatch):
    monkeypatch.setattr(class_archive, "MIN_FREE_BYTES", class_archive.shutil.disk_usage(tmp_path).free * 2)
    with class_archive.sharing("probe", tmp_path) as options:
        assert options == ()


def test_spark_submit_starts_from_an_interpreter_path_with_a_space(tmp_path):
    """As from a checkout such as '/home/me/My Projects/gpt-pipeline' (pyspark's own
    find-spark-home script splits that path; the runner names SPARK_HOME instead)."""
    python = tmp_path / "My Projects" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    env = {**spark_env(), "PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": str(python)}
    completed = subprocess.run([SPARK_SUBMIT, "--version"], env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr


def test_the_jvm_keeps_its_temporary_folders_where_tmpdir_says(tmp_path, monkeypatch):
    """make run sets TMPDIR to airflow_home/tmp, which the next command empties: Spark's own
    spark-* folders, which a killed JVM leaves, must go there too, not to /tmp."""
    scratch = tmp_path / "my tmp"  # a space: one JVM option all the same
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    app = tmp_path / "app.py"
    app.write_text(
        "from pyspark.sql import SparkSession\n"
        "spark = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
        "print('tmpdir=' + spark.sparkContext._jvm.java.lang.System.getProperty('java.io.tmpdir'))\n"
        "spark.stop()\n"
    )
    completed = subprocess.run([SPARK_SUBMIT, str(app)], env=spark_env(), capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"tmpdir={scratch}\n" in completed.stdout
