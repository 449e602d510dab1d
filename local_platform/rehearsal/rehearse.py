"""`make rehearse`: the `emr` target's DAG, unchanged, run on this machine before paying for EMR.

    python -m local_platform.rehearsal.rehearse [--corpus C] [--set section.key=value ...]

Airflow's `dags test` runs the DAG with target emr; its AWS connection points at a moto server
in this process, whose S3 holds the corpus (uploaded from the local files), the lake, the code and
the EMR logs, and whose EMR API is played by emr_runner on a Spark standalone cluster of loopback
nodes. Before the server ends, its buckets are kept on disk under rehearsals/ (keep.py). It ends
with `make run`'s summary, pointing at the kept copy, the cluster's id, each step's state and
seconds, and what the configured cluster would have cost on AWS for that long; a failed rehearsal,
with why its first failed task failed. docs/rehearsal.md.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import tempfile
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

import boto3
from botocore.config import Config

from include import emr_checks, emr_code, emr_cost, loopback_only, wheelhouse
from local_platform import airflow_home, console, deployment_file, mlflow_local
from local_platform.airflow_command import Stopped
from local_platform.command_settings import add_settings_arguments, add_verbose_argument, settings
from local_platform.dag_test import dags_test, latest_pointer, read_report
from local_platform.moto_s3 import REGION, LocalS3
from local_platform.rehearsal.emr_runner import EmrRehearsalRunner, split_s3
from local_platform.rehearsal.keep import REHEARSALS, keep_buckets, kept_path
from local_platform.run_summary import print_report
from pipeline import corpus_files, lake
from pipeline.config import ConfigError, PipelineConfig
from pipeline.config_files import DEFAULT_CONFIG_PATH, load_config, read_yaml
from pipeline.errors import PipelineError
from pipeline.overrides import apply_overrides

POKE_INTERVAL_S = 5  # the step sensors' poke interval on the rehearsal (EMR's default is a minute)
CORPUS_PREFIX = "corpus"
# The moto server's bucket: the emr target refuses the example bucket pipeline.yaml ships with.
BUCKET = "gpt-pipeline-rehearsal"


def rehearsal_settings(bucket: str, corpus: list[str]) -> dict:
    """What the rehearsal changes in pipeline.yaml: target emr, with the lake, corpus, code, logs
    and record on the moto server's bucket."""
    return {
        "target": "emr",
        "corpus": corpus if len(corpus) > 1 else corpus[0],
        "lake": f"s3://{bucket}/lake",
        "s3": {"bucket": bucket},
        "emr": {
            "log_uri": f"s3://{bucket}/emr-logs/",
            "code_prefix": f"s3://{bucket}/code/",
            "poke_interval_seconds": POKE_INTERVAL_S,
        },
    }


def seed_wheelhouse(config: PipelineConfig, s3_client) -> None:
    """A stand-in for the nodes' wheelhouse: its manifest, no wheels. The DAG's prepare finds it
    and builds nothing (that would need PyPI, and the rehearsal has no network); the rehearsal
    checks the bootstrap, which would install it, without running it (docs/rehearsal.md)."""
    stand_in = {"rehearsal": "stand-in written by local_platform/rehearsal: no wheels, the bootstrap is not run"}
    wheelhouse.write_manifest(stand_in, emr_code.wheelhouse_uri(config.emr.code_prefix), s3_client)


class Rehearsal:
    """The moto server, the corpus on it, the rehearsal's defaults file and the EMR runner, for as
    long as the context lasts; `run()` runs the DAG once. Holds Airflow's home."""

    def __init__(self, corpus_files: list[str], overrides: list[str], home: Path | None = None, verbose: bool = False):
        self.corpus_files, self.overrides, self.verbose = corpus_files, overrides, verbose
        self.home = home or airflow_home.AIRFLOW_HOME
        self.log = console.log_path(self.home, "rehearse")
        names = [Path(lake.local_path(uri) if "://" in uri else uri).name for uri in corpus_files]
        if len(set(names)) != len(names):
            raise PipelineError(f"corpus: files of the same name ({', '.join(names)}) would overwrite each other on S3")
        self.corpus_uris = [f"s3://{BUCKET}/{CORPUS_PREFIX}/{name}" for name in names]
        settings = apply_overrides(read_yaml(DEFAULT_CONFIG_PATH), rehearsal_settings(BUCKET, self.corpus_uris))
        self.folder = Path(tempfile.mkdtemp(prefix="gpt-pipeline-rehearsal-"))
        # The one rehearsing is the deployer: their deployment settings are the DAG's own.
        deployers, self.run_overrides = deployment_file.split(overrides)
        self.defaults_path = deployment_file.write(self.folder / "pipeline-rehearsal.yaml", settings, None, deployers)
        try:
            self.dag_config = load_config(self.defaults_path)
            self.config = load_config(self.defaults_path, overrides)  # a bad override stops here, before Airflow
        except BaseException:  # no folder left behind
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.s3: LocalS3 | None = None
        self.runner: EmrRehearsalRunner | None = None
        self.env: dict[str, str] = {}
        self.tracking_uri = mlflow_local.tracking_uri()

    def __enter__(self) -> Rehearsal:
        self.held = ExitStack()  # the home, then the log
        self.held.enter_context(airflow_home.exclusive_home(self.home, "make rehearse"))
        try:
            task_state = airflow_home.task_state(self.home)
            self.output = self.held.enter_context(console.teed(self.log, task_state, self.verbose))
            self.s3 = LocalS3(buckets=tuple(sorted(emr_checks.bucket_settings(self.config)))).__enter__()
            for path, uri in zip(self.corpus_files, self.corpus_uris, strict=True):
                bucket, key = split_s3(uri)
                source = Path(lake.local_path(path) if "://" in path else path)
                self.s3.client().put_object(Bucket=bucket, Key=key, Body=source.read_bytes())
            seed_wheelhouse(self.config, self.s3.client())
            connection = self.s3.connection_env()
            step_env = {name: value for name, value in connection.items() if not name.startswith("AIRFLOW_")}
            self.runner = EmrRehearsalRunner(self.s3.client, step_env, REGION).start()
            self.env = airflow_home.prepare(self.home, self.s3, self.output) | {
                "GPT_PIPELINE_CONFIG": str(self.defaults_path)
            }
            self.env |= mlflow_local.tracking_env(self.dag_config, self.tracking_uri)
        except BaseException:
            self.__exit__()
            raise
        return self

    def run(self) -> bool:
        return dags_test(self.env, {"overrides": self.run_overrides}, self.output)

    def keep(self, parent: Path = REHEARSALS) -> Path:
        """The moto server's buckets but the corpus uploaded from this machine, copied to a new
        folder of parent named after the run's log."""
        assert self.s3 is not None
        return keep_buckets(self.s3.client(), parent, self.log.stem, leave_out=(f"{CORPUS_PREFIX}/",))

    def emr_client(self):
        assert self.s3 is not None
        return boto3.client(
            "emr",
            endpoint_url=self.s3.endpoint_url,
            region_name=REGION,
            aws_access_key_id=self.s3.access_key,
            aws_secret_access_key=self.s3.secret_key,
            config=Config(proxies={}),
        )

    def clusters(self) -> list[dict]:
        """Every cluster the run created, described, after the runner has ended them."""
        client = self.emr_client()
        return [client.describe_cluster(ClusterId=item["Id"])["Cluster"] for item in client.list_clusters()["Clusters"]]

    def steps(self, cluster_id: str) -> list[dict]:
        return self.emr_client().list_steps(ClusterId=cluster_id)["Steps"][::-1]

    def step_log(self, cluster: dict, step_id: str, name: str = "stderr") -> str:
        bucket, prefix = split_s3(cluster["LogUri"])
        key = f"{prefix}{cluster['Id']}/steps/{step_id}/{name}.gz"
        body = self.s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        return gzip.decompress(body).decode("utf-8", errors="replace")

    def end_clusters(self) -> None:
        """Let the runner finish terminating the clusters (the DAG's teardown asked for it)."""
        if self.runner is not None:
            self.runner.stop()
            self.runner = None

    def __exit__(self, *exc) -> None:
        try:
            self.end_clusters()
        finally:
            if self.s3 is not None:
                self.s3.__exit__(None, None, None)
                self.s3 = None
            shutil.rmtree(self.folder, ignore_errors=True)
            self.held.close()


def seconds(step: dict) -> float | None:
    timeline = step["Status"].get("Timeline", {})
    start, end = timeline.get("StartDateTime"), timeline.get("EndDateTime")
    return (end - start).total_seconds() if start and end else None


def print_cluster(rehearsal: Rehearsal) -> None:
    """The cluster's id and end, each step's state and seconds, and the configured cluster's price for that time."""
    for cluster in rehearsal.clusters():
        status = cluster["Status"]
        timeline = status["Timeline"]
        end = timeline.get("EndDateTime") or datetime.now(timezone.utc)
        hours = (end - timeline["CreationDateTime"]).total_seconds() / 3600
        reason = status.get("StateChangeReason", {}).get("Message") or ""
        print(f"\nEMR cluster:      {cluster['Id']} ({cluster.get('ReleaseLabel')}), {status['State']}: {reason}")
        for step in rehearsal.steps(cluster["Id"]):
            took = seconds(step)
            shown = f"{took:,.0f} s" if took is not None else "-"
            print(f"  step {step['Name']:<22} {step['Status']['State']:<10} {shown:>8}")
            if step["Status"]["State"] == "FAILED":
                # The stage's own "ERROR [stage] ..." line is in stdout.gz: spark-submit merges its
                # Python driver's stderr into its stdout. Otherwise the end of stderr.gz (Spark, timeout).
                errors = [
                    line
                    for line in rehearsal.step_log(cluster, step["Id"], "stdout").splitlines()
                    if line.startswith("ERROR [")
                ]
                name = "stdout.gz" if errors else "stderr.gz"
                lines = errors or rehearsal.step_log(cluster, step["Id"]).strip().splitlines()[-5:]
                print(f"    {cluster['LogUri']}{cluster['Id']}/steps/{step['Id']}/{name}:")
                for line in lines:
                    print(f"    | {line}")
        config = rehearsal.config
        hourly = emr_cost.hourly_cost_usd(config)
        print(
            f"on AWS:           about ${hourly * hours:,.2f} for {hours * 60:,.1f} min at ${hourly:.2f}/hour "
            f"(1 {config.emr.master_instance_type} + {config.emr.core_instance_count} {config.emr.core_instance_type}; "
            f"{emr_cost.price_basis(config)}; "
            "EMR bills a minute at least, and this machine is slower than the cluster)"
        )


def keep_record(rehearsal: Rehearsal, parent: Path) -> Path | None:
    """The rehearsal's buckets kept on disk; a disk that refuses them costs the copy, not the summary."""
    try:
        return rehearsal.keep(parent)
    except OSError as error:
        print(f"WARNING the rehearsal's record was not kept in {parent}: {error}", file=sys.stderr)
        return None


def rehearse(
    corpus_files: list[str],
    overrides: list[str],
    verbose: bool = False,
    home: Path | None = None,
    kept_in: Path = REHEARSALS,
) -> int:
    with Rehearsal(corpus_files, overrides, home=home, verbose=verbose) as rehearsal:
        try:
            succeeded = rehearsal.run()
        except Stopped:
            print("\ninterrupted: the rehearsal stops here", file=sys.stderr)
            airflow_home.fail_unfinished_runs(rehearsal.home, rehearsal.env)
            console.print_log_path(rehearsal.log)
            return 130
        rehearsal.end_clusters()
        kept = keep_record(rehearsal, kept_in)
        if succeeded:
            report = read_report(rehearsal.s3, rehearsal.config)
            if kept is not None:  # the server's run folder ends with the command
                report["run_folder"] = kept_path(kept, report["run_folder"]).as_uri()
            pointer = latest_pointer(rehearsal.s3, rehearsal.config)
            print_report(report, *pointer, tracking=mlflow_local.describe(rehearsal.tracking_uri))
        if kept is not None:
            print(f"\n{'kept:':<18}{kept} (the moto server's s3://bucket/key as bucket/key, but the corpus)")
        print_cluster(rehearsal)
        if not succeeded:
            console.print_failure(rehearsal.log, rehearsal.output, "rehearsal")
            return 1
    return 0


def local_corpus(corpus: str | None) -> list[str]:
    """The local corpus files to upload: --corpus, else pipeline.yaml's corpus."""
    config = load_config(DEFAULT_CONFIG_PATH, [{"corpus": corpus}] if corpus else [])
    if any(uri.startswith("s3://") for uri in config.corpus):
        raise PipelineError("corpus: the rehearsal uploads a local corpus to its moto server; give local files")
    return list(corpus_files.corpus_files(config))


def contain_or_accept_exposure(overrides: list[str], argv: list[str]) -> None:
    """Start this command again in a private network namespace that holds only loopback: the
    rehearsal cluster's TensorFlow workers listen on every interface and authenticate no one, and
    nothing here needs the network (docs/network.md). Where no such namespace can be made, go on
    only if the run accepts the exposure (local.allow_exposed_workers=true), as a local run does."""
    reason = loopback_only.unavailable_reason()
    if reason is None:
        command = loopback_only.contained([sys.executable, "-m", "local_platform.rehearsal.rehearse", *argv])
        os.execv(command[0], command)  # does not return
        return
    accepted = load_config(overrides=[setting for setting in overrides if setting.startswith("local.")])
    if not accepted.local.allow_exposed_workers:
        raise PipelineError(
            f"this machine cannot keep the rehearsal's TensorFlow workers off the network ({reason}): run where "
            "private network namespaces are allowed (docs/network.md), or accept the exposure for one run with "
            "SET='local.allow_exposed_workers=true'"
        )
    print(f"WARNING the rehearsal's TensorFlow workers listen on every interface ({reason})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", help="corpus path or glob on this machine (empty: the one in pipeline.yaml)")
    add_settings_arguments(parser)
    add_verbose_argument(parser)
    args = parser.parse_args(argv)
    try:
        overrides, corpus = settings(args), local_corpus(args.corpus)
        if loopback_only.interfaces() != [loopback_only.LOOPBACK_INTERFACE]:
            contain_or_accept_exposure(overrides, sys.argv[1:] if argv is None else argv)
        return rehearse(corpus, overrides, args.verbose)
    except (PipelineError, ConfigError) as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
