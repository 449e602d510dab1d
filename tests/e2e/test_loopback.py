"""During a local two-worker training run, every socket the run's processes listen on (the
spark-submit JVM, its Python workers, the TensorFlow workers) is on loopback, or in the private
network namespace that holds only loopback; none answers through this machine's own network
address; and the workers still train one model."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import psutil
import pytest

from include.local_spark import submit_stage
from pipeline import lake, run_folder
from tests.listening import Listening, interfaces, listening_sockets, machine_addresses
from tests.spark_jobs.test_train import fresh_run, prepared  # noqa: F401 (the fixture)

# `prepared` (four spark-submit stages) and a two-worker training, without a limit of its own.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def reachable_from_the_network(port: int, addresses: list[str]) -> list[str]:
    """Those of this machine's own network `addresses` through which `port` accepts a connection."""
    answered = []
    for address in addresses:
        try:
            with socket.create_connection((address, port), timeout=2):
                answered.append(address)
        except OSError:
            pass
    return answered


def test_a_local_training_run_listens_on_loopback_only(prepared, tmp_path, monkeypatch):  # noqa: F811
    config, run, code = fresh_run(prepared, "loopback", ["train.max_steps=60", "train.eval_interval=30"])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    failure: list[BaseException] = []

    def train() -> None:
        try:
            submit_stage("train", config, run, code)
        except BaseException as error:
            failure.append(error)

    addresses = machine_addresses()  # fails on a machine with none, where no connection would be tried
    here = os.readlink("/proc/self/ns/net")
    seen: dict[tuple, Listening] = {}  # (pid, address, port) -> the socket
    answered: dict[tuple, list[str]] = {}  # the same -> addresses of this machine it answered through
    namespaces: dict[str, list[str]] = {}  # another network namespace -> its interfaces
    commands: dict[int, str] = {}  # pid -> command line
    stage = threading.Thread(target=train)
    stage.start()
    while stage.is_alive():
        for process in psutil.Process().children(recursive=True):
            for entry in listening_sockets(process.pid):
                key = (entry.pid, entry.address, entry.port)
                if key not in seen:
                    seen[key] = entry
                    with contextlib.suppress(psutil.Error):
                        commands.setdefault(entry.pid, " ".join(process.cmdline()))
                    answered[key] = reachable_from_the_network(entry.port, addresses)
                    if entry.netns != here:
                        namespaces.setdefault(entry.netns, interfaces(entry.pid))
        time.sleep(0.2)
    stage.join()
    assert not failure, failure

    summary = sorted(f"{entry.name}[{entry.pid}] {entry.address}:{entry.port} {entry.netns}" for entry in seen.values())
    print("\nlistening during training:\n  " + "\n  ".join(summary))
    print(f"other network namespaces: {namespaces}; this machine's addresses: {addresses}")
    # The JVM (driver RPC, block manager, UI), pyspark's daemons and both TensorFlow workers were seen.
    assert {entry.name for entry in seen.values()} >= {"java", "python"}, summary
    workers = [entry for entry in seen.values() if "spark_jobs.training.trainer" in commands.get(entry.pid, "")]
    assert len({entry.pid for entry in workers}) == 2, summary
    for key, entry in seen.items():
        # In this machine's network namespace on loopback only; in another one, which holds only
        # loopback, on any address (TensorFlow's gRPC servers listen on every interface).
        assert entry.loopback or (entry.netns != here and namespaces[entry.netns] == ["lo"]), entry
        assert not answered[key], f"{entry} answered through {answered[key]}"
    assert all(entry.netns != here for entry in workers), "the TensorFlow workers are not contained"

    stats = lake.read_json(run_folder.stats_uri(run, "train"))
    results = stats["worker_results"]
    assert [result["worker"] for result in results] == [0, 1]
    assert all(result["steps"] == 60 and result["host"] == "127.0.0.1" for result in results)
    # Each worker trained on its own shards, yet both end with the very same weights.
    assert results[0]["weights_digest"] == results[1]["weights_digest"]
