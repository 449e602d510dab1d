"""The DAG triggered from the Airflow UI in a real browser.

Starts Airflow with the documented UI command (`make airflow`: `airflow standalone` and a moto S3
server) with the login page on, then drives headless Chromium (Debian's `chromium` and
`chromium-driver` through Selenium) to log in, open gpt_pipeline, see the trigger form refuse
values out of their config fields' ranges, change Params in it and trigger it. The REST API is
only read: to follow the run and to fetch the collect task's report. The run's record is checked
on the moto server, and a screenshot of the finished run's grid view goes to test-artifacts/.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import boto3
import pytest
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from include.airflow_names import DAG_ID
from local_platform import standalone
from local_platform.moto_s3 import REGION
from pipeline import run_folder
from pipeline.config import REPO_ROOT
from pipeline.config_files import load_config
from pipeline.stages import STAGE_NAMES
from tests.deployments import deployment_env
from tests.e2e.browser import ARTIFACTS, chromium
from tests.listening import free_port
from tests.local_platform.airflow_commands import exposed_sockets, trigger

TASKS = ["validate_config", *STAGE_NAMES, "collect", "promote", "prune_runs"]
USER = "admin"
LOGIN_LINE = re.compile(r"log in as admin, password in (?P<file>\S+) \(readable by you alone\)")
UI_LINE = re.compile(r"Airflow UI: (?P<api>http://\S+) \(DAG \w+\); S3 \(moto\): (?P<s3>http://\S+);")
STARTUP_TIMEOUT_S = 600
RUN_TIMEOUT_S = 900
API_TIMEOUT_S = 30
TYPING_BURST = 16  # characters
TYPING_ATTEMPTS = 3
MAX_STEPS = 12  # the training budget set in the form (the default is 1500)
SECTIONS = ["data", "model", "training", "generation", "other"]  # the form's, in order
# train.learning_rate: gt=0, which Airflow's form does not show: the trigger is refused.
REFUSED_LEARNING_RATE = "Invalid input for param learning_rate: -1 is less than or equal to the minimum of 0"
SPARK_STARTED = "Running Spark version"  # a stage's first line in the task log
BLANK = "about:blank"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(STARTUP_TIMEOUT_S + RUN_TIMEOUT_S + 120)]


class AirflowUI:
    """`make airflow` running in its own process group, with the simple auth manager's login page."""

    def __init__(self, home: Path, log_path: Path, env: dict[str, str]):
        self.home = home
        self.password = ""  # the one `make airflow` made up, read from the file it names
        env = dict(env)
        env.update(
            {
                "GPT_PIPELINE_AIRFLOW_HOME": str(home),
                "AIRFLOW__API__PORT": str(free_port()),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            }
        )
        # The test session's Airflow settings (tests/conftest.py) are not the command's.
        for name in ("AIRFLOW_HOME", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
            env.pop(name, None)
        self.log_path = log_path
        self.log = log_path.open("w")
        self.process = subprocess.Popen(
            # -o venv: make must not rebuild the environment the tests run in.
            ["make", "--no-print-directory", "-o", "venv", f"VENV={sys.prefix}", "airflow"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.api = self.s3_endpoint = ""
        self.token = ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_until_ready(self) -> None:
        """Until the command has printed its URLs and the API server lists the DAG."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (
                f"`make airflow` exited with {self.process.returncode}:\n{self.log_tail()}"
            )
            if not self.api and (match := UI_LINE.search(self.log_path.read_text(errors="replace"))):
                self.api, self.s3_endpoint = match.group("api"), match.group("s3")
            if not self.password and (match := LOGIN_LINE.search(self.log_path.read_text(errors="replace"))):
                self.password = json.loads(Path(match.group("file")).read_text())[USER]
            if self.api and self._dag_listed():
                return
            time.sleep(2)
        raise AssertionError(f"Airflow did not list {DAG_ID} within {STARTUP_TIMEOUT_S} s:\n{self.log_tail()}")

    def _dag_listed(self) -> bool:
        try:
            self.get(f"/api/v2/dags/{DAG_ID}")
            return True
        except OSError:  # connection refused while starting, 401/404 until the DAG is parsed
            self.token = ""
            return False

    def get(self, path: str) -> dict:
        """GET from the REST API as the test user."""
        if not self.token:
            body = json.dumps({"username": USER, "password": self.password}).encode()
            request = urllib.request.Request(
                f"{self.api}/auth/token", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as response:
                self.token = json.load(response)["access_token"]
        request = urllib.request.Request(f"{self.api}{path}", headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as response:
            return json.load(response)

    def stop(self) -> bool:
        """Ctrl-C, as in a terminal: SIGINT to the command's process group, then wait for it to
        empty; True when it did, False when what was left had to be killed."""
        group = self.process.pid
        try:
            os.killpg(group, signal.SIGINT)
            deadline = time.monotonic() + standalone.STANDALONE_GRACE_S + 60
            while time.monotonic() < deadline:
                os.killpg(group, 0)  # raises once no process of the group is left
                self.process.poll()
                time.sleep(1)
            os.killpg(group, signal.SIGKILL)
            return False
        except ProcessLookupError:
            return True
        finally:
            self.process.wait()
            self.log.close()


@pytest.fixture
def airflow_ui(tmp_path):
    """`make airflow` deployed with its lake in tmp_path, and tmp_path/corpus (shakespeare_slice's) a corpus root."""
    ARTIFACTS.mkdir(exist_ok=True)
    home = tmp_path / "airflow_home"
    deployment = {"lake": str(tmp_path / "lake"), "corpus_roots": [str(tmp_path / "corpus")]}
    ui = AirflowUI(home, ARTIFACTS / "ui-trigger-airflow.log", deployment_env(tmp_path / "pipeline.yaml", deployment))
    try:
        ui.wait_until_ready()
        yield ui
    finally:
        ui.stop()
        # The task logs (spark-submit and training output) next to Airflow's own output.
        task_logs = ARTIFACTS / "ui-trigger-task-logs"
        shutil.rmtree(task_logs, ignore_errors=True)
        if (home / "logs").is_dir():
            shutil.copytree(home / "logs", task_logs)


@pytest.fixture
def browser(tmp_path):
    with chromium(tmp_path / "chromium-profile") as driver:
        yield driver


def visible(by: str, value: str):
    """A wait condition: the element once visible. While the app redirects to its login page, a
    lookup can be aborted by the navigation; that is waited out like an element not there yet."""
    located = EC.visibility_of_element_located((by, value))

    def condition(driver: WebDriver):
        try:
            return located(driver)
        except WebDriverException as error:
            if "aborted by navigation" in str(error):
                return False
            raise

    return condition


def log_in(driver: WebDriver, ui: AirflowUI) -> None:
    driver.get(f"{ui.api}/")
    wait = WebDriverWait(driver, 60)
    wait.until(visible(By.NAME, "username")).send_keys(USER)
    driver.find_element(By.NAME, "password").send_keys(ui.password)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait.until(lambda d: "/auth/login" not in d.current_url)


def open_trigger_form(driver: WebDriver, ui: AirflowUI) -> WebElement:
    driver.get(f"{ui.api}/dags/{DAG_ID}")
    wait = WebDriverWait(driver, 60)
    wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, "[data-testid=trigger-dag-button]"))).click()
    return wait.until(visible(By.CSS_SELECTOR, "[role=dialog][aria-modal=true]"))


def form_field(form: WebElement, name: str) -> WebElement:
    """A Param's field in the form, which names it element_{param}."""
    return form.find_element(By.CSS_SELECTOR, f'[id="element_{name}"], [id="number-input:element_{name}"] input')


def section_names(form: WebElement) -> list[str]:
    return [button.text for button in form.find_elements(By.CSS_SELECTOR, "button[data-part=item-trigger]")]


def unfold_section_of(driver: WebDriver, field: WebElement) -> None:
    """Airflow opens the form with its sections folded, and unfolds one at a time."""
    if not field.is_displayed():
        section = field.find_element(By.XPATH, "./ancestor::*[@data-scope='accordion' and @data-part='item'][1]")
        section.find_element(By.CSS_SELECTOR, "button[data-part=item-trigger]").click()
        WebDriverWait(driver, 10).until(lambda _: field.is_displayed(), "the field's section did not unfold")


def set_param(driver: WebDriver, form: WebElement, name: str, value) -> None:
    """Replace a Param's value in the form, typing as a user would, and again as a user would when
    the field does not show what was typed: the form re-renders as another field loses focus (a
    number field pulling its value back into range), which can undo a keystroke."""
    field = form_field(form, name)
    unfold_section_of(driver, field)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", field)
    text = str(value)
    for _ in range(TYPING_ATTEMPTS):
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.DELETE)
        if shows_after_typing(driver, field, text):
            return
    raise AssertionError(
        f"the form's {name} field shows {field.get_attribute('value')!r} after typing {text!r} {TYPING_ATTEMPTS} times"
    )


def shows_after_typing(driver: WebDriver, field: WebElement, text: str) -> bool:
    """Type text in short bursts, each waited for: the form re-renders while it validates, and a
    long value typed in one go loses a keystroke to that (around the 50th character)."""
    for end in range(TYPING_BURST, len(text) + TYPING_BURST, TYPING_BURST):
        field.send_keys(text[end - TYPING_BURST : end])
        try:
            WebDriverWait(driver, 5).until(lambda _, typed=text[:end]: field.get_attribute("value") == typed)
        except TimeoutException:
            return False
    return True


def see_values_out_of_range_refused(driver: WebDriver, form: WebElement, ui: AirflowUI) -> None:
    """A number field pulls a value typed past its minimum back to it as it loses focus
    (train.max_steps: ge=1); a value past a bound it does not show is refused by Airflow's Param
    validation as the form is sent, which names the Param and starts no run."""
    set_param(driver, form, "max_steps", 0)
    set_param(driver, form, "learning_rate", -1)
    assert form_field(form, "max_steps").get_attribute("value") == "1"
    form.find_element(By.CSS_SELECTOR, "[data-testid=trigger-dag-submit]").click()
    WebDriverWait(driver, 30).until(
        lambda _: REFUSED_LEARNING_RATE in form.text, f"the form does not show {REFUSED_LEARNING_RATE!r}"
    )
    assert ui.get(f"/api/v2/dags/{DAG_ID}/dagRuns")["dag_runs"] == []


def leave_once_triggered(driver: WebDriver, ui: AirflowUI) -> None:
    """Once the form's run exists, leave Airflow's page for a blank one: while a run is active its
    pages refresh themselves every few seconds, and Chromium re-rendering the grid for the whole run
    took more CPU than the run's training."""
    deadline = time.monotonic() + API_TIMEOUT_S
    while not ui.get(f"/api/v2/dags/{DAG_ID}/dagRuns")["dag_runs"]:
        assert time.monotonic() < deadline, f"the form started no run within {API_TIMEOUT_S} s"
        time.sleep(0.5)
    driver.get(BLANK)


def wait_for_run(ui: AirflowUI) -> dict:
    """The run triggered from the form, once it has finished."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            runs = ui.get(f"/api/v2/dags/{DAG_ID}/dagRuns")["dag_runs"]
        except TimeoutError:  # the API server can be slow to answer on a busy machine: ask again
            continue
        assert len(runs) <= 1, (
            f"expected only the run triggered from the form, got {[run['dag_run_id'] for run in runs]}"
        )
        if runs and runs[0]["state"] in ("success", "failed"):
            return runs[0]
        time.sleep(5)
    raise AssertionError(f"the run did not finish within {RUN_TIMEOUT_S} s; task states: {task_states(ui)}")


def task_states(ui: AirflowUI) -> dict:
    runs = ui.get(f"/api/v2/dags/{DAG_ID}/dagRuns")["dag_runs"]
    if not runs:
        return {}
    instances = ui.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(runs[0]['dag_run_id'], safe='')}/taskInstances")[
        "task_instances"
    ]
    return {instance["task_id"]: instance["state"] for instance in instances}


def save_grid_screenshot(driver: WebDriver, ui: AirflowUI, run_id: str) -> Path:
    """The finished run's page: the grid with the run's column, and its task instances all successful."""
    driver.get(f"{ui.api}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}")
    wait = WebDriverWait(driver, 60)
    wait.until(visible(By.CSS_SELECTOR, "[data-testid=task-collect]"))

    def all_tasks_successful(d: WebDriver) -> bool:
        states = [badge.text.strip() for badge in d.find_elements(By.CSS_SELECTOR, "[data-testid=table-cell-state]")]
        return len(states) == len(TASKS) and set(states) == {"Success"}

    wait.until(all_tasks_successful)
    path = ARTIFACTS / "ui-trigger-grid.png"
    assert driver.save_screenshot(str(path)), "the browser did not save the screenshot"
    return path


def status_without_credentials(ui: AirflowUI, path: str) -> int:
    try:
        with urllib.request.urlopen(f"{ui.api}{path}", timeout=API_TIMEOUT_S) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_trigger_from_ui_form_runs_the_pipeline_and_records_to_s3(airflow_ui, browser, shakespeare_slice, tmp_path):
    # `make airflow` hands out no token, and serves no DAG, to whoever comes without the password.
    assert status_without_credentials(airflow_ui, "/auth/token") in (401, 403)
    assert status_without_credentials(airflow_ui, f"/api/v2/dags/{DAG_ID}") in (401, 403)
    assert stat.S_IMODE((airflow_ui.home / standalone.PASSWORDS_FILE).stat().st_mode) == 0o600
    lake_dir = tmp_path / "lake"
    log_in(browser, airflow_ui)
    form = open_trigger_form(browser, airflow_ui)
    assert section_names(form)[: len(SECTIONS)] == SECTIONS
    see_values_out_of_range_refused(browser, form, airflow_ui)
    form_values = {
        "corpus": shakespeare_slice,
        "vocab_size": 512,
        "block_size": 32,
        "stride": 16,
        "embedding_dim": 32,
        "max_steps": MAX_STEPS,
        "eval_interval": 6,
        "learning_rate": load_config().train.learning_rate,  # the default again
        "max_new_tokens": 20,
        # One setting per line, for the knobs without a field of their own.
        "overrides": "\n".join(
            [
                "embedding.word2vec.max_sentences=2000",
                "train.warmup_steps=2",
                "train.log_interval=6",
                "train.eval_batches=2",
                "train.checkpoint_interval=6",
            ]
        ),
    }
    for name, value in form_values.items():
        set_param(browser, form, name, value)
    form.find_element(By.CSS_SELECTOR, "[data-testid=trigger-dag-submit]").click()
    leave_once_triggered(browser, airflow_ui)

    run = wait_for_run(airflow_ui)
    assert run["run_type"] == "manual" and run["triggered_by"] == "ui", run
    assert run["conf"]["max_steps"] == MAX_STEPS and run["conf"]["corpus"] == str(shakespeare_slice), run["conf"]
    assert run["state"] == "success", (
        f"the run failed; task states: {task_states(airflow_ui)}; see {airflow_ui.log_path}"
    )
    run_id = run["dag_run_id"]
    run_path = f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}"

    # The collect task's output: its report (XCom) and the record on the moto server.
    report = airflow_ui.get(f"{run_path}/taskInstances/collect/xcomEntries/return_value")["value"]
    config = load_config()
    bucket, prefix = config.s3.bucket, f"{config.s3.prefix}/{Path(report['run_folder']).name}/"
    assert report["s3_uri"] == f"s3://{bucket}/{prefix}"
    assert report["run_folder"].startswith(lake_dir.as_uri()), "the run folder is not in the deployment's lake"
    assert Path(report["run_folder"]).name.startswith(f"{shakespeare_slice.stem}-"), (
        "run_name left empty: the corpus names the run"
    )
    s3 = boto3.client(
        "s3",
        endpoint_url=airflow_ui.s3_endpoint,
        region_name=REGION,
        # The moto server takes any key; these are made up here, like the command's own.
        aws_access_key_id=f"test-{secrets.token_hex(8)}",
        aws_secret_access_key=secrets.token_hex(20),
    )
    keys = {item["Key"][len(prefix) :] for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])}
    for name in (
        run_folder.CONFIG_FILE,
        run_folder.SAMPLES_PATH,
        run_folder.stats_path("train"),
        run_folder.REPORT_JSON,
        run_folder.REPORT_TEXT,
    ):
        assert name in keys, f"{name} missing from s3://{bucket}/{prefix}: {sorted(keys)}"
    assert any(key.startswith(f"{run_folder.MODEL_FOLDER}/") for key in keys), (
        f"no model/ in s3://{bucket}/{prefix}: {sorted(keys)}"
    )

    def s3_json(name: str) -> dict:
        return json.loads(s3.get_object(Bucket=bucket, Key=prefix + name)["Body"].read())

    # The values typed into the form are the ones the stages ran with.
    recorded = s3_json(run_folder.CONFIG_FILE)
    assert recorded["train"]["max_steps"] == MAX_STEPS and recorded["tokenizer"]["vocab_size"] == 512
    assert recorded["corpus"] == [shakespeare_slice.as_uri()]
    assert s3_json(run_folder.stats_path("train"))["steps"] == MAX_STEPS
    # collect's XCom is the record's report and where MLflow tracked the run (make airflow's store).
    tracked = report.pop("mlflow")
    assert tracked["run_id"] and tracked["tracking_uri"] == os.environ["GPT_PIPELINE_MLFLOW_URI"]
    assert s3_json(run_folder.REPORT_JSON) == report
    sample = s3.get_object(Bucket=bucket, Key=prefix + run_folder.SAMPLES_PATH)["Body"].read().decode("utf-8")
    assert sample.strip() and sample == report["sample"]

    # promote moved the run name's latest pointer to this model and the scheduler recorded the
    # model asset's update, which DAGs using the model are scheduled on.
    pointer_key = f"{config.s3.prefix}/latest/{shakespeare_slice.stem}.json"
    pointer = json.loads(s3.get_object(Bucket=bucket, Key=pointer_key)["Body"].read())
    assert pointer["model"] == f"s3://{bucket}/{prefix}model/"
    events = airflow_ui.get(f"/api/v2/assets/events?source_dag_id={DAG_ID}&source_run_id={quote(run_id, safe='')}")
    assert [(event["uri"], event["extra"]["pointer"]) for event in events["asset_events"]] == [
        (f"s3://{bucket}/{config.s3.prefix}/latest", pointer)
    ]

    screenshot = save_grid_screenshot(browser, airflow_ui, run_id)
    assert screenshot.stat().st_size > 10_000
    browser.get(BLANK)
    stop_with_a_task_running(airflow_ui, shakespeare_slice)


def stop_with_a_task_running(ui: AirflowUI, corpus: Path) -> None:
    """Ctrl-C during a second run's stage: Airflow's scheduler would wait forever in its
    LocalExecutor's shutdown (its workers outlive it after a second Ctrl-C); the command must
    still end, and end them. Nothing of it listened beyond loopback meanwhile."""
    stages_started = ui.log_path.read_text(errors="replace").count(SPARK_STARTED)
    trigger(ui.home, {"corpus": str(corpus), "overrides": ["train.max_steps=20"]})
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while ui.log_path.read_text(errors="replace").count(SPARK_STARTED) == stages_started:
        assert ui.process.poll() is None and time.monotonic() < deadline, f"no stage started:\n{ui.log_tail()}"
        time.sleep(0.5)
    assert exposed_sockets(ui.process.pid) == [], "a socket of `make airflow` listens beyond loopback"
    assert ui.stop(), f"Airflow or Spark processes outlived `make airflow` after Ctrl-C:\n{ui.log_tail()}"
