"""The pipeline's contract, shared by the DAG, include/, local_platform/ and the Spark applications:
the configuration (schema, files, overrides), the run folder and its markers, the stage table, the
lake's storage, errors and log lines."""
