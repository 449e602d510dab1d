"""Where a barrier stage's tasks run: the address each task's node is reached at, and whether the
tasks, one per node, really are on distinct nodes (the train stage's workers, and the EMR target's
cluster check of the nodes they will run on)."""

from __future__ import annotations

import os


def needs_distinct_hosts(master: str) -> bool:
    """Whether each training worker must have a node of its own: on a cluster (YARN on EMR, a Spark
    standalone master in the rehearsal), where two workers on one node would share its vCPUs and
    memory, each sized for one; not on local[N], whose workers share this machine by design."""
    return master.startswith(("yarn", "spark://"))


def host_of(address: str) -> str:
    """The host of a host:port address (an IPv6 host keeps its colons)."""
    return address.rsplit(":", 1)[0]


def shared_hosts_error(hosts: list[str]) -> str | None:
    """What is wrong when some workers' hosts (by worker index) are one node's, else None."""
    shared = sorted({host for host in hosts if hosts.count(host) > 1})
    if not shared:
        return None
    sharing = "; ".join(
        f"workers {', '.join(str(index) for index, name in enumerate(hosts) if name == host)} on {host}"
        for host in shared
    )
    return (
        f"the training workers must run on distinct nodes, but {sharing} (hosts by worker: {', '.join(hosts)}): "
        "train.num_workers must not exceed the cluster's nodes (emr.core_instance_count), each of whose executors "
        "must own the whole node (include/emr_steps.py train_resources)"
    )


def node_host(context, index: int) -> str:
    """The address this task's node is reached at. Each task says its own (allGather spreads it):
    SPARK_LOCAL_IP when the node's Spark has one, as the executors of a Spark standalone worker bound
    to its own address inherit it (BarrierTaskInfo.address names the driver's side of the executor's
    connection there, 127.0.0.1 for every node of the EMR rehearsal), else the address Spark knows the
    task's executor by (YARN's node, or the local machine)."""
    return os.environ.get("SPARK_LOCAL_IP") or host_of(context.getTaskInfos()[index].address)
