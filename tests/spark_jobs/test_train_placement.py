"""The train stage's check that its workers run on distinct nodes, where they should."""

from __future__ import annotations

from spark_jobs.spark.nodes import host_of, needs_distinct_hosts, shared_hosts_error


def test_workers_need_nodes_of_their_own_on_a_cluster_only():
    assert needs_distinct_hosts("yarn") and needs_distinct_hosts("spark://127.0.0.1:7077")
    assert not needs_distinct_hosts("local[2,4]") and not needs_distinct_hosts("local[*]")


def test_workers_sharing_a_host_are_named():
    assert shared_hosts_error(["10.0.1.17", "10.0.1.18", "10.0.1.19"]) is None
    error = shared_hosts_error(["10.0.1.17", "10.0.1.18", "10.0.1.17", "10.0.1.18"])
    assert error is not None
    assert "but workers 0, 2 on 10.0.1.17; workers 1, 3 on 10.0.1.18 " in error
    assert "(hosts by worker: 10.0.1.17, 10.0.1.18, 10.0.1.17, 10.0.1.18)" in error
    assert "train.num_workers must not exceed the cluster's nodes (emr.core_instance_count)" in error
    assert "workers 0, 1 on ::1 " in shared_hosts_error(["::1", "::1"])


def test_an_ipv6_host_keeps_its_colons_only_the_port_is_cut_off():
    assert host_of("::1:4001") == "::1" and host_of("10.0.1.17:4001") == "10.0.1.17"
