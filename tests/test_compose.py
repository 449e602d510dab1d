"""docker-compose.yaml and the Dockerfile, checked without a Docker engine.

The compose file is read with PyYAML (anchors and `<<` merges resolved) and `${VAR:-default}`
interpolated with the defaults, as `docker compose` does when no variable is set. The bucket
service's script, airflow-init's admin password script and its AIRFLOW_UID check, and Airflow's
writing of the generated config are run for real here, against a moto S3 server and the simple
auth manager's own password reader.
"""

from __future__ import annotations

import configparser
import fnmatch
import json
import os
import posixpath
import re
import shlex
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import pytest
import yaml

from include.record import AWS_CONN_ID
from local_platform.moto_s3 import LocalS3
from pipeline.config import REPO_ROOT
from pipeline.config_files import load_config

COMPOSE_FILE = REPO_ROOT / "docker-compose.yaml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
# Where the compose file puts the repository: the code resolves paths against this root.
CONTAINER_ROOT = "/opt/airflow"
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
ONE_SHOT_SERVICES = ("airflow-init", "create-bucket")
STORAGE_SERVICES = ("postgres", "localstack")
# The last LocalStack image that starts without LOCALSTACK_AUTH_TOKEN (docs/docker.md).
LOCALSTACK_TOKENLESS_IMAGE = "localstack/localstack:4.14.0"

VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)")


def interpolate(text: str, variables: dict[str, str] | None = None) -> str:
    """`${VAR:-default}` -> default, `${VAR}` -> '', `$$` -> `$`: compose with no variables set,
    or with `variables` set."""

    def value(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(3)
        return (variables or {}).get(name) or match.group(2) or ""

    return VARIABLE.sub(value, text)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    """The services `docker compose up` starts (those behind a profile only start on request)."""
    return {name: spec for name, spec in compose["services"].items() if not spec.get("profiles")}


@pytest.fixture(scope="module")
def common_env(compose) -> dict[str, str]:
    return {key: interpolate(str(value)) for key, value in compose["x-airflow-common"]["environment"].items()}


def env_of(spec: dict) -> dict[str, str]:
    return {key: interpolate(str(value)) for key, value in spec.get("environment", {}).items()}


def volumes(spec: dict) -> dict[str, str]:
    """container path -> what is mounted there: a host path (starting with . or /) or a volume name."""
    return dict(reversed(interpolate(volume).split(":")[:2]) for volume in spec.get("volumes", []))


def bind_mounts(spec: dict) -> dict[str, str]:
    """container path -> host path, relative to the compose file."""
    return {target: source for target, source in volumes(spec).items() if source.startswith((".", "/"))}


def host_path(source: str) -> Path:
    return (COMPOSE_FILE.parent / source).resolve()


def container_path(uri: str) -> str:
    """Where a file:// URI of this checkout lands inside the containers."""
    relative = os.path.relpath(urlsplit(uri).path, REPO_ROOT)
    return posixpath.normpath(posixpath.join(CONTAINER_ROOT, relative))


def mount_holding(mounts: dict[str, str], path: str) -> tuple[str, str]:
    """The (container, host) mount that `path` lies under, the deepest one."""
    holding = [target for target in mounts if path == target or path.startswith(target + "/")]
    assert holding, f"{path} is under no mount; mounts are {sorted(mounts)}"
    target = max(holding, key=len)
    return target, mounts[target]


def dependencies(spec: dict) -> dict[str, str]:
    return {name: rule["condition"] for name, rule in spec.get("depends_on", {}).items()}


def start_layers(services: dict) -> list[set[str]]:
    """Services grouped by the order `up` can start them in; CycleError on a cycle."""
    sorter = TopologicalSorter({name: set(dependencies(spec)) for name, spec in services.items()})
    sorter.prepare()
    layers = []
    while sorter.is_active():
        ready = set(sorter.get_ready())
        layers.append(ready)
        sorter.done(*ready)
    return layers


def published_ports(spec: dict) -> dict[int, int]:
    """host port -> container port."""
    ports = {}
    for entry in spec.get("ports", []):
        host, container = interpolate(str(entry)).rsplit(":", 2)[-2:]
        ports[int(host)] = int(container)
    return ports


def init_script(spec: dict, variables: dict[str, str] | None = None) -> str:
    return interpolate(spec["command"][-1], variables)


# --- services and start order -------------------------------------------------------------


def test_services_follow_airflow_3_layout(compose, services):
    assert set(services) == set(STORAGE_SERVICES + ONE_SHOT_SERVICES + AIRFLOW_SERVICES)
    commands = {name: services[name]["command"] for name in AIRFLOW_SERVICES}
    assert commands == {
        "airflow-apiserver": "api-server",
        "airflow-scheduler": "scheduler",
        "airflow-dag-processor": "dag-processor",
        "airflow-triggerer": "triggerer",
    }
    common = compose["x-airflow-common"]
    for name in AIRFLOW_SERVICES + ONE_SHOT_SERVICES:
        assert services[name]["image"] == common["image"] and services[name]["build"] == ".", name
    assert env_of(services["airflow-scheduler"])["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    init_script = services["airflow-init"]["command"][-1]
    assert "airflow db migrate" in init_script
    assert services["airflow-init"]["user"] == "0:0", "airflow-init hands logs/ and lake/ to AIRFLOW_UID as root"


def test_start_order_is_storage_then_setup_then_airflow(services):
    for name, spec in services.items():
        unknown = set(dependencies(spec)) - set(services)
        assert not unknown, f"{name} depends on unknown services {unknown}"
    try:
        layers = start_layers(services)
    except CycleError as error:
        pytest.fail(f"depends_on has a cycle: {error.args[1]}")
    assert layers == [set(STORAGE_SERVICES), set(ONE_SHOT_SERVICES), set(AIRFLOW_SERVICES)]


def test_dependency_conditions_can_be_met(services):
    """service_healthy needs a healthcheck; service_completed_successfully needs a service that exits."""
    for name, spec in services.items():
        for target, condition in dependencies(spec).items():
            if condition == "service_healthy":
                assert "healthcheck" in services[target], (
                    f"{name} waits for {target} to be healthy: it has no healthcheck"
                )
            elif condition == "service_completed_successfully":
                assert target in ONE_SHOT_SERVICES and "restart" not in services[target], (
                    f"{name} waits for {target} to exit"
                )
            else:
                pytest.fail(f"{name} -> {target}: unexpected condition {condition!r}")
    for name in AIRFLOW_SERVICES:
        assert dependencies(services[name]) == {
            "postgres": "service_healthy",
            "localstack": "service_healthy",
            "airflow-init": "service_completed_successfully",
            "create-bucket": "service_completed_successfully",
        }, name
    assert dependencies(services["create-bucket"]) == {"localstack": "service_healthy"}


def test_long_running_services_have_healthchecks_and_restart(services):
    for name in STORAGE_SERVICES + AIRFLOW_SERVICES:
        assert services[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
        assert services[name]["restart"] == "always", name


# --- mounts, ports, environment -----------------------------------------------------------


def test_every_mounted_host_path_exists_or_is_created_output(services):
    """Mounted sources exist in the checkout; the two output folders are git-ignored and made by airflow-init."""
    ignored = set((REPO_ROOT / ".gitignore").read_text().split())
    init_script = services["airflow-init"]["command"][-1]
    for name, spec in services.items():
        for target, source in bind_mounts(spec).items():
            if host_path(source).exists():
                continue
            folder = PurePosixPath(source).name
            assert f"{folder}/" in ignored, f"{name}: mounted {source} does not exist and is not a git-ignored output"
            assert "mkdir -p" in init_script and target in init_script, f"{name}: airflow-init does not create {target}"


def test_code_and_data_are_mounted_where_the_code_looks(services, common_env):
    config = load_config()
    assert common_env["PYTHONPATH"] == CONTAINER_ROOT
    for name in AIRFLOW_SERVICES:
        mounts = bind_mounts(services[name])
        for folder in ("dags", "pipeline", "spark_jobs", "include", "lake"):
            assert host_path(mounts[f"{CONTAINER_ROOT}/{folder}"]) == REPO_ROOT / folder, (name, folder)
        lake_target, lake_source = mount_holding(mounts, container_path(config.lake))
        assert lake_target == container_path(config.lake) and host_path(lake_source) == REPO_ROOT / "lake"
        for corpus in config.corpus:
            target, source = mount_holding(mounts, container_path(corpus))
            inside = posixpath.relpath(container_path(corpus), target)
            assert (host_path(source) / inside).is_file(), f"{name}: corpus {corpus} is not in the mounted {source}"
    bucket_mounts = bind_mounts(services["create-bucket"])
    script = services["create-bucket"]["command"][-1]
    target, source = mount_holding(bucket_mounts, script)
    assert (host_path(source) / posixpath.relpath(script, target)).is_file()


def test_ports_are_published_on_loopback_only(compose, services, common_env):
    published = {name: published_ports(spec) for name, spec in services.items() if spec.get("ports")}
    assert published == {"airflow-apiserver": {8080: 8080}, "localstack": {4566: 4566}}
    for name, spec in compose["services"].items():  # the debug profile's services too
        for entry in spec.get("ports", []):
            port = interpolate(str(entry)).rsplit(":", 1)[-1]
            assert entry == f"127.0.0.1:{port}:{port}", f"{name} publishes {entry!r} beyond 127.0.0.1"
    api_port = published["airflow-apiserver"][8080]
    assert f"http://localhost:{api_port}/" in " ".join(services["airflow-apiserver"]["healthcheck"]["test"])
    execution_api = urlsplit(common_env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert (execution_api.hostname, execution_api.port) == ("airflow-apiserver", api_port)
    assert urlsplit(common_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).hostname == "postgres"


def test_aws_connection_points_at_localstack(services, common_env):
    # The collect task's connection, and the one the EMR tasks take from the config.
    for conn_id in {AWS_CONN_ID, load_config().emr.aws_conn_id}:
        assert f"AIRFLOW_CONN_{conn_id.upper()}" in common_env, f"no connection {conn_id} in the environment"
    connection = json.loads(common_env[f"AIRFLOW_CONN_{AWS_CONN_ID.upper()}"])
    assert connection["conn_type"] == "aws"
    endpoint = urlsplit(connection["extra"]["endpoint_url"])
    localstack_port = next(iter(published_ports(services["localstack"]).values()))
    assert (endpoint.hostname, endpoint.port) == ("localstack", localstack_port)
    assert common_env["AWS_ENDPOINT_URL"] == connection["extra"]["endpoint_url"]
    assert connection["extra"]["region_name"] == common_env["AWS_DEFAULT_REGION"]
    assert load_config().emr.region in (None, common_env["AWS_DEFAULT_REGION"])  # None: the connection's
    # LocalStack's well-known dummy keys: anything else here would be a real credential.
    assert (connection["login"], connection["password"]) == ("test", "test")
    assert (common_env["AWS_ACCESS_KEY_ID"], common_env["AWS_SECRET_ACCESS_KEY"]) == ("test", "test")


def test_environment_has_every_name_the_local_s3_code_sets(services):
    """The containers get the same AWS variables as a local run with its moto server."""
    local = LocalS3().connection_env()
    # The two /dev/null files and the loopback proxy bypass only keep this machine's own AWS profile
    # and proxy out of a local run.
    wanted = {name for name, value in local.items() if value != "/dev/null" and name.upper() != "NO_PROXY"}
    assert f"AIRFLOW_CONN_{AWS_CONN_ID.upper()}" in wanted
    for name in AIRFLOW_SERVICES + ("create-bucket",):
        missing = wanted - set(env_of(services[name]))
        assert not missing, f"{name} lacks {sorted(missing)}"


def test_localstack_is_pinned_and_token_comes_from_the_environment(compose, services):
    localstack = services["localstack"]
    assert interpolate(localstack["image"]) == LOCALSTACK_TOKENLESS_IMAGE
    raw_env = compose["services"]["localstack"]["environment"]
    assert raw_env["LOCALSTACK_AUTH_TOKEN"] == "${LOCALSTACK_AUTH_TOKEN:-}", "the token is never written in the file"
    assert "s3" in raw_env["SERVICES"].split(",")
    assert "/_localstack/health" in " ".join(localstack["healthcheck"]["test"])


def admin_password(env: dict[str, str], passwords_file: Path) -> subprocess.CompletedProcess:
    """airflow-init's password script run here, with `env` and the passwords file moved."""
    env = {**env, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file), "PATH": os.environ["PATH"]}
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "docker" / "admin_password.py")], env=env, capture_output=True, text=True
    )


def read_passwords(path: Path) -> dict[str, str]:
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    with path.open() as stream:
        return SimpleAuthManager._get_passwords(stream)


def test_admin_password_is_generated_once_kept_private_and_read_by_the_api_server(services, tmp_path):
    init, api = services["airflow-init"], services["airflow-apiserver"]
    init_env, api_env = env_of(init), env_of(api)
    user, role = api_env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"].split(":")
    assert (user, role) == (init_env["_AIRFLOW_WWW_USER_USERNAME"], "admin")
    assert init_env["_AIRFLOW_WWW_USER_PASSWORD"] == "", "no default password"
    assert "python /opt/airflow/docker/admin_password.py" in init_script(init)
    passwords_file = api_env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    config_file = api_env["AIRFLOW_CONFIG"]
    for path in (passwords_file, config_file):
        shared = {volumes(spec).get(posixpath.dirname(path)) for spec in (init, api)}
        assert len(shared) == 1 and None not in shared, f"{path} is not on a volume shared by init and api-server"

    written = tmp_path / "passwords.json"
    first = admin_password(init_env, written)
    assert first.returncode == 0, first.stderr
    (password,) = read_passwords(written).values()
    assert read_passwords(written) == {user: password} and len(password) >= 20
    assert f"Admin user {user!r}, generated password: {password}" in first.stdout
    assert written.stat().st_mode & 0o777 == 0o600
    again = admin_password(init_env, written)
    assert read_passwords(written) == {user: password} and password not in again.stdout, "printed once, then kept"
    chosen = admin_password({**init_env, "_AIRFLOW_WWW_USER_PASSWORD": "chosen-by-the-user"}, written)
    assert read_passwords(written) == {user: "chosen-by-the-user"} and "chosen-by-the-user" not in chosen.stdout


def test_every_component_reads_one_generated_fernet_key_kept_private(services, common_env, tmp_path):
    """No service sets a Fernet key (an empty one would turn encryption off): Airflow generates one
    into AIRFLOW_CONFIG, on the config volume, when airflow-init's first command finds no config."""
    for name, spec in services.items():
        assert "AIRFLOW__CORE__FERNET_KEY" not in env_of(spec), f"{name} sets the Fernet key"
    for name in AIRFLOW_SERVICES:
        assert env_of(services[name])["AIRFLOW_CONFIG"] == common_env["AIRFLOW_CONFIG"], name
        assert volumes(services[name])[posixpath.dirname(common_env["AIRFLOW_CONFIG"])] == "airflow-config", name
    script = init_script(services["airflow-init"])
    assert script.index("airflow db migrate") < script.index("chown -R"), "the config is written, then handed over"

    # Any airflow command but `version` writes a missing AIRFLOW_CONFIG, as `airflow db migrate` does.
    config = tmp_path / "config" / "airflow.cfg"
    env = {"AIRFLOW_HOME": str(tmp_path), "AIRFLOW_CONFIG": str(config), "PATH": os.environ["PATH"]}
    argv = [sys.executable, "-m", "airflow", "config", "list", "--defaults"]
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(config)
    assert len(parser["core"]["fernet_key"]) == 44 and parser["api_auth"]["jwt_secret"]
    assert config.stat().st_mode & 0o777 == 0o600


def test_init_refuses_root_for_the_airflow_services(services):
    """The scheduler holds SYS_ADMIN in its bounding set: AIRFLOW_UID=0 would give it to the tasks."""
    # Every command the script runs after its checks stops the script here, naming itself.
    stubs = "".join(f"{command}() {{ echo reached {command}; exit 3; }}\n" for command in ("mkdir", "airflow", "chown"))
    for uid, code, output in (("0", 1, "ERROR: AIRFLOW_UID=0"), ("1000", 3, "reached mkdir")):
        script = stubs + init_script(services["airflow-init"], {"AIRFLOW_UID": uid})
        result = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
        assert (result.returncode, output in result.stdout) == (code, True), result.stdout + result.stderr


def test_only_the_scheduler_may_make_the_train_stages_network_namespace(compose, services):
    """docs/network.md: the train stage runs in a private network namespace; under Docker's default
    seccomp profile unshare(2) needs SYS_ADMIN. The scheduler (where LocalExecutor runs tasks)
    gets it with no-new-privileges, as AIRFLOW_UID; no service is privileged or unconfined."""
    scheduler = services["airflow-scheduler"]
    assert scheduler["cap_add"] == ["SYS_ADMIN"]
    assert scheduler["security_opt"] == ["no-new-privileges:true"]
    assert interpolate(scheduler["user"]) == "50000:0"
    for name, spec in compose["services"].items():
        assert not spec.get("privileged") and "seccomp:unconfined" not in spec.get("security_opt", []), name
        if name != "airflow-scheduler":
            assert "cap_add" not in spec, f"{name} adds capabilities"
    overrides = [entry for spec in services.values() for entry in env_of(spec).values()]
    assert not any("allow_exposed_workers" in entry for entry in overrides), "the workers are contained, not exposed"


def test_bucket_service_creates_the_configured_bucket(services, tmp_path):
    """Run create-bucket's command with its own environment, the endpoint moved to a moto server."""
    spec = services["create-bucket"]
    env = env_of(spec)
    program, script = spec["command"]
    assert program == "python"
    target, source = mount_holding(bind_mounts(spec), script)
    argv = [sys.executable, str(host_path(source) / posixpath.relpath(script, target))]
    bucket = load_config().s3.bucket
    with LocalS3() as s3:
        connection = json.loads(env[f"AIRFLOW_CONN_{AWS_CONN_ID.upper()}"])
        connection["extra"]["endpoint_url"] = s3.endpoint_url
        child_env = {key: value for key, value in env.items() if key.startswith("AWS_")}
        child_env.update(
            {
                f"AIRFLOW_CONN_{AWS_CONN_ID.upper()}": json.dumps(connection),
                "AWS_ENDPOINT_URL": s3.endpoint_url,
                "AWS_CONFIG_FILE": "/dev/null",
                "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                "PYTHONPATH": str(REPO_ROOT),
                "AIRFLOW_HOME": str(tmp_path),
                "PATH": os.environ["PATH"],
            }
        )
        first = subprocess.run(argv, env=child_env, capture_output=True, text=True, timeout=120)
        assert first.returncode == 0, first.stderr
        assert f"s3://{bucket} created" in first.stdout
        assert [item["Name"] for item in s3.client().list_buckets()["Buckets"]] == [bucket]
        again = subprocess.run(argv, env=child_env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0 and f"s3://{bucket} already exists" in again.stdout, again.stderr


# --- the image ----------------------------------------------------------------------------


def pinned_requirements() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"requirements.txt: {line!r} is not pinned with =="
            pins[name.lower()] = version
    return pins


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_image_is_official_airflow_at_the_pinned_version_for_python_3_11():
    """The base is a build argument (a local image where the official one cannot be pulled) whose
    default is the official image."""
    instructions = dockerfile_instructions()
    bases = [argument for instruction, argument in instructions if instruction == "FROM"]
    assert bases == ["${AIRFLOW_BASE}"]
    assert instructions.index(("FROM", "${AIRFLOW_BASE}")) == 1 and instructions[0][0] == "ARG"
    name, _, default = instructions[0][1].partition("=")
    assert name == "AIRFLOW_BASE"
    match = re.fullmatch(r"apache/airflow:(\d+\.\d+\.\d+)-python(\d+\.\d+)", default)
    assert match, f"base image {default} is not an official versioned Airflow image"
    assert match.group(1) == pinned_requirements()["apache-airflow"]
    assert match.group(2) == "3.11" == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert int(match.group(1).split(".")[0]) == 3


def test_image_adds_java_17_and_installs_the_pinned_requirements():
    instructions = dockerfile_instructions()
    runs = " ".join(argument for instruction, argument in instructions if instruction == "RUN")
    assert "openjdk-17-jre-headless" in runs
    assert ("ENV", "JAVA_HOME=/usr/lib/jvm/java-17") in instructions
    copies = [shlex.split(argument) for instruction, argument in instructions if instruction == "COPY"]
    copied = {words[-1]: words[-2] for words in copies}
    installed = re.search(r"pip install [^&]*-r (\S+)", runs)
    assert installed, "the image does not pip install a requirements file"
    assert copied.get(installed.group(1)) == "requirements.txt", (
        "the installed file is not the repository's requirements.txt"
    )
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in installed.group(0), (
        "pip may move Airflow away from the base image's version"
    )
    # The last USER decides who runs the containers' commands: the image's airflow user, not root.
    assert [argument for instruction, argument in instructions if instruction == "USER"][-1] == "airflow"


def test_build_context_holds_requirements_and_not_the_environment():
    patterns = [line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [pattern for pattern in patterns if pattern and not pattern.startswith("#")]

    def ignored(path: str) -> bool:
        verdict = False
        for pattern in patterns:  # the last matching pattern wins, as in Docker
            negated = pattern.startswith("!")
            if fnmatch.fnmatch(path, pattern.lstrip("!")):
                verdict = not negated
        return verdict

    assert not ignored("requirements.txt")
    assert all(ignored(path) for path in (".venv", "lake", "logs", "airflow_home", ".git"))
