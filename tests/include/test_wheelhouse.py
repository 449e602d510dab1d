"""The EMR nodes' wheelhouse: named by the requirements, uploaded manifest last, built by the DAG's
prepare task when missing, and installed offline by the real bootstrap.sh (under bash, with `aws`,
`sudo` and `dnf` stubbed, S3 a local folder). The wheels are tiny ones built here: nothing comes
from PyPI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from include import emr_cluster, emr_code, emr_tasks, wheelhouse
from local_platform.moto_s3 import LocalS3
from pipeline import run_folder
from pipeline.config_files import load_config
from pipeline.errors import PipelineError

pytestmark = pytest.mark.pip  # most of them build wheels or a virtual environment with pip

CODE_BUCKET, LAKE_BUCKET = "gpt-pipeline", "test-lake"
EMR_TARGET = ["target=emr", f"lake=s3://{LAKE_BUCKET}/pipeline"]
RUN_ID = "tinyshakespeare-manual__2026-11-25T08_00_00_00_00"  # as the DAG passes it (run_folder.safe_run_id)
# tinya needs tinyb: the bootstrap must install both from the wheelhouse.
PACKAGES = {"tinya": ["tinyb==1.0"], "tinyb": []}
STUBS = {
    # aws s3 cp [--quiet] [--recursive] SRC DST, with s3://bucket/key the file $FAKE_S3/bucket/key.
    "aws": """
[ "$1 $2" = "s3 cp" ] || { echo "stub aws: only s3 cp" >&2; exit 2; }
shift 2
recursive=0; paths=()
for arg in "$@"; do
  case "$arg" in --quiet) ;; --recursive) recursive=1 ;; *) paths+=("$arg") ;; esac
done
source="$FAKE_S3/${paths[0]#s3://}"
if [ "$recursive" = 1 ]; then
  mkdir -p "${paths[1]}"
  [ ! -d "$source" ] || cp -r "$source/." "${paths[1]}"
else
  [ -f "$source" ] || { echo "fatal error: An error occurred (404) when calling the HeadObject operation" >&2; exit 1; }
  cp "$source" "${paths[1]}"
fi
""",
    "sudo": 'exec "$@"',
    "dnf": "exit 0",
    # The nodes' python3.11 (dnf's): this machine's base Python 3.11.
    "python3.11": f'exec {sys._base_executable} "$@"',
}


def tiny_wheel(name: str, requires: list[str], folder: Path) -> Path:
    """A real wheel of a one-module package, built offline with this environment's setuptools."""
    source = folder / "src" / name
    (source / name).mkdir(parents=True)
    (source / name / "__init__.py").write_text(f"NAME = {name!r}\n")
    (source / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "1.0"\ndependencies = {json.dumps(requires)}\n'
    )
    argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index", "--no-build-isolation"]
    subprocess.run([*argv, "--wheel-dir", str(folder / "wheels"), str(source)], check=True)
    (wheel,) = (folder / "wheels").glob(f"{name}-1.0-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """A folder holding the tiny wheels: the index the tests build from instead of PyPI."""
    folder = tmp_path_factory.mktemp("index")
    for name, requires in PACKAGES.items():
        tiny_wheel(name, requires, folder)
    return folder / "wheels"


@pytest.fixture
def tiny_requirements(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """The tiny packages as the jobs' requirements and constraints."""
    requirements, constraints = tmp_path / "requirements-jobs.txt", tmp_path / "constraints.txt"
    requirements.write_text("tinya==1.0\n")
    constraints.write_text("tinya==1.0\ntinyb==1.0\n")
    monkeypatch.setitem(emr_code.RUN_FILES, "requirements-jobs.txt", requirements)
    monkeypatch.setitem(emr_code.RUN_FILES, "constraints.txt", constraints)
    return requirements, constraints


@pytest.fixture(scope="module")
def s3():
    with LocalS3(buckets=(CODE_BUCKET, LAKE_BUCKET)) as server:
        yield server


def emr_config(*overrides: str):
    return load_config(overrides=EMR_TARGET + list(overrides))


# --- naming -----------------------------------------------------------------------------------


def test_the_hash_changes_when_either_requirements_file_changes(tiny_requirements):
    requirements, constraints = tiny_requirements
    first = emr_code.requirements_hash()
    assert emr_code.requirements_hash() == first
    requirements.write_text("tinya==1.0\ntinyb==1.0\n")
    second = emr_code.requirements_hash()
    constraints.write_text("tinya==1.0\ntinyb==1.1\n")
    third = emr_code.requirements_hash()
    assert len({first, second, third}) == 3
    assert emr_code.wheelhouse_uri("s3://b/code/") == f"s3://b/code/wheelhouse/{third}"


def test_the_cluster_installs_from_the_wheelhouse_of_its_requirements():
    config = emr_config()
    args = emr_cluster.job_flow_overrides(config, RUN_ID)["BootstrapActions"][0]["ScriptBootstrapAction"]["Args"]
    assert args[2] == f"s3://{CODE_BUCKET}/code/wheelhouse/{emr_code.requirements_hash()}"
    assert args[1].startswith("/mnt/"), "the environment is on the node's data volume"


def test_pip_download_asks_for_the_nodes_wheels():
    argv = wheelhouse.download_argv(Path("/tmp/w"))
    assert "--only-binary=:all:" in argv
    for option, value in (("--python-version", "3.11"), ("--abi", "cp311"), ("--implementation", "cp")):
        assert argv[argv.index(option) + 1] == value
    platforms = {argv[index + 1] for index, word in enumerate(argv) if word == "--platform"}
    # The tags the pinned wheels carry: tensorflow-cpu 2_27, pyarrow 2_28, pandas 2_24, libclang manylinux2010.
    assert {"manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux2010_x86_64"} <= (
        platforms
    )
    assert "manylinux_2_35_x86_64" not in platforms, "Amazon Linux 2023's glibc is 2.34"
    assert "--no-index" not in argv


def test_the_build_command_downloads_from_the_index_it_is_given(wheels, tiny_requirements, tmp_path, capsys):
    dest = tmp_path / "dest"
    assert wheelhouse.main(["build", "--no-upload", "--find-links", str(wheels), "--dest", str(dest)]) == 0
    assert sorted(path.name for path in dest.iterdir()) == ["tinya-1.0-py3-none-any.whl", "tinyb-1.0-py3-none-any.whl"]
    assert "2 wheels" in capsys.readouterr().out
    tiny_requirements[0].write_text("tinyc==2.0\n")
    assert wheelhouse.main(["build", "--no-upload", "--find-links", str(wheels), "--dest", str(dest)]) == 2
    assert "ERROR wheelhouse not built: pip download failed: " in capsys.readouterr().err


# --- upload -----------------------------------------------------------------------------------


class RecordingS3:
    """The moto client, recording the keys written in order; fails on `fail_on` as a lost upload would."""

    def __init__(self, client, fail_on: str | None = None):
        self.client, self.fail_on, self.keys = client, fail_on, []

    def record(self, key: str) -> None:
        if self.fail_on and key.endswith(self.fail_on):
            raise ConnectionError(f"upload of {key} interrupted")
        self.keys.append(key)

    def upload_file(self, path: str, bucket: str, key: str) -> None:
        self.record(key)
        self.client.upload_file(path, bucket, key)

    def put_object(self, **kwargs) -> None:
        self.record(kwargs["Key"])
        self.client.put_object(**kwargs)

    def head_object(self, **kwargs):
        return self.client.head_object(**kwargs)


def test_the_manifest_is_written_last_and_a_wheelhouse_without_it_is_absent(s3, wheels):
    uri = f"s3://{CODE_BUCKET}/code/wheelhouse/0123456789abcdef"
    built = sorted(wheels.glob("*.whl"))
    interrupted = RecordingS3(s3.client(), fail_on=wheelhouse.MANIFEST)
    with pytest.raises(ConnectionError):
        wheelhouse.upload(built, uri, interrupted)
    assert len(interrupted.keys) == len(built), "every wheel was uploaded"
    assert not wheelhouse.is_complete(s3.client(), uri), "wheels without their manifest are no wheelhouse"

    recording = RecordingS3(s3.client())
    wheelhouse.upload(built, uri, recording)
    assert recording.keys[-1] == f"code/wheelhouse/0123456789abcdef/{wheelhouse.MANIFEST}"
    assert wheelhouse.is_complete(s3.client(), uri)
    body = s3.client().get_object(Bucket=CODE_BUCKET, Key=recording.keys[-1])["Body"].read()
    manifest = json.loads(body)
    assert manifest["requirements_hash"] == "0123456789abcdef" and manifest["python"] == "3.11"
    assert sorted(manifest["wheels"]) == [wheel.name for wheel in built]
    assert manifest["sha256"] == {wheel.name: hashlib.sha256(wheel.read_bytes()).hexdigest() for wheel in built}


# --- the DAG's prepare task ---------------------------------------------------------------------


def objects(s3, bucket: str, prefix: str) -> list[str]:
    return [item["Key"] for item in s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


def pip_index(monkeypatch, folder: Path) -> None:
    """pip's index for this test: a folder, as pip.conf or PIP_INDEX_URL would point it at a mirror."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))


def test_prepare_builds_a_missing_wheelhouse_before_the_run_and_reuses_it(
    s3, hook, wheels, tiny_requirements, monkeypatch, tmp_path
):
    pip_index(monkeypatch, wheels)
    config = emr_config()
    uri = emr_code.wheelhouse_uri(config.emr.code_prefix)
    assert not wheelhouse.is_complete(s3.client(), uri)
    sent = emr_tasks.prepare(config, RUN_ID, config)
    assert sent["job_flow_overrides"]["BootstrapActions"][0]["ScriptBootstrapAction"]["Args"][2] == uri
    assert wheelhouse.is_complete(s3.client(), uri)
    names = {key.rsplit("/", 1)[-1] for key in objects(s3, CODE_BUCKET, uri.removeprefix(f"s3://{CODE_BUCKET}/"))}
    assert names == {"tinya-1.0-py3-none-any.whl", "tinyb-1.0-py3-none-any.whl", wheelhouse.MANIFEST}

    pip_index(monkeypatch, tmp_path / "empty")  # a second run finds it: nothing to download
    emr_tasks.prepare(config, "second-run", config)
    assert objects(s3, LAKE_BUCKET, run_folder.run_dir(config, "second-run").removeprefix(f"s3://{LAKE_BUCKET}/"))


def test_prepare_refuses_the_run_when_the_wheelhouse_cannot_be_built(s3, hook, wheels, tiny_requirements, monkeypatch):
    pip_index(monkeypatch, wheels)
    tiny_requirements[0].write_text("tinya==1.0\ntinyc==2.0\n")  # a new hash, and a wheel the index lacks
    config = emr_config()
    with pytest.raises(PipelineError, match=r"tinyc==2\.0.*build it with `python -m include.wheelhouse build`"):
        emr_tasks.prepare(config, "refused-run", config)
    # Nothing of the run was uploaded, and its cluster is never requested: prepare failed.
    assert not objects(s3, CODE_BUCKET, "code/refused-run/")
    assert not wheelhouse.is_complete(s3.client(), emr_code.wheelhouse_uri(config.emr.code_prefix))
    assert not objects(s3, LAKE_BUCKET, run_folder.run_dir(config, "refused-run").removeprefix(f"s3://{LAKE_BUCKET}/"))


# --- the bootstrap on a node --------------------------------------------------------------------


@pytest.fixture
def node(tmp_path, wheels, tiny_requirements) -> dict:
    """A node's PATH of stubs and an S3 (a folder) holding the run's code files and its wheelhouse."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in STUBS.items():
        (stubs / name).write_text(f"#!/bin/bash\nset -eu\n{body}\n")
        (stubs / name).chmod(0o755)
    fake_s3 = tmp_path / "s3"
    code, house = fake_s3 / "bucket" / "code" / "run-1", fake_s3 / "bucket" / "code" / "wheelhouse" / "abc"
    code.mkdir(parents=True)
    for name, path in emr_code.RUN_FILES.items():
        shutil.copy(path, code / name)
    shutil.copytree(wheels, house)
    sha256 = {wheel.name: wheelhouse.sha256(wheel) for wheel in house.glob("*.whl")}
    (house / wheelhouse.MANIFEST).write_text(json.dumps({"sha256": sha256}))
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "FAKE_S3": str(fake_s3),
        "HOME": str(tmp_path),
        "PIP_CONFIG_FILE": os.devnull,
    }
    return {"env": env, "house": house, "venv": tmp_path / "mnt" / "gpt-pipeline" / "venv"}


def bootstrap(node: dict) -> subprocess.CompletedProcess:
    args = ["s3://bucket/code/run-1", str(node["venv"]), "s3://bucket/code/wheelhouse/abc"]
    return subprocess.run(
        ["bash", str(emr_code.RUN_FILES["bootstrap.sh"]), *args], env=node["env"], capture_output=True, text=True
    )


def test_the_bootstrap_installs_the_wheelhouse_offline(node):
    done = bootstrap(node)
    assert done.returncode == 0, done.stderr
    python = node["venv"] / "bin" / "python"
    imported = subprocess.run([python, "-c", "import tinya, tinyb; print(tinya.NAME, tinyb.NAME)"], capture_output=True)
    assert imported.stdout.split() == [b"tinya", b"tinyb"]
    assert subprocess.run([python, "-m", "pip", "check"], capture_output=True).returncode == 0
    assert not list(node["venv"].parent.glob("bootstrap.*")), "the downloaded wheels are removed"


def test_the_bootstrap_names_the_requirement_whose_wheel_is_missing(node):
    next(node["house"].glob("tinyb-*.whl")).unlink()
    done = bootstrap(node)
    assert done.returncode != 0
    assert "tinyb==1.0" in done.stdout + done.stderr, done.stdout  # EMR keeps both in the bootstrap's log
    assert "bootstrap: ERROR pip could not install from wheelhouse s3://bucket/code/wheelhouse/abc" in done.stderr


def test_the_bootstrap_refuses_a_wheelhouse_without_its_manifest(node):
    (node["house"] / wheelhouse.MANIFEST).unlink()
    done = bootstrap(node)
    assert done.returncode != 0
    assert (
        "bootstrap: ERROR wheelhouse s3://bucket/code/wheelhouse/abc missing (no manifest.json): "
        "build it with python -m include.wheelhouse build"
    ) in done.stderr
    assert not node["venv"].exists(), "it stopped before building the environment"


def test_the_bootstrap_refuses_a_wheel_not_as_built_before_installing_any(node):
    wheel = next(node["house"].glob("tinyb-*.whl"))
    data = bytearray(wheel.read_bytes())
    data[-1] ^= 0xFF  # the same size, another content
    wheel.write_bytes(bytes(data))
    done = bootstrap(node)
    assert done.returncode != 0
    assert f"bootstrap: ERROR wheelhouse s3://bucket/code/wheelhouse/abc: {wheel.name} hash mismatch (sha256 " in (
        done.stderr
    )
    assert not node["venv"].exists(), "it stopped before building the environment"


def test_the_bootstrap_refuses_a_manifest_without_sha256s(node):
    (node["house"] / wheelhouse.MANIFEST).write_text("{}")
    done = bootstrap(node)
    assert "its manifest.json lists no sha256 of its wheels: rebuild it with" in done.stderr
    assert not node["venv"].exists()


def test_a_stalled_dnf_fails_the_bootstrap_naming_it(node):
    stub = Path(node["env"]["PATH"].split(":")[0]) / "dnf"
    stub.write_text("#!/bin/bash\nexec sleep 30\n")
    node["env"]["BOOTSTRAP_STEP_TIMEOUT_S"] = "1"
    done = bootstrap(node)
    assert done.returncode != 0
    assert "bootstrap: ERROR timed out after 1 s: sudo dnf install -y -q python3.11 python3.11-pip" in done.stderr


def test_every_download_and_dnf_has_a_time_limit():
    script = emr_code.RUN_FILES["bootstrap.sh"].read_text()
    lines = [line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")]
    commands = [line for line in lines if " s3 cp " in line or "dnf install" in line]
    assert commands and all(command.startswith("within_time ") for command in commands), commands
    assert 'step_timeout_s="${BOOTSTRAP_STEP_TIMEOUT_S:-600}"' in script
