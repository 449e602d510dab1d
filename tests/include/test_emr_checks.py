"""The checks of the account's side of an EMR run (include/emr_checks.py) against a moto server:
the buckets, the service role and the sniffed corpus."""

from __future__ import annotations

import logging

import boto3
import pytest

from include import emr_checks
from pipeline.config import ConfigError
from pipeline.config_files import DEFAULT_CONFIG_PATH, load_config, read_yaml
from pipeline.errors import PipelineError
from tests.include.records import LAKE_BUCKET

OWN = {
    "target": "emr",
    "corpus": f"s3://{LAKE_BUCKET}/corpus/",
    "lake": f"s3://{LAKE_BUCKET}/lake",
    "s3": {"bucket": LAKE_BUCKET},
    "emr": {"log_uri": f"s3://{LAKE_BUCKET}/logs/", "code_prefix": f"s3://{LAKE_BUCKET}/code/"},
}


def emr_config(*overrides):
    return load_config(overrides=[OWN, *overrides])


def put(s3, key: str, body: bytes) -> str:
    s3.client().put_object(Bucket=LAKE_BUCKET, Key=key, Body=body)
    return f"s3://{LAKE_BUCKET}/{key}"


def test_the_shipped_bucket_is_the_one_checked_for():
    defaults = read_yaml(DEFAULT_CONFIG_PATH)
    assert defaults["s3"]["bucket"] == emr_checks.SHIPPED_BUCKET
    for uri in (defaults["emr"]["log_uri"], defaults["emr"]["code_prefix"]):
        assert uri.startswith(f"s3://{emr_checks.SHIPPED_BUCKET}/")


def test_own_buckets_that_exist_pass(hook):
    emr_checks.check_settings(emr_config(), hook)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"s3": {"bucket": "gpt-pipeline"}}, "s3.bucket: 'gpt-pipeline' is the example bucket"),
        ({"emr": {"log_uri": "s3://gpt-pipeline/emr-logs/"}}, "emr.log_uri: 'gpt-pipeline' is the example bucket"),
        (
            {"lake": "s3://gpt-pipeline/lake", "corpus": "s3://gpt-pipeline/corpus/a.txt"},
            "lake and corpus: 'gpt-pipeline' is the example bucket",
        ),
        ({"corpus": ["s3://lake-bucket/a.txt", "/data/b.txt"]}, "corpus: target emr reads and writes S3 only"),
        ({"emr": {"service_role": "EMR_DefaultRole_V2"}}, "emr.subnet_id: needed with emr.service_role"),
    ],
    ids=["record", "logs", "lake-and-corpus", "local-corpus", "service-role-v2"],
)
def test_settings_that_cannot_work_on_an_account_are_named(hook, override, message):
    with pytest.raises(ConfigError, match=message):
        emr_checks.check_settings(emr_config(override), hook)


def test_no_subnet_is_warned_of(caplog):
    with caplog.at_level(logging.WARNING, logger="include.emr_checks"):
        emr_checks.check_subnet(emr_config())
    assert "emr.subnet_id: not set, so the nodes start in the default VPC's subnet, with public IP" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="include.emr_checks"):
        emr_checks.check_subnet(emr_config("emr.subnet_id=subnet-0123456789abcdef0"))
    assert caplog.text == ""


def test_a_v2_service_role_with_a_subnet_passes(hook):
    emr_checks.check_settings(
        emr_config({"emr": {"service_role": "EMR_DefaultRole_V2", "subnet_id": "subnet-0123456789abcdef0"}}), hook
    )


def test_a_bucket_that_does_not_exist_is_named_with_every_setting_that_uses_it(hook):
    assert emr_checks.listed(["a"]) == "a" and emr_checks.listed(["a", "b", "c"]) == "a, b and c"
    config = emr_config({"emr": {"log_uri": "s3://no-such-bucket/logs/", "code_prefix": "s3://no-such-bucket/code/"}})
    with pytest.raises(PipelineError, match="emr.log_uri and emr.code_prefix: bucket 'no-such-bucket' does not exist"):
        emr_checks.check_settings(config, hook)


def test_a_bucket_in_another_region_than_the_clusters_is_named(s3, hook):
    client = boto3.client("s3", region_name="eu-west-1", endpoint_url=s3.endpoint_url)
    client.create_bucket(Bucket="far-bucket", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    config = emr_config({"corpus": "s3://far-bucket/books/"})
    with pytest.raises(
        ConfigError, match="corpus: bucket 'far-bucket' is in eu-west-1, and the cluster starts in us-e"
    ):
        emr_checks.check_settings(config, hook)
    config = emr_config({"corpus": "s3://far-bucket/books/", "emr": {"region": "eu-west-1"}})
    message = (
        "lake, emr.log_uri and emr.code_prefix: bucket 'lake-bucket' is in us-east-1, and the cluster starts in eu"
    )
    with pytest.raises(ConfigError, match=message):
        emr_checks.check_settings(config, hook)


def test_a_text_corpus_passes_and_a_cut_character_is_not_a_problem(s3, hook, caplog):
    # 'é' is two bytes: the first 64 KB end in the middle of one.
    text = ("x" * (emr_checks.SNIFF_BYTES - 1) + "é" * 100).encode()
    sizes = {put(s3, "ok/big.txt", text): len(text), put(s3, "ok/small.txt", b"small\n"): 6}
    with caplog.at_level(logging.INFO, logger="include.emr_checks"):
        emr_checks.check_corpus_text(emr_config(), sizes, hook)
    assert "the first 2 object(s) of 2 look like UTF-8 text" in caplog.text


@pytest.mark.parametrize(
    "body, problem",
    [
        ("Café".encode("cp1252"), "is not UTF-8 text (byte 0xe9 at offset 3)"),
        ("Café\n".encode("utf-16"), "is UTF-16 text, not UTF-8"),
        (b"text\x00more", "looks binary (NUL byte at offset 4)"),
        (b"\x1f\x8b\x08\x00", "is a gzip archive, not text"),
        # A file that ends in a cut character is no text; only a 64 KB cut may split one.
        (b"text \xc3", "is not UTF-8 text (byte 0xc3 at offset 5)"),
    ],
    ids=["cp1252", "utf-16", "binary", "gzip", "cut-at-its-end"],
)
def test_an_object_that_is_not_text_stops_the_run_with_the_tokenize_stages_message(s3, hook, body, problem):
    sizes = {put(s3, "bad/a.txt", b"good\n"): 5, put(s3, "bad/b.txt", body): len(body)}
    expected = f"corpus file s3://{LAKE_BUCKET}/bad/b.txt {problem}"
    with pytest.raises(PipelineError, match=expected.replace("(", r"\(").replace(")", r"\)")) as error:
        emr_checks.check_corpus_text(emr_config(), sizes, hook)
    assert str(error.value).endswith("set data.bad_files=skip to leave such files out")


def test_with_bad_files_skip_a_bad_object_is_left_out_unless_none_is_left(s3, hook, caplog):
    skip = {"data": {"bad_files": "skip"}}
    bad, good = put(s3, "skip/bad.txt", b"\xff\xfe\x00a"), put(s3, "skip/good.txt", b"good\n")
    with caplog.at_level(logging.WARNING, logger="include.emr_checks"):
        emr_checks.check_corpus_text(emr_config(skip), {bad: 4, good: 5}, hook)
    assert f"skipping corpus file {bad}: it is UTF-16 text" in caplog.text
    with pytest.raises(PipelineError, match="the corpus has no usable text: every file is bad or empty"):
        emr_checks.check_corpus_text(emr_config(skip), {bad: 4}, hook)


def test_at_most_the_first_objects_are_sniffed_and_by_their_first_bytes(s3, hook, monkeypatch, caplog):
    monkeypatch.setattr(emr_checks, "SNIFF_OBJECTS", 2)
    monkeypatch.setattr(emr_checks, "SNIFF_BYTES", 8)
    uris = [
        put(s3, "many/a.txt", b"text " * 4 + b"\x00"),
        put(s3, "many/b.txt", b"text\n"),
        put(s3, "many/c.txt", b"\x00"),
    ]
    emr_checks.check_corpus_text(emr_config(), {uri: 5 for uri in uris}, hook)  # a's NUL and all of c are unread

    # With skip, a sample of bad objects alone cannot tell that the rest hold no text.
    monkeypatch.setattr(emr_checks, "SNIFF_BYTES", 64)
    skip = emr_config({"data": {"bad_files": "skip"}})
    with caplog.at_level(logging.WARNING, logger="include.emr_checks"):
        emr_checks.check_corpus_text(skip, {uris[0]: 21, uris[2]: 1, put(s3, "many/d.txt", b"text\n"): 5}, hook)
    assert "the first 2 of the corpus's 3 objects are bad or empty (data.bad_files=skip)" in caplog.text


def test_whole_characters_drops_only_a_sequence_cut_at_the_end():
    assert emr_checks.whole_characters("aé".encode()[:-1]) == b"a"
    assert emr_checks.whole_characters("a€".encode()[:-1]) == b"a"
    assert emr_checks.whole_characters("aé".encode()) == "aé".encode()
    assert emr_checks.whole_characters(b"a\xff\xc3") == b"a\xff\xc3"  # no UTF-8: kept for the check to name
