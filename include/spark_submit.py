"""One builder for the spark-submit command of every stage, used by both targets.

Local and EMR run the same application files with the same arguments and stage_conf's settings;
the master, the deploy mode and where the code and run folder live differ, and EMR adds the
settings a cluster needs (include/emr_steps.py: every stage's parallelism, and for the barrier
stage, train, one whole core node per executor).
"""

from __future__ import annotations

import contextlib
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from pipeline import stages
from pipeline.config import REPO_ROOT, PipelineConfig

LIBRARY_ZIP = "spark_jobs.zip"
# What the stage applications import: the nodes need these and nothing else of the repository.
SHIPPED_PACKAGES = ("spark_jobs", "pipeline")


def package_code(dest: Path) -> Path:
    """Copy the entry files and zip the packages they import, spark_jobs and pipeline (shipped to
    executors with --py-files)."""
    source = REPO_ROOT / "spark_jobs"
    entries = dest / "spark_jobs"
    entries.mkdir(parents=True, exist_ok=True)
    for stage in stages.EMR_STEPS:  # every stage's, and the EMR target's cluster check's
        (entries / stage.app_file).write_bytes((source / stage.app_file).read_bytes())
    archive = dest / LIBRARY_ZIP
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for package in SHIPPED_PACKAGES:
            for file in sorted((REPO_ROOT / package).rglob("*.py")):
                zipped.write(file, file.relative_to(REPO_ROOT).as_posix())
    return archive


@contextlib.contextmanager
def packaged_code() -> Iterator[Path]:
    """A temporary folder holding package_code's files, removed on leaving."""
    with tempfile.TemporaryDirectory(prefix="gpt-pipeline-code-") as folder:
        package_code(Path(folder))
        yield Path(folder)


def stage_conf(stage: stages.Stage) -> dict[str, str]:
    # WARN: Spark's INFO lines would bury the stages' own output (and their one-line errors).
    conf = {"spark.sql.execution.arrow.pyspark.enabled": "true", "spark.log.level": "WARN"}
    if stage.barrier:
        # Barrier stages cannot run with dynamic allocation (EMR turns it on by default); a failed
        # one is retried whole, its workers resuming from their backup.
        conf["spark.dynamicAllocation.enabled"] = "false"
        conf["spark.task.maxFailures"] = "4"
    return conf


def local_master(stage: stages.Stage, config: PipelineConfig, cores: int) -> str:
    if stage.barrier:
        # local[N,F]: a task slot per training worker, and F attempts so a failed barrier stage is retried (resume).
        return f"local[{config.train.num_workers},4]"
    return f"local[{cores}]"


def spark_submit_argv(
    stage: str,
    config: PipelineConfig,
    *,
    code_uri: str,
    run_dir: str,
    master: str,
    deploy_mode: str = "client",
    resources: dict[str, str] | None = None,
) -> list[str]:
    """`resources`: the target's executor sizing (EMR sizes the train executors to whole nodes)."""
    table = stages.by_name(stage)  # a ValueError for an unknown stage
    argv = ["spark-submit", "--master", master, "--deploy-mode", deploy_mode, "--name", f"gpt-pipeline-{stage}"]
    for key, value in {**stage_conf(table), **(resources or {})}.items():
        argv += ["--conf", f"{key}={value}"]
    code = code_uri.rstrip("/")
    argv += ["--py-files", f"{code}/{LIBRARY_ZIP}", f"{code}/spark_jobs/{table.app_file}"]
    return argv + ["--run-dir", run_dir]
