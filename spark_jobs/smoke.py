"""Stage smoke, the EMR target's cluster check and its first step: a barrier stage of
train.num_workers tasks on the executors the train step asks for (a whole core node each), so that
it places them as training will. Each task imports the nodes' Python packages and reports their
versions, says its node's address as a training worker advertises it, and writes, reads back and
removes a small object in the run folder. The driver then checks that the addresses are distinct,
that every package imported, that YARN's largest container holds the executors the steps ask for
and that every node reached the run folder; it writes what it found to stats/smoke.json, or stops
the run before tokenize with every cause named. It makes nothing another stage reads.
"""

from __future__ import annotations

import importlib
import logging
import platform

from pipeline import lake, run_folder
from pipeline.config import PipelineConfig
from pipeline.errors import PipelineError
from spark_jobs.spark.nodes import needs_distinct_hosts, node_host, shared_hosts_error
from spark_jobs.spark.stage_app import run_stage

logger = logging.getLogger("spark_jobs.smoke")

# What the stages import on the nodes, besides Python itself.
PACKAGES = ("numpy", "pyarrow", "pyspark", "tensorflow")
# What YARN grants one container at most, and a node at most; YARN's own defaults when unset.
YARN_LIMITS = {"yarn.scheduler.maximum-allocation-mb": 8192, "yarn.nodemanager.resource.memory-mb": 8192}
# Spark's overhead when spark.executor.memoryOverhead is unset: a tenth of the heap, at least 384 MB.
OVERHEAD_FACTOR, OVERHEAD_MIN_MB = 0.1, 384


def smoke(spark, config: PipelineConfig, run: str) -> dict:
    found = {
        "master": spark.sparkContext.master,
        "nodes": probe_nodes(spark, run, config.train.num_workers),
        "yarn": yarn_limits(spark),
        "executor_mb": executor_request_mb(spark),
    }
    found["distinct_addresses"] = len({node["address"] for node in found["nodes"]}) == len(found["nodes"])
    problems = cluster_problems(found)
    if problems:
        raise PipelineError(f"the cluster check failed: {'; '.join(problems)} (found: {summary(found)})")
    logger.info("cluster check passed: %s", summary(found))
    return found


def probe_nodes(spark, run: str, workers: int) -> list[dict]:
    """What each barrier task found on its node, by worker index."""
    found = (
        spark.sparkContext.parallelize(range(workers), workers)
        .barrier()
        .mapPartitions(lambda _: [probe_node(run)])
        .collect()
    )
    lake.delete(lake.join(run, run_folder.SMOKE_PROBE_FOLDER))  # what the probes left: an empty local folder
    return sorted(found, key=lambda node: node["worker"])


def probe_node(run: str) -> dict:
    """One barrier task: its node's address, package versions and a round trip to the run folder."""
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    index = context.partitionId()
    versions, import_errors = package_versions()
    return {
        "worker": index,
        "address": node_host(context, index),
        "versions": versions,
        "import_errors": import_errors,
        "run_folder_error": probe_run_folder(run, index),
    }


def package_versions() -> tuple[dict[str, str], dict[str, str]]:
    """({package: version}, {package: why it did not import}), Python's version included."""
    versions, errors = {"python": platform.python_version()}, {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.import_module(name).__version__
        except Exception as error:  # ImportError, or a build that fails as it loads
            errors[name] = f"{type(error).__name__}: {error}"
    return versions, errors


def probe_run_folder(run: str, worker: int) -> str | None:
    """Write, read back and remove a small object in the run folder; what failed, or None."""
    uri = lake.join(run, run_folder.smoke_probe_path(worker))
    written = f"cluster check of worker {worker}".encode()
    try:
        lake.write_bytes(uri, written)
        read = lake.read_bytes(uri)
        lake.delete(uri)
    except Exception as error:
        return f"{uri}: {type(error).__name__}: {error}"
    return None if read == written else f"{uri}: read back {len(read)} bytes, not the {len(written)} written"


def yarn_limits(spark) -> dict[str, int] | None:
    """YARN's limits on a container, as the driver's Hadoop configuration has them (the cluster's
    yarn-site); None off YARN (the rehearsal's standalone master, local Spark)."""
    if not spark.sparkContext.master.startswith("yarn"):
        return None
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    return {key: int(hadoop.get(key, str(default))) for key, default in YARN_LIMITS.items()}


def executor_request_mb(spark) -> dict[str, int]:
    """The memory an executor of the steps asks for: this application's settings, which are the train
    step's (include/emr_steps.py), in MB as Spark reads them."""
    conf, units = spark.sparkContext.getConf(), spark.sparkContext._jvm.org.apache.spark.network.util.JavaUtils
    heap = int(units.byteStringAsMb(conf.get("spark.executor.memory", "1g")))
    overhead = conf.get("spark.executor.memoryOverhead")
    return {
        "spark.executor.memory": heap,
        "spark.executor.memoryOverhead": int(units.byteStringAsMb(overhead))
        if overhead
        else max(OVERHEAD_MIN_MB, int(heap * OVERHEAD_FACTOR)),
    }


def cluster_problems(found: dict) -> list[str]:
    """Every reason the cluster cannot run the pipeline's steps, from what the check found."""
    problems = [
        address_problem(found["nodes"], found["master"]),
        allocation_problem(found["yarn"], found["executor_mb"]),
    ]
    for node in found["nodes"]:
        where = f"worker {node['worker']} on {node['address']}"
        imports = node["import_errors"].items()
        problems += [f"{where}: {package} does not import ({error})" for package, error in imports]
        if node["run_folder_error"]:
            problems.append(f"{where}: the run folder is not writable and readable: {node['run_folder_error']}")
    return [problem for problem in problems if problem]


def address_problem(nodes: list[dict], master: str) -> str | None:
    """Two workers on one node, where each needs one of its own (on a cluster)."""
    if not needs_distinct_hosts(master):
        return None
    return shared_hosts_error([node["address"] for node in nodes])


def allocation_problem(yarn: dict[str, int] | None, executor_mb: dict[str, int]) -> str | None:
    """An executor bigger than YARN's largest container, naming the settings on both sides."""
    if yarn is None:
        return None
    asked, largest = sum(executor_mb.values()), min(yarn.values())
    if asked <= largest:
        return None
    return (
        f"an executor asks YARN for {asked:,} MB ({settings_text(executor_mb, ' + ')}), more than its largest "
        f"container ({settings_text(yarn)}): the steps' executors and YARN are both sized from "
        "emr.core_instance_type's yarn_memory_mb in include/config/emr_cluster.yaml, which the template's "
        "yarn-site must not override"
    )


def settings_text(settings: dict[str, int], joiner: str = ", ") -> str:
    return joiner.join(f"{key} {value:,} MB" for key, value in settings.items())


def summary(found: dict) -> str:
    """One line of what the check found: each worker's address and versions, YARN, the executors."""
    nodes = "; ".join(
        f"worker {node['worker']} on {node['address']}: "
        + ", ".join(f"{package} {version}" for package, version in node["versions"].items())
        for node in found["nodes"]
    )
    yarn = settings_text(found["yarn"]) if found["yarn"] else f"no YARN ({found['master']})"
    return f"{nodes}; {yarn}; executors ask {settings_text(found['executor_mb'], ' + ')}"


if __name__ == "__main__":
    run_stage("smoke", smoke)
