"""With target emr, the DAG parses and its tasks run with neither pyspark nor TensorFlow installed:
an MWAA environment installs only what the DAG and its tasks import, and the Spark applications
bring theirs to the cluster. Each check runs in a Python whose sitecustomize, run before anything
else is imported, makes pyspark, tensorflow and keras (and their submodules) fail to import as if
they were not installed; the processes it starts inherit the same."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from pipeline.config import REPO_ROOT
from pipeline.config_files import DEFAULT_CONFIG_PATH, read_yaml
from pipeline.overrides import apply_overrides

BLOCKED = ("pyspark", "tensorflow", "keras")
BUCKET = "gpt-pipeline"
EMR_RUN_TEST = (
    "tests/dags/test_dag_emr.py::test_run_creates_the_templated_cluster_runs_every_step_in_order_and_terminates"
)
EMR_OVERRIDES = {"target": "emr", "corpus": f"s3://{BUCKET}/corpus/*.txt", "lake": f"s3://{BUCKET}/lake"}
SITECUSTOMIZE = f"""
import importlib.abc
import sys

BLOCKED = {BLOCKED!r}


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            message = f"No module named {{name!r}} (blocked by tests/dags/test_dag_imports.py)"
            raise ModuleNotFoundError(message, name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""
# Ends every check: the blocker was in place, and nothing got past it.
NOTHING_IMPORTED = f"""
import importlib
import sys

for name in {BLOCKED!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
    else:
        raise AssertionError(f"{{name}} was imported: the blocker is not in place")
leaked = sorted(name for name in sys.modules if name.partition(".")[0] in {BLOCKED!r})
assert not leaked, f"imported despite the blocker: {{leaked}}"
print("checked without", ", ".join({BLOCKED!r}))
"""


def run_without_spark(tmp_path, code: str, timeout_s: int = 300) -> str:
    """Run `code` in a Python that cannot import pyspark, tensorflow or keras, with pipeline.yaml's
    target emr as the DAG's defaults file; returns its output, and fails with it if `code` failed."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(SITECUSTOMIZE)
    defaults = tmp_path / "pipeline-emr.yaml"
    defaults.write_text(yaml.safe_dump(apply_overrides(read_yaml(DEFAULT_CONFIG_PATH), EMR_OVERRIDES)))
    path = [str(blocker), str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "GPT_PIPELINE_CONFIG": str(defaults)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code) + NOTHING_IMPORTED],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "checked without pyspark, tensorflow, keras" in result.stdout, output
    return output


def test_the_emr_dag_parses_and_builds_its_cluster_and_steps_without_spark_or_tensorflow(tmp_path):
    run_without_spark(
        tmp_path,
        """
        from airflow.dag_processing.dagbag import DagBag

        from pipeline.config import REPO_ROOT
        from pipeline.config_files import defaults_path, load_config

        dagbag = DagBag(dag_folder=str(REPO_ROOT / "dags"))
        assert dagbag.import_errors == {}, dagbag.import_errors

        from include import emr_cluster, emr_cost, emr_steps
        from pipeline.stages import EMR_STEP_NAMES

        dag = dagbag.dags["gpt_pipeline"]
        cluster = {"create_cluster", "wait_for_cluster", *EMR_STEP_NAMES, "terminate_cluster", "end_orphaned_clusters"}
        assert set(dag.task_ids) == {"validate_config", *cluster, "collect", "promote", "prune_runs"}, dag.task_ids
        assert dag.get_task("terminate_cluster").is_teardown

        # What validate_config works out before any cluster exists.
        config = load_config(defaults_path())
        assert config.target == "emr"
        request = emr_cluster.job_flow_overrides(config, "run-1")
        assert request["Instances"]["InstanceGroups"], request
        for stage in EMR_STEP_NAMES:
            step = emr_steps.stage_step(stage, config, "run-1")
            assert step["HadoopJarStep"]["Args"], step
            assert emr_steps.sensor_limits(stage, config)["timeout"] > 0
        assert emr_cluster.startup_limits(config)["timeout"] > 0
        emr_steps.check_sensor_limits(config, config)
        hourly, hours = emr_cost.check_budget(config, config)
        assert hourly > 0 and hours > 0
        """,
    )


@pytest.mark.airflow
def test_the_emr_dag_runs_on_moto_without_spark_or_tensorflow(tmp_path):
    """The whole run as tests/dags/test_dag_emr.py runs it on moto: validate_config uploading the
    run, the cluster, every stage's step, collect's report with the cluster's steps, promote,
    prune_runs and terminate_cluster."""
    output = run_without_spark(
        tmp_path,
        f"""
        import pytest

        exit_code = pytest.main(["-p", "no:cacheprovider", "-q", {EMR_RUN_TEST!r}])
        assert exit_code == 0, f"pytest exit code {{exit_code}}"
        """,
        timeout_s=480,  # below the test's time-out, so that the nested run's output is what fails it
    )
    assert "1 passed" in output, output
