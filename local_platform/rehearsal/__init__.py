"""The EMR rehearsal: the `emr` target's DAG run on this machine against moto's EMR and S3 API,
with a runner that plays EMR's part (emr_runner) on a Spark standalone cluster (cluster) whose
nodes are loopback addresses. `make rehearse`; docs/rehearsal.md."""
