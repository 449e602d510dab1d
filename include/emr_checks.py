"""The checks of the AWS account's side of an EMR run, made by validate_config before any cluster
exists: the run's buckets are this account's (not the one pipeline.yaml ships with), reachable
through the connection and in the cluster's region (where the stages reach S3); the service role
can start the cluster; the corpus is on S3 (corpus_objects lists it as the tokenize stage matches
it) and is text, its first SNIFF_OBJECTS objects sniffed by their first SNIFF_BYTES with the
tokenize stage's own check. Each raises PipelineError (ConfigError) naming
the setting to change.
"""

from __future__ import annotations

import codecs
import logging

from include.emr_code import split_s3_uri
from include.record import check_bucket
from pipeline import corpus_files
from pipeline.config import ConfigError, PipelineConfig
from pipeline.errors import PipelineError, shown
from spark_jobs.text import corpus

log = logging.getLogger(__name__)

SHIPPED_BUCKET = "gpt-pipeline"  # the s3.bucket and s3:// URIs of include/config/pipeline.yaml
LEGACY_SERVICE_ROLE = "EMR_DefaultRole"
SNIFF_OBJECTS = 100
SNIFF_BYTES = 64 * 1024


def check_settings(config: PipelineConfig, s3_hook) -> None:
    """The buckets and the service role, before the corpus is listed. `s3_hook` is an S3Hook of
    the connection emr.aws_conn_id (the record's bucket, s3.bucket, collect's, is checked through
    aws_default)."""
    buckets = bucket_settings(config)
    check_own_buckets(buckets)
    check_subnet(config)
    region = config.emr.region or s3_hook.conn_region_name
    for bucket, names in buckets.items():
        names = [name for name in names if name != "s3.bucket"]
        if names:
            check_bucket(s3_hook, bucket, listed(names))
            check_region(s3_hook, bucket, listed(names), region)


def bucket_settings(config: PipelineConfig) -> dict[str, list[str]]:
    """{bucket: the settings that name it} of every location of the run, which must be on S3."""
    uris = {
        "lake": [config.lake],
        "emr.log_uri": [config.emr.log_uri],
        "emr.code_prefix": [config.emr.code_prefix],
        "corpus": config.corpus,
    }
    found = {config.s3.bucket: ["s3.bucket"]}
    for name, values in uris.items():
        for uri in values:
            if not uri.startswith("s3://"):
                raise ConfigError(f"{name}: target emr reads and writes S3 only, and {shown(uri)} is not an s3:// URI")
            names = found.setdefault(split_s3_uri(uri)[0], [])
            if name not in names:
                names.append(name)
    return found


def listed(names: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def check_own_buckets(buckets: dict[str, list[str]]) -> None:
    names = buckets.get(SHIPPED_BUCKET)
    if names:
        settings = listed(names)
        raise ConfigError(
            f"{settings}: {SHIPPED_BUCKET!r} is the example bucket pipeline.yaml ships with, not one of this "
            f"account's; for target emr set {settings} to a bucket of yours (docs/emr.md, A first real run)"
        )


def check_region(s3_hook, bucket: str, settings: str, region: str | None) -> None:
    """The stages reach S3 in the cluster's region (pipeline/lake.py), so a bucket elsewhere
    would fail them once the cluster runs."""
    response = s3_hook.get_conn().head_bucket(Bucket=bucket)
    bucket_region = response["ResponseMetadata"]["HTTPHeaders"].get("x-amz-bucket-region")
    if region and bucket_region and bucket_region != region:
        raise ConfigError(
            f"{settings}: bucket {bucket!r} is in {bucket_region}, and the cluster starts in {region} (emr.region, "
            f"else the region of the connection {s3_hook.aws_conn_id}): the stages reach S3 in the cluster's "
            "region; use a bucket there, or set emr.region to the bucket's"
        )


def check_subnet(config: PipelineConfig) -> None:
    """A service role with the current managed policy (AmazonEMRServicePolicy_v2, EMR_DefaultRole_V2)
    starts clusters only in subnets tagged for it, so the default VPC's subnet will not do; with
    the legacy role, no subnet is warned of (the default VPC, public addresses)."""
    role = config.emr.service_role
    if config.emr.subnet_id is None and role == LEGACY_SERVICE_ROLE:
        log.warning(
            "emr.subnet_id: not set, so the nodes start in the default VPC's subnet, with public IP addresses; "
            "set emr.subnet_id to a subnet of yours (docs/emr.md)"
        )
    if role != LEGACY_SERVICE_ROLE and config.emr.subnet_id is None:
        raise ConfigError(
            f"emr.subnet_id: needed with emr.service_role {role!r}: a service role other than the legacy "
            f"{LEGACY_SERVICE_ROLE} (with AmazonEMRServicePolicy_v2, such as EMR_DefaultRole_V2) starts clusters "
            "only in a subnet tagged for-use-with-amazon-emr-managed-policies=true; set emr.subnet_id to one"
        )


def corpus_objects(config: PipelineConfig, s3_hook) -> dict[str, int]:
    """Every corpus object on S3 with its size, matched as the tokenize stage matches them
    (corpus_files.expand: an object, a folder's objects, or globs), or a PipelineError naming the pattern
    that matched nothing: checked before a cluster is created."""
    found = {}
    for pattern in config.corpus:
        folder, globs = corpus_files.split_glob(pattern)
        # A name holding a glob's characters ('Hamlet [1603].txt') is taken as it is when it exists.
        matched = matching_objects(s3_hook, pattern, []) if globs else {}
        matched = matched or matching_objects(s3_hook, folder, globs)
        if not matched:
            raise PipelineError(f"corpus {pattern} matches no object on S3")
        found |= matched
    return dict(sorted(found.items()))


def matching_objects(s3_hook, folder: str, globs: list[str]) -> dict[str, int]:
    """{URI: size} of the object `folder` names, else of the objects below it that match `globs`
    (all of them for none)."""
    bucket, prefix = split_s3_uri(folder)
    prefix = prefix.rstrip("/")
    matched = {}
    for item in s3_hook.iter_file_metadata(prefix, bucket_name=bucket):
        key = item["Key"]
        relative = key[len(prefix) + 1 :] if prefix else key
        if key == prefix and not globs:
            return {f"s3://{bucket}/{key}": item["Size"]}
        below = not prefix or key.startswith(prefix + "/")
        if below and not key.endswith("/") and corpus_files.matches(relative.split("/"), globs or ["**"]):
            matched[f"s3://{bucket}/{key}"] = item["Size"]
    return matched


def check_corpus_text(config: PipelineConfig, sizes: dict[str, int], s3_hook) -> None:
    """Stop a corpus whose sniffed objects the tokenize stage would refuse, as it would
    (data.bad_files: fail stops at a bad one; skip leaves it out, and stops only if none is left)."""
    sample = list(sizes.items())[:SNIFF_OBJECTS]
    client = s3_hook.get_conn()
    scans = [
        corpus.Scan(doc_id, 0, *corpus.check_text(head_bytes(client, uri, size)))
        for doc_id, (uri, size) in enumerate(sample)
    ]
    if len(sample) < len(sizes) and config.data.bad_files == "skip" and not any(usable(scan) for scan in scans):
        log.warning(
            "the first %d of the corpus's %d objects are bad or empty (data.bad_files=skip): only the tokenize "
            "stage reads the rest",
            len(sample),
            len(sizes),
        )
        return
    _, _, warnings = corpus.assess(sample, scans, bad_files=config.data.bad_files)
    for warning in warnings:
        log.warning(warning)
    log.info("corpus: the first %d object(s) of %d look like UTF-8 text", len(sample), len(sizes))


def usable(scan: corpus.Scan) -> bool:
    return scan.problem is None and scan.chars > 0


def head_bytes(client, uri: str, size: int) -> bytes:
    """The first SNIFF_BYTES of an object (one ranged GET), without a character the cut splits."""
    if size == 0:
        return b""
    bucket, key = split_s3_uri(uri)
    data = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{SNIFF_BYTES - 1}")["Body"].read()
    return whole_characters(data) if len(data) < size else data


def whole_characters(data: bytes) -> bytes:
    """`data` without the UTF-8 sequence cut at its end, if any (bytes that are no UTF-8 are kept,
    for the check to name)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(data, final=False)
    except UnicodeDecodeError:
        return data
    pending, _ = decoder.getstate()
    return data[: len(data) - len(pending)]
