"""The run's code on S3 (include/emr_code.py): the files uploaded with it, and the Python
environment the bootstrap script installs from them on the EMR nodes."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from include import emr_code
from include.spark_submit import SHIPPED_PACKAGES
from pipeline.config import REPO_ROOT


def pins(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    requirements = [Requirement(line) for line in lines if line]
    return {canonicalize_name(req.name): str(req.specifier) for req in requirements}


def test_jobs_requirements_are_pinned_like_the_project():
    jobs = pins(emr_code.RUN_FILES["requirements-jobs.txt"])
    project = pins(emr_code.RUN_FILES["constraints.txt"])
    assert "pyspark" not in jobs, "the cluster's Spark provides pyspark"
    for name, spec in jobs.items():
        assert spec.startswith("=="), f"{name} is not pinned"
        assert project.get(name) == spec, f"{name}{spec} differs from requirements.txt ({project.get(name)})"


def third_party_imports(folders: list[Path]) -> set[str]:
    local = {*SHIPPED_PACKAGES, "include"}
    names = set()
    for file in (file for folder in folders for file in folder.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {name for name in names - local if name not in sys.stdlib_module_names}


def dependency_closure(names: set[str]) -> set[str]:
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return seen


def test_everything_the_jobs_import_is_installed_by_the_bootstrap():
    installed = dependency_closure(set(pins(emr_code.RUN_FILES["requirements-jobs.txt"]))) | {"pyspark", "py4j"}
    providers = metadata.packages_distributions()
    # What the nodes run: the packages shipped with the code (include/spark_submit.package_code).
    imports = third_party_imports([REPO_ROOT / package for package in SHIPPED_PACKAGES])
    assert {"pyarrow", "pydantic", "yaml"} <= imports
    for module in imports:
        distributions = {canonicalize_name(name) for name in providers.get(module, [])}
        assert distributions, f"the shipped code imports {module}, which no installed distribution provides"
        assert distributions & installed, (
            f"the shipped code imports {module} ({distributions}): add it to spark_jobs/requirements.txt"
        )


def test_bootstrap_script_reads_the_files_uploaded_with_the_code():
    """Its run on a node, offline from a wheelhouse, is tests/include/test_wheelhouse.py's."""
    script = emr_code.RUN_FILES["bootstrap.sh"]
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for name in ("requirements-jobs.txt", "constraints.txt"):
        assert f'"$code_uri/{name}"' in text and name in emr_code.RUN_FILES
    assert '--no-index --find-links "$work/wheels"' in text
    assert '-r "$work/requirements-jobs.txt" -c "$work/constraints.txt"' in text


def test_pip_resolves_the_jobs_requirements_within_the_pinned_environment():
    """The bootstrap's pip command, offline against this environment: it must resolve (no pin
    conflicts with the constraints) and need nothing this tested environment lacks."""
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--disable-pip-version-check",
            "-r",
            str(emr_code.RUN_FILES["requirements-jobs.txt"]),
            "-c",
            str(emr_code.RUN_FILES["constraints.txt"]),
        ],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stderr
    assert "Would install" not in completed.stdout, completed.stdout
