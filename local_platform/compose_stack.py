"""`make compose-test`: docker-compose.yaml run for real on this machine, one DAG run through it.

    python -m local_platform.compose_stack [--remove-images]

It starts dockerd when none runs (as root; stopped again at the end), builds the images, starts the
stack with docker-compose (Compose v1 or v2), waits for every healthcheck, triggers the DAG through
Airflow's REST API with small settings on a slice of tinyshakespeare, waits for the run to succeed,
and reads the run's record and latest pointer from the stack's S3 on its published 127.0.0.1
port. Whatever happens, it then removes the stack's containers, networks, volumes and files; the
images stay as a build cache for the next run (`--remove-images` removes them too). A failing step
fails with the service's own log lines.

No image can be pulled here, so the test builds local stand-ins of the three images users pull
(docker/standins/: Airflow, postgres and LocalStack on a Debian base made with debootstrap) and
builds the project's Dockerfile on the Airflow stand-in. docs/docker.md says what differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import boto3
import yaml
from botocore.config import Config

from include.promote import latest_key
from pipeline import run_folder
from pipeline.config import REPO_ROOT, SHARED_CORPUS
from pipeline.config_files import load_config

PROJECT = "gpt-pipeline-compose-test"
# Debian suite -> the base image made of it with debootstrap (minbase)
BASES = {suite: f"gpt-pipeline-standin/debian:{suite}" for suite in ("bookworm", "trixie")}
# docker/standins/{name}/ -> the stand-in image's tag, and the suite it builds on: the official
# Airflow image is Debian bookworm's; LocalStack's is trixie's, with the Python 3.13 it needs.
STANDINS = {
    "airflow": ("gpt-pipeline-standin/airflow:3.3.2-python3.11", "bookworm"),
    "postgres": ("gpt-pipeline-standin/postgres:15", "bookworm"),
    "localstack": ("gpt-pipeline-standin/localstack:4.14.0", "trixie"),
}
AIRFLOW_IMAGE = f"{PROJECT}/airflow:3.3.2"
# The commands this test needs -> the Debian packages that provide them.
TOOLS = {
    "docker": "docker.io",
    "dockerd": "docker.io",
    "docker-compose": "docker-compose",
    "debootstrap": "debootstrap",
}
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
LONG_RUNNING = ("postgres", "localstack", *AIRFLOW_SERVICES)
ONE_SHOT = ("airflow-init", "create-bucket")
API = "http://127.0.0.1:8080"
S3_ENDPOINT = "http://127.0.0.1:4566"
CONFIG_VOLUME = "/opt/airflow/config"
PASSWORDS_FILE = f"{CONFIG_VOLUME}/simple_auth_manager_passwords.json"
DAG_ID = "gpt_pipeline"
RUN_NAME = "compose"
CORPUS_IN_CONTAINER = "/opt/shared/data/slice.txt"
# The trigger form's fields (include/trigger_form.py), small as the end-to-end tests' runs.
RUN_CONF = {
    "corpus": CORPUS_IN_CONTAINER,
    "run_name": RUN_NAME,
    "vocab_size": 512,
    "block_size": 32,
    "stride": 16,
    "embedding_dim": 32,
    "n_layer": 2,
    "batch_size": 16,
    "max_steps": 40,
    "eval_interval": 20,
    "max_new_tokens": 20,
    "overrides": [
        "embedding.word2vec.max_sentences=2000",
        "train.warmup_steps=5",
        "train.eval_batches=4",
        "train.checkpoint_interval=20",
    ],
}
HEALTHY_TIMEOUT_S = 420
API_TIMEOUT_S = 60
RUN_TIMEOUT_S = 600
LOG_LINES = 60
SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


class StackError(Exception):
    """A failed step; `services` are those whose logs explain it."""

    def __init__(self, message: str, services: tuple[str, ...] = ()):
        super().__init__(message)
        self.services = services


class NoAnswer(StackError):
    """A request the API server did not answer (in time): polling tries again."""


def step(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, text=True, **kwargs)


# --- tools and dockerd ----------------------------------------------------------------------


def compose_command() -> list[str]:
    """Compose v1 (docker-compose) where it is installed, else v2 (the docker CLI's plugin)."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return ["docker", "compose"]


def has(command: str) -> bool:
    if command == "docker-compose" and shutil.which("docker"):
        return run(compose_command() + ["version"], capture_output=True).returncode == 0
    return shutil.which(command) is not None


def ensure_tools() -> None:
    """Install docker.io, docker-compose and debootstrap with apt-get when one is missing (as root)."""
    missing = sorted({package for command, package in TOOLS.items() if not has(command)})
    if not missing:
        return
    if os.geteuid() != 0:
        raise StackError(f"missing {', '.join(missing)}: sudo apt-get install -y {' '.join(missing)}")
    step(f"apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        if run(argv, env=env, stdout=subprocess.DEVNULL).returncode != 0:
            raise StackError(f"{' '.join(argv)} failed")


def docker_answers() -> bool:
    return run(["docker", "info"], capture_output=True).returncode == 0


@contextmanager
def dockerd(workdir: Path) -> Iterator[None]:
    """A running Docker engine: the one there is, or dockerd started here and stopped at the end."""
    if docker_answers():
        yield
        return
    if os.geteuid() != 0:
        raise StackError("no Docker engine answers, and only root can start dockerd here")
    log = workdir / "dockerd.log"
    step(f"starting dockerd (its log: {log})")
    with log.open("w") as stream:
        process = subprocess.Popen(["dockerd"], stdout=stream, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(docker_answers, 60, "dockerd did not answer in 60 s", log_file=log)
        yield
    finally:
        step("stopping the dockerd started here")
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until(condition, timeout_s: float, message: str, interval_s: float = 2, log_file: Path | None = None):
    """Call `condition` until it returns something true, and return that; StackError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(interval_s)
    tail = "\n" + "\n".join(log_file.read_text(errors="replace").splitlines()[-LOG_LINES:]) if log_file else ""
    raise StackError(message + tail)


# --- images -------------------------------------------------------------------------------


def image_exists(name: str) -> bool:
    return run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def build_base_image(suite: str, workdir: Path) -> None:
    """Debian `suite` (minbase) from debootstrap, with its updates and security sources, imported
    as BASES[suite], unless that image is there."""
    if image_exists(BASES[suite]):
        return
    root = workdir / f"rootfs-{suite}"
    step(f"debootstrap {suite} -> {BASES[suite]}")
    logged(["debootstrap", "--variant=minbase", suite, str(root)], workdir / f"debootstrap-{suite}.log")
    for package in (root / "var/cache/apt/archives").glob("*.deb"):
        package.unlink()
    (root / "etc/apt/sources.list").write_text(
        f"deb http://deb.debian.org/debian {suite} main\n"
        f"deb http://deb.debian.org/debian {suite}-updates main\n"
        f"deb http://deb.debian.org/debian-security {suite}-security main\n"
    )
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    imported = run(["docker", "import", "-", BASES[suite]], stdin=tar.stdout, capture_output=True)
    tar.stdout.close()
    if tar.wait() != 0 or imported.returncode != 0:
        raise StackError(f"docker import of the debootstrap base failed: {imported.stderr}")
    shutil.rmtree(root)


def pip_ca_bundle() -> Path:
    """The CA bundle this machine's pip trusts (PIP_CERT or pip's `cert` setting), else the system's."""
    configured = (
        os.environ.get("PIP_CERT")
        or run([sys.executable, "-m", "pip", "config", "get", "global.cert"], capture_output=True).stdout.strip()
    )
    return Path(configured or SYSTEM_CA_BUNDLE)


def build_standin(name: str, workdir: Path) -> None:
    """docker/standins/{name}/ built with this machine's pip CA bundle and requirements.txt beside it."""
    tag, suite = STANDINS[name]
    build_base_image(suite, workdir)
    context = workdir / f"context-{name}"
    shutil.copytree(REPO_ROOT / "docker" / "standins" / name, context)
    shutil.copyfile(pip_ca_bundle(), context / "build-host-ca.crt")
    shutil.copyfile(REPO_ROOT / "requirements.txt", context / "requirements.txt")
    step(f"docker build {tag}")
    argv = ["docker", "build", "--build-arg", f"STANDIN_BASE={BASES[suite]}", "-t", tag, str(context)]
    logged(argv, workdir / f"build-{name}.log", env={**os.environ, "DOCKER_BUILDKIT": "0"})


def logged(argv: list[str], log: Path, env: dict | None = None) -> None:
    """Run argv with its output in `log`; StackError with the log's last lines when it fails."""
    with log.open("w") as stream:
        code = run(argv, stdout=stream, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-LOG_LINES:])
        raise StackError(f"{' '.join(argv[:3])} ... failed (exit code {code}):\n{tail}")


def build_images(compose: Compose, workdir: Path) -> None:
    for name in STANDINS:
        build_standin(name, workdir)
    airflow_base = STANDINS["airflow"][0]
    step(f"docker-compose build: the project's Dockerfile on {airflow_base}")
    compose.logged(["build", "--build-arg", f"AIRFLOW_BASE={airflow_base}", "airflow-init"], workdir / "build.log")


def cached_images() -> list[str]:
    return [AIRFLOW_IMAGE, *(tag for tag, _ in STANDINS.values()), *BASES.values()]


def remove_images() -> None:
    step("removing the images")
    for image in cached_images():
        run(["docker", "image", "rm", "--force", image], capture_output=True)


# --- the stack ------------------------------------------------------------------------------


class Compose:
    """docker-compose with the repository's compose file and an override that puts the stand-in
    images in place of the pulled ones and the stack's writable host folders (lake/, logs/) and the
    corpus under `workdir`, with no variable from this shell or the checkout's .env."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.env_file = workdir / "compose.env"
        self.override = workdir / "docker-compose.override.yaml"

    def write_files(self, services: dict) -> None:
        corpus = self.workdir / "corpus"
        variables = {"AIRFLOW_UID": "50000", "AIRFLOW_IMAGE_NAME": AIRFLOW_IMAGE, "CORPUS_DIR": str(corpus)}
        self.env_file.write_text("".join(f"{name}={value}\n" for name, value in variables.items()))
        self.override.write_text(json.dumps({"services": override_services(services, self.workdir)}, indent=2))

    def argv(self, args: list[str]) -> list[str]:
        files = ["-f", str(REPO_ROOT / "docker-compose.yaml"), "-f", str(self.override)]
        return [*compose_command(), "--env-file", str(self.env_file), "-p", PROJECT, *files, *args]

    def env(self) -> dict[str, str]:
        passed = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG")
        return {name: os.environ[name] for name in passed if name in os.environ}

    def __call__(self, args: list[str], **kwargs) -> subprocess.CompletedProcess:
        return run(self.argv(args), env=self.env(), cwd=REPO_ROOT, **kwargs)

    def logged(self, args: list[str], log: Path) -> None:
        logged(self.argv(args), log, env=self.env())

    def logs(self, service: str) -> str:
        return self(["logs", "--no-color", "--tail", str(LOG_LINES), service], capture_output=True).stdout

    def exec(self, service: str, argv: list[str]) -> str:
        result = self(["exec", "-T", service, *argv], capture_output=True)
        if result.returncode != 0:
            raise StackError(f"{' '.join(argv)} in {service} failed: {result.stderr.strip()}", (service,))
        return result.stdout


# The scheduler runs the tasks (LocalExecutor), and so the stages' JVMs. On the test's small run a
# JVM lives seconds and C2's compiling costs more than it gives back: C1 alone, as every JVM the
# test suite starts (tests/conftest.py; docs/docker.md). A stack that trains on a real corpus keeps
# the JVM's default.
TASK_JVM_ENVIRONMENT = {"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"}


def override_services(services: dict, workdir: Path) -> dict:
    """The compose override: stand-in images, lake/, logs/ under workdir (same container paths),
    and the scheduler's task JVMs' options."""
    override: dict = {name: {"image": STANDINS[name][0]} for name in ("postgres", "localstack")}
    override["airflow-scheduler"] = {"environment": TASK_JVM_ENVIRONMENT}
    outputs = {"/opt/airflow/lake": workdir / "lake", "/opt/airflow/logs": workdir / "logs"}
    for name, spec in services.items():
        parts = {part for volume in spec.get("volumes", []) for part in str(volume).split(":")}
        mounts = [f"{source}:{target}" for target, source in outputs.items() if target in parts]
        if mounts:
            override.setdefault(name, {})["volumes"] = mounts
    return override


def write_corpus_slice(folder: Path, chars: int = 60_000) -> None:
    """folder/slice.txt: the first `chars` characters of tinyshakespeare, cut at a line end."""
    text = SHARED_CORPUS.read_text(encoding="utf-8")[:chars]
    folder.mkdir(parents=True)
    (folder / Path(CORPUS_IN_CONTAINER).name).write_text(text[: text.rfind("\n") + 1], encoding="utf-8")


SERVICE_LABEL = "com.docker.compose.service"


def containers() -> dict[str, str]:
    """service -> container id, for the stack's containers, running or not (Compose labels them)."""
    listed = run(
        ["docker", "ps", "--all", "--filter", f"label=com.docker.compose.project={PROJECT}"]
        + ["--format", f'{{{{.Label "{SERVICE_LABEL}"}}}} {{{{.ID}}}}'],
        capture_output=True,
    ).stdout
    return dict(line.split() for line in listed.splitlines())


def service_states() -> dict[str, str]:
    """service -> 'healthy', 'starting', 'unhealthy', 'exited 0', 'exited 1', 'running', …"""
    ids = list(containers().values())
    template = (
        f'{{{{index .Config.Labels "{SERVICE_LABEL}"}}}} {{{{.State.Status}}}} {{{{.State.ExitCode}}}} '
        "{{if .State.Health}}{{.State.Health.Status}}{{end}}"
    )
    inspected = run(["docker", "inspect", "-f", template, *ids], capture_output=True).stdout if ids else ""
    states = {}
    for line in inspected.splitlines():
        service, status, code, *health = line.split()
        states[service] = f"exited {code}" if status == "exited" else (health[0] if health else status)
    return states


# What each service's state must be once the stack is up.
READY = {**dict.fromkeys(ONE_SHOT, "exited 0"), **dict.fromkeys(LONG_RUNNING, "healthy")}


def not_ready() -> dict[str, str]:
    """The services not in their READY state yet, with their states."""
    states = service_states()
    return {service: states.get(service, "missing") for service in READY if states.get(service) != READY[service]}


def start_stack(compose: Compose) -> None:
    step("docker-compose up -d")
    up = compose(["up", "-d", "--no-build"], capture_output=True)
    if up.returncode != 0:
        raise StackError(f"docker-compose up failed:\n{up.stderr.strip()}", tuple(not_ready()))


def wait_healthy() -> None:
    """Every healthcheck passes and the one-shot services exited with 0; each change is printed."""
    step("waiting for every healthcheck")
    shown: dict[str, str] = {}

    def ready() -> bool:
        waiting = not_ready()
        states = {service: waiting.get(service, READY[service]) for service in READY}
        for service, state in states.items():
            if shown.get(service) != state:
                step(f"  {service}: {state}")
        shown.update(states)
        return not waiting

    try:
        wait_until(ready, HEALTHY_TIMEOUT_S, "", interval_s=5)
    except StackError:
        waiting = not_ready()
        checks = "".join(f"\n{service}'s last healthcheck: {last_healthcheck(service)}" for service in waiting)
        raise StackError(f"not ready after {HEALTHY_TIMEOUT_S} s: {waiting}{checks}", tuple(waiting)) from None


def last_healthcheck(service: str) -> str:
    template = "{{if .State.Health}}{{json .State.Health.Log}}{{else}}[]{{end}}"
    inspected = run(["docker", "inspect", "-f", template, containers().get(service, "")], capture_output=True)
    checks = json.loads(inspected.stdout or "[]") if inspected.returncode == 0 else []
    return f"exit code {checks[-1]['ExitCode']}: {checks[-1]['Output'].strip()[-500:]}" if checks else "none"


# --- Airflow's REST API ---------------------------------------------------------------------


def api(path: str, token: str | None = None, body: dict | None = None, accept: str = "application/json"):
    """GET (POST with `body`) Airflow's API on the published port: JSON, or text for text/plain;
    None for a 404."""
    request = urllib.request.Request(
        API + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": accept}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    try:
        with opener.open(request, timeout=API_TIMEOUT_S) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        detail = error.read().decode(errors="replace")[:1000]
        raise StackError(f"{request.get_method()} {path}: HTTP {error.code} {detail}", ("airflow-apiserver",)) from None
    except OSError as error:
        raise NoAnswer(f"{request.get_method()} {path}: {error}", ("airflow-apiserver",)) from None
    return text if accept == "text/plain" else json.loads(text)


def answered(request):
    """A polling condition: `request()`, or None when the API server did not answer this time."""

    def condition():
        try:
            return request()
        except NoAnswer:
            return None

    return condition


def admin_password(compose: Compose) -> tuple[str, str]:
    """(user, password) from the passwords file airflow-init wrote on the config volume."""
    ((user, password),) = json.loads(compose.exec("airflow-apiserver", ["cat", PASSWORDS_FILE])).items()
    return user, password


def token(user: str, password: str) -> str:
    return api("/auth/token", body={"username": user, "password": password})["access_token"]


def dag_is_parsed(token_: str) -> bool:
    return api(f"/api/v2/dags/{DAG_ID}", token_) is not None


def run_state(token_: str, run_id: str) -> str | None:
    """The run's state once it has finished, else None."""
    state = api(run_path(run_id), token_)["state"]
    return state if state in ("success", "failed") else None


def trigger(token_: str) -> str:
    step(f"POST /api/v2/dags/{DAG_ID}/dagRuns: {json.dumps(RUN_CONF)}")
    created = api(f"/api/v2/dags/{DAG_ID}/dagRuns", token_, {"logical_date": None, "conf": RUN_CONF})
    return created["dag_run_id"]


def run_path(run_id: str) -> str:
    return f"/api/v2/dags/{DAG_ID}/dagRuns/{urllib.parse.quote(run_id, safe='')}"


def wait_for_run(token_: str, run_id: str) -> None:
    step(f"waiting for run {run_id}")
    message = f"run {run_id} did not finish in {RUN_TIMEOUT_S} s"
    try:
        state = wait_until(answered(lambda: run_state(token_, run_id)), RUN_TIMEOUT_S, message, interval_s=10)
    except StackError as error:
        raise StackError(f"{error}\n{task_report(token_, run_id)}", ("airflow-scheduler",)) from None
    if state != "success":
        raise StackError(f"run {run_id} failed\n{task_report(token_, run_id)}", ("airflow-scheduler",))
    step(f"run {run_id}: success\n{task_report(token_, run_id)}")


def task_report(token_: str, run_id: str) -> str:
    """Each task's state and duration, and the last lines of the failed tasks' logs."""
    tasks = api(f"{run_path(run_id)}/taskInstances", token_)["task_instances"]
    lines = [f"  {task['task_id']}: {task['state']} ({task['duration'] or 0:.0f} s)" for task in tasks]
    for task in tasks:
        if task["state"] in ("failed", "upstream_failed") and task["try_number"]:
            path = f"{run_path(run_id)}/taskInstances/{task['task_id']}/logs/{task['try_number']}"
            log = api(path, token_, accept="text/plain").splitlines()[-LOG_LINES:]
            lines += [f"--- {task['task_id']} (try {task['try_number']}), last lines of its log:", *log]
    return "\n".join(lines)


# --- checks ---------------------------------------------------------------------------------


def s3_client():
    # LocalStack's well-known dummy keys, which the compose file gives its services.
    return boto3.client(
        "s3",
        endpoint_url=S3_ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(proxies={}),
    )


def check_record(run_id: str) -> None:
    """The run's record on S3 holds its config, stats, model, sample and reports; the run trained
    contained (no local.allow_exposed_workers); latest points at its model."""
    config = load_config(overrides=[{"run_name": RUN_NAME}])
    bucket, client = config.s3.bucket, s3_client()
    prefix = f"{config.s3.prefix.strip('/')}/{run_folder.safe_run_id(f'{RUN_NAME}-{run_id}')}/"
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    keys = {item["Key"][len(prefix) :] for item in listed}
    expected = {run_folder.CONFIG_FILE, run_folder.SAMPLES_PATH, *run_folder.REPORTS}
    if not expected <= keys or not any(key.startswith(f"{run_folder.MODEL_FOLDER}/") for key in keys):
        missing = sorted(expected - keys) or "the model"
        raise StackError(f"s3://{bucket}/{prefix} lacks {missing}; it holds {sorted(keys)}")
    recorded = json.loads(client.get_object(Bucket=bucket, Key=prefix + run_folder.CONFIG_FILE)["Body"].read())
    if recorded["local"]["allow_exposed_workers"] or recorded["train"]["max_steps"] != RUN_CONF["max_steps"]:
        raise StackError(f"the record's config is not the triggered one: {recorded['local']}, {recorded['train']}")
    pointer = json.loads(client.get_object(Bucket=bucket, Key=latest_key(config))["Body"].read())
    if pointer["model"] != f"s3://{bucket}/{prefix}{run_folder.MODEL_FOLDER}/":
        raise StackError(f"s3://{bucket}/{latest_key(config)} points at {pointer['model']}, not at this run's model")
    step(f"record: s3://{bucket}/{prefix} ({len(keys)} objects); latest: s3://{bucket}/{latest_key(config)}")


FERNET_KEY_DIGEST = (
    "import hashlib; from airflow.configuration import conf; "
    "print(hashlib.sha256(conf.get('core', 'fernet_key').encode()).hexdigest())"
)
EMPTY_DIGEST = hashlib.sha256(b"").hexdigest()


def check_secrets(compose: Compose) -> None:
    """The generated config and passwords file are the airflow user's alone, and every component
    reads the same non-empty Fernet key (compared by digest, never shown)."""
    secrets = (f"{CONFIG_VOLUME}/airflow.cfg", PASSWORDS_FILE)
    modes = compose.exec("airflow-apiserver", ["stat", "-c", "%a %u %n", *secrets])
    if any(line.split()[:2] != ["600", "50000"] for line in modes.splitlines()):
        raise StackError(f"the secrets on the config volume are open to others:\n{modes}", ("airflow-init",))
    with ThreadPoolExecutor() as pool:
        digests = set(pool.map(lambda name: compose.exec(name, ["python", "-c", FERNET_KEY_DIGEST]), AIRFLOW_SERVICES))
    if len(digests) != 1 or f"{EMPTY_DIGEST}\n" in digests:
        raise StackError("the components do not share one non-empty Fernet key", ("airflow-init",))


# --- the whole test -------------------------------------------------------------------------


def exercise(compose: Compose) -> None:
    start_stack(compose)
    wait_healthy()
    check_secrets(compose)
    user, password = admin_password(compose)
    token_ = token(user, password)
    wait_until(answered(lambda: dag_is_parsed(token_)), 180, f"{DAG_ID} did not appear in the API", interval_s=5)
    run_id = trigger(token_)
    wait_for_run(token_, run_id)
    check_record(run_id)


def compose_test(keep_images: bool = True) -> int:
    started = time.monotonic()
    ensure_tools()
    workdir = Path(tempfile.mkdtemp(prefix=f"{PROJECT}-"))
    compose = Compose(workdir)
    try:
        with dockerd(workdir):
            compose.write_files(yaml.safe_load((REPO_ROOT / "docker-compose.yaml").read_text())["services"])
            write_corpus_slice(workdir / "corpus")
            try:
                compose(["down", "--volumes", "--remove-orphans"], capture_output=True)  # an earlier run's leftovers
                build_images(compose, workdir)
                exercise(compose)
            except StackError as error:
                report_failure(compose, error)
                return 1
            finally:
                step("docker-compose down --volumes")
                compose(["down", "--volumes", "--remove-orphans", "--timeout", "20"], capture_output=True)
                if not keep_images:
                    remove_images()
    except StackError as error:
        report_failure(compose, error)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    step(f"compose test passed in {time.monotonic() - started:.0f} s")
    if keep_images:
        print(f"kept as a build cache: {', '.join(cached_images())}")
    return 0


def report_failure(compose: Compose, error: StackError) -> None:
    print(f"FAILED: {error}", file=sys.stderr, flush=True)
    for service in error.services:
        print(f"--- docker-compose logs --tail {LOG_LINES} {service}", file=sys.stderr)
        print(compose.logs(service), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--remove-images", action="store_true", help="also remove the images built (no cache)")
    args = parser.parse_args(argv)
    # SIGTERM (a time-out, a stopped CI job) unwinds like Ctrl-C: the stack is removed all the same.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return compose_test(keep_images=not args.remove_images)


if __name__ == "__main__":
    sys.exit(main())
