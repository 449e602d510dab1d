from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from filelock import FileLock

# The suite's parts (make check, make test) and the guard that a test starts only what it is marked for.
pytest_plugins = ("tests.layers", "tests.side_by_side")

# Airflow reads its home and database when first imported: give the test session its own.
AIRFLOW_HOME = tempfile.mkdtemp(prefix="gpt-pipeline-test-airflow-")
atexit.register(shutil.rmtree, AIRFLOW_HOME, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = AIRFLOW_HOME
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{AIRFLOW_HOME}/airflow.db"
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"

from local_platform.moto_s3 import MACHINE_AWS_SETTINGS  # noqa: E402

# No test reads this machine's pipeline or AWS settings, or reaches AWS: a client that no test
# pointed at its moto server gets made-up keys and an endpoint where nothing listens.
for name in (
    "GPT_PIPELINE_CONFIG",
    "GPT_PIPELINE_AIRFLOW_HOME",
    "AIRFLOW_VAR_MLFLOW_TRACKING_URI",
    *MACHINE_AWS_SETTINGS,
):
    os.environ.pop(name, None)
# The local commands a test starts track their runs in a store of the session's, never the checkout's
# mlflow/ or a `make mlflow` server of the machine's.
os.environ["GPT_PIPELINE_MLFLOW_URI"] = f"sqlite:///{AIRFLOW_HOME}/mlflow/mlflow.db"
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
    }
)

from tests.subprocess_env import drop_outer_command  # noqa: E402

# `make test ARGS=…` (or CORPUS, SET, PYTEST_ADDOPTS…) reaches no process a test starts.
drop_outer_command(os.environ)
# Every JVM the tests start (local Spark, the stages, the rehearsal's master, workers and executors)
# compiles with C1 alone: on the tests' small inputs a JVM lives seconds, and C2's compiling costs
# more CPU than it gives back (tests/local_platform/test_rehearsal_cluster.py: 53 CPU-seconds instead
# of 72). Not the pipeline's setting: Word2Vec on the whole tinyshakespeare takes 4 times as long that
# way (docs/testing.md).
QUICK_JIT = "-XX:TieredStopAtLevel=1"
# The XLA programs TensorFlow compiles (the train and evaluation steps) are kept in a folder the whole
# test session shares, so a training of a shape an earlier test compiled loads it instead (the train
# stage on the tests' small model: 22 CPU-seconds instead of 26). Made once, by the pytest-xdist
# controller, whose workers inherit it.
XLA_CACHE_SETTING = "GPT_PIPELINE_TEST_XLA_CACHE"


def add_option(name: str, option: str) -> None:
    """Add an option to a space-separated setting of the environment, once."""
    options = os.environ.get(name, "").split()
    if option not in options:
        os.environ[name] = " ".join([*options, option])


add_option("JAVA_TOOL_OPTIONS", QUICK_JIT)
if XLA_CACHE_SETTING not in os.environ:
    os.environ[XLA_CACHE_SETTING] = tempfile.mkdtemp(prefix="gpt-pipeline-test-xla-")
    atexit.register(shutil.rmtree, os.environ[XLA_CACHE_SETTING], ignore_errors=True)
add_option("TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={os.environ[XLA_CACHE_SETTING]}")

from pipeline import run_folder  # noqa: E402
from pipeline.config import SHARED_CORPUS, PipelineConfig  # noqa: E402
from pipeline.config_files import load_config  # noqa: E402


@pytest.fixture(scope="session")
def shakespeare() -> Path:
    assert SHARED_CORPUS.is_file(), f"the shared corpus is expected at {SHARED_CORPUS}"
    return SHARED_CORPUS


def write_slice(folder: Path, corpus: Path, chars: int = 60_000) -> Path:
    """folder/corpus/slice.txt: the first `chars` characters of `corpus`, cut at a line end."""
    text = corpus.read_text(encoding="utf-8")[:chars]
    path = folder / "corpus" / "slice.txt"
    path.parent.mkdir(parents=True)
    path.write_text(text[: text.rfind("\n") + 1], encoding="utf-8")
    return path


@pytest.fixture
def shakespeare_slice(tmp_path, shakespeare) -> Path:
    """The first ~60 kB of tinyshakespeare, cut at a line end."""
    return write_slice(tmp_path, shakespeare)


# Small sizes for the data and embedding stages: runs of the stages on a slice take seconds.
SMALL_DATA = [
    "tokenizer.vocab_size=512",
    "data.block_size=32",
    "data.stride=16",
    "embedding.dim=32",
    "embedding.word2vec.max_sentences=2000",
]


def small_config(tmp_path: Path, corpus: Path | str, overrides: list | None = None) -> PipelineConfig:
    """The default config on a small corpus, with the lake under tmp_path and small sizes."""
    base = [{"corpus": str(corpus), "lake": str(tmp_path / "lake")}, *SMALL_DATA]
    return load_config(overrides=base + (overrides or []))


def new_run(config: PipelineConfig, run_id: str = "test-run") -> str:
    return run_folder.create_run(config, run_id)


@pytest.fixture(scope="session")
def code_dir(tmp_path_factory) -> Path:
    """The code spark-submit ships, packaged once for the session."""
    from include.spark_submit import package_code

    folder = tmp_path_factory.mktemp("code")
    package_code(folder)
    return folder


PREPROCESSED_MARK = "made"  # written once the four applications have succeeded


def make_preprocessed(tmp: Path, shakespeare: Path, code_dir: Path) -> None:
    """Two corpus files cut from the first ~60 kB of tinyshakespeare under tmp, and the run folder
    "e2e" through the four preprocessing applications, each a real spark-submit."""
    from local_platform import stage_runner
    from pipeline.stages import PREPROCESSING_STAGES

    text = shakespeare.read_text(encoding="utf-8")[:60_000]
    text = text[: text.rfind("\n") + 1]
    middle = text.rfind("\n", 0, 40_000) + 1
    folder = tmp / "corpus"
    folder.mkdir(parents=True)
    for name, part in {"a.txt": text[:middle], "b.txt": text[middle:]}.items():
        (folder / name).write_text(part, encoding="utf-8")
    config = small_config(tmp, folder / "*.txt")
    run = new_run(config, "e2e")
    for stage in PREPROCESSING_STAGES:
        stage_runner.submit_stage(stage, config, run, code_dir)
    (tmp / PREPROCESSED_MARK).touch()


def read_preprocessed(tmp: Path) -> tuple[PipelineConfig, str, dict[str, str]]:
    folder = tmp / "corpus"
    config = small_config(tmp, folder / "*.txt")
    texts = {path.as_uri(): path.read_text(encoding="utf-8") for path in sorted(folder.glob("*.txt"))}
    return config, run_folder.run_dir(config, "e2e"), texts


@pytest.fixture(scope="session")
def preprocessed(tmp_path_factory, shakespeare, code_dir, worker_id):
    """A run folder through the four preprocessing applications on two small files: read by
    tests/e2e/test_preprocess.py, and copied by the training tests. Returns the config, the run
    folder and each file's text. Made once per test run: on pytest-xdist's workers, by the first
    one to ask, under a lock, in the folder they share; the other reads it."""
    if worker_id == "master":
        tmp = tmp_path_factory.mktemp("preprocessed")
        make_preprocessed(tmp, shakespeare, code_dir)
        return read_preprocessed(tmp)
    tmp = tmp_path_factory.getbasetemp().parent / "preprocessed"
    with FileLock(f"{tmp}.lock"):
        if not (tmp / PREPROCESSED_MARK).exists():
            shutil.rmtree(tmp, ignore_errors=True)  # what a worker that failed making it left
            make_preprocessed(tmp, shakespeare, code_dir)
    return read_preprocessed(tmp)


@pytest.fixture
def moto(monkeypatch):
    """A moto server with made-up credentials, the Airflow connection aws_default pointed at it."""
    from local_platform.moto_s3 import LocalS3

    with LocalS3() as server:
        for name, value in server.connection_env().items():
            monkeypatch.setenv(name, value)
        yield server
