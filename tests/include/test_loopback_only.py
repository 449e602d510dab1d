"""What a local run listens on: Spark's settings for the local target, the private network
namespace of include/loopback_only.py, what happens where none can be made, and the moto and
Airflow API servers' addresses. The end-to-end check during training is the two-worker test of
tests/spark_jobs/test_train.py."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from include import emr_steps, local_spark, loopback_only, preflight
from local_platform import airflow_home, airflow_runner, stage_runner, standalone
from local_platform.moto_s3 import LocalS3
from pipeline.config_files import load_config
from pipeline.errors import PipelineError
from pipeline.stages import STAGE_NAMES
from tests.listening import listening_sockets, machine_addresses

SIMULATED = "simulated: unshare(CLONE_NEWUSER|CLONE_NEWNET): Operation not permitted"


def conf_of(argv: list[str]) -> dict[str, str]:
    return dict(argv[index + 1].split("=", 1) for index, item in enumerate(argv) if item == "--conf")


def test_local_spark_applications_bind_loopback_and_emr_steps_keep_sparks_defaults(tmp_path):
    config = load_config(overrides=[f"lake={tmp_path / 'lake'}"])
    emr_config = load_config(overrides=["target=emr", "lake=s3://test-lake/pipeline"])
    for stage in STAGE_NAMES:
        conf = conf_of(local_spark.local_argv(stage, config, "file:///run", tmp_path))
        assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1", stage
        step = conf_of(emr_steps.stage_step(stage, emr_config, "run-1")["HadoopJarStep"]["Args"])
        assert not {"spark.driver.host", "spark.driver.bindAddress"} & set(step), stage
    # Spark binds its UI to SPARK_LOCAL_IP, or else to every interface.
    assert local_spark.spark_env()["SPARK_LOCAL_IP"] == "127.0.0.1"


def test_only_the_train_stage_runs_contained(tmp_path):
    config = load_config(overrides=[f"lake={tmp_path / 'lake'}"])
    for stage in STAGE_NAMES:
        argv = local_spark.local_argv(stage, config, "file:///run", tmp_path)
        launched = local_spark.launch_argv(stage, config, argv)
        assert launched == (loopback_only.prefix() + argv if stage == "train" else argv), stage


def require_namespaces() -> None:
    """The machines this project runs its tests on make private network namespaces: a local run
    relies on them (docs/network.md), so a machine without is a failure to see, not a case to pass."""
    reason = loopback_only.unavailable_reason()
    assert reason is None, f"no private network namespace here: {reason}"


def test_a_contained_command_has_loopback_only_and_what_it_listens_on_stays_off_the_network():
    require_namespaces()
    program = textwrap.dedent(
        """
        import socket, sys
        print(sorted(name for _, name in socket.if_nameindex()), flush=True)
        server = socket.create_server(("", 0))  # every interface, as TensorFlow's gRPC server
        print(server.getsockname()[1], flush=True)
        with socket.create_connection(("127.0.0.1", server.getsockname()[1]), timeout=5):
            print("loopback works", flush=True)
        sys.stdin.read()  # listen until the test is done
        """
    )
    process = subprocess.Popen(
        loopback_only.contained([sys.executable, "-c", program]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "['lo']"
        port = int(process.stdout.readline())
        assert process.stdout.readline().strip() == "loopback works"
        for address in machine_addresses():
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=2):
                pass
    finally:
        process.stdin.close()
        assert process.wait(timeout=30) == 0


def test_the_helper_runs_the_command_with_its_exit_code_and_names_a_missing_one():
    require_namespaces()
    assert subprocess.run(loopback_only.contained(["sh", "-c", "exit 7"])).returncode == 7
    missing = subprocess.run(loopback_only.contained(["no-such-command-here"]), capture_output=True, text=True)
    assert missing.returncode == 127 and "cannot run no-such-command-here" in missing.stderr


def test_where_no_network_namespace_can_be_made_the_check_says_why():
    assert shutil.which("unshare"), "util-linux's unshare is needed to make a limited user namespace"
    # A user namespace whose limit of network namespaces is 0 stands for a platform without them.
    command = ["sh", "-c", 'echo 0 > /proc/sys/user/max_net_namespaces && exec "$@"', "sh"]
    check = [sys.executable, "-I", str(loopback_only.HELPER), "--check"]
    probe = subprocess.run(["unshare", "--user", "--map-root-user", *command, "true"], capture_output=True)
    assert probe.returncode == 0, f"cannot make the limited user namespace here: {probe.stderr.decode().strip()}"
    limited = subprocess.run(["unshare", "--user", "--map-root-user", *command, *check], capture_output=True, text=True)
    assert limited.returncode == 1
    assert limited.stderr.startswith("no private network namespace: unshare(")
    assert "No space left on device" in limited.stderr


@pytest.fixture
def no_namespaces(monkeypatch):
    """This machine as one where no private network namespace can be made (a container, say)."""
    monkeypatch.setattr(loopback_only, "unavailable_reason", lambda: SIMULATED)


def test_without_namespaces_training_stops_before_it_starts_naming_the_reason_and_the_setting(
    no_namespaces, tmp_path, monkeypatch
):
    config = load_config(overrides=[f"lake={tmp_path / 'lake'}"])
    monkeypatch.setattr(local_spark, "run_spark_submit", lambda *args: pytest.fail("spark-submit ran"))
    with pytest.raises(PipelineError) as stopped:
        local_spark.submit_stage("train", config, "file:///run", tmp_path)
    message = str(stopped.value)
    assert "cannot keep the TensorFlow training workers off the network" in message
    assert SIMULATED in message and "local.allow_exposed_workers=true" in message
    # The other stages listen on loopback without a namespace, and run.
    ran = []
    monkeypatch.setattr(local_spark, "run_spark_submit", lambda argv, env: ran.append(argv) or 0)
    local_spark.submit_stage("export", config, "file:///run", tmp_path)
    assert ran and ran[0][0].endswith("spark-submit")


def test_without_namespaces_the_local_runner_stops_before_any_stage(no_namespaces, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(stage_runner, "run_pipeline", lambda *args: pytest.fail("a stage ran"))
    monkeypatch.setattr(preflight.memory, "check_local_training", lambda config: {})
    monkeypatch.setattr(preflight.disk_room, "check_lake_room", lambda config, sizes: None)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 2000, encoding="utf-8")
    assert stage_runner.main(["--corpus", str(corpus), "--set", f"lake={tmp_path / 'lake'}"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("ERROR this machine cannot keep the TensorFlow training workers off the network")
    assert "local.allow_exposed_workers=true" in error


def test_the_setting_accepts_the_exposure_for_one_run_and_says_so(no_namespaces, tmp_path, monkeypatch, capfd):
    config = load_config(overrides=[f"lake={tmp_path / 'lake'}", "local.allow_exposed_workers=true"])
    ran = []
    monkeypatch.setattr(local_spark, "run_spark_submit", lambda argv, env: ran.append(argv) or 0)
    local_spark.submit_stage("train", config, "file:///run", tmp_path)
    assert ran[0] == local_spark.local_argv("train", config, "file:///run", tmp_path)  # not contained
    warning = capfd.readouterr().err
    assert warning.startswith("WARNING [train] this machine cannot keep the TensorFlow training workers off")
    assert "training anyway, as local.allow_exposed_workers is true for this run" in warning
    assert load_config().local.allow_exposed_workers is False  # the default never exposes them


def test_the_moto_server_listens_on_loopback():
    with LocalS3() as s3:
        port = int(s3.endpoint_url.rsplit(":", 1)[1])
        assert s3.endpoint_url.startswith("http://127.0.0.1:")
        mine = [entry for entry in listening_sockets() if entry.port == port]
        assert mine and all(entry.address == "127.0.0.1" for entry in mine), mine


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_make_airflow_refuses_an_api_server_beyond_loopback(host, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(airflow_home, "AIRFLOW_HOME", tmp_path / "home")
    monkeypatch.setenv("AIRFLOW__API__HOST", host)
    assert airflow_runner.main(["ui"]) == 2
    assert f"ERROR AIRFLOW__API__HOST={host} is not a loopback address" in capsys.readouterr().err
    assert not (tmp_path / "home").exists(), "Airflow was prepared"
    for loopback in ("127.0.0.1", "localhost", "::1"):
        standalone.check_loopback(loopback)
