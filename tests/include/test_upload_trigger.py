"""Retraining on upload (include/upload_trigger.py): which notifications name a corpus upload, the
watcher the setting gives, and the trigger the parsed DAG's corpus asset holds, run against a moto
server whose bucket notifies its queue as docs/dag.md says. (The watcher in Airflow's own triggerer
and scheduler: tests/dags/test_dag_upload.py.)"""

from __future__ import annotations

import asyncio
import importlib
import json
import runpy

import pytest

from include import upload_trigger
from include.upload_trigger import (
    WATCHER_NAME,
    CorpusUploadTrigger,
    corpus_uploads,
    corpus_watchers,
    in_corpus,
    notification_filter,
    own_folders,
    queue_region,
    uploaded_objects,
)
from pipeline.config import REPO_ROOT, ConfigError
from pipeline.config_files import load_config
from tests.deployments import deploy
from tests.upload_queue import UploadQueue

DAG_FILE = REPO_ROOT / "dags" / "gpt_pipeline.py"
BUCKET = "corpus-bucket"
QUEUE_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/gpt-pipeline-corpus-uploads"


def s3_event(*keys: str, bucket: str = BUCKET, event: str = "ObjectCreated:Put") -> str:
    """A message body as S3 sends it to a queue: one record per object, keys URL-encoded."""
    records = [
        {"eventSource": "aws:s3", "eventName": event, "s3": {"bucket": {"name": bucket}, "object": {"key": key}}}
        for key in keys
    ]
    return json.dumps({"Records": records})


def test_a_notification_names_the_created_objects_with_their_keys_decoded():
    assert uploaded_objects(s3_event("books/Les+Mis%C3%A9rables.txt", "books/a%2Bb.txt")) == [
        f"s3://{BUCKET}/books/Les Misérables.txt",
        f"s3://{BUCKET}/books/a+b.txt",
    ]
    through_sns = json.dumps({"Type": "Notification", "Message": s3_event("books/new.txt")})
    assert uploaded_objects(through_sns) == [f"s3://{BUCKET}/books/new.txt"]


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": BUCKET}),
        s3_event("books/old.txt", event="ObjectRemoved:Delete"),
        "not JSON",
        json.dumps(["Records"]),
        json.dumps({"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put"}]}),
    ],
    ids=["test event", "removed", "not JSON", "a list", "no object"],
)
def test_other_messages_name_no_upload(body):
    assert uploaded_objects(body) == []


@pytest.mark.parametrize(
    "pattern, uri, read",
    [
        ("s3://b/books/*.txt", "s3://b/books/new.txt", True),
        ("s3://b/books/*.txt", "s3://b/books/new.md", False),
        ("s3://b/books/*.txt", "s3://b/books/more/new.txt", False),
        ("s3://b/books/**/*.txt", "s3://b/books/more/new.txt", True),
        ("s3://b/books/", "s3://b/books/more/new.md", True),
        ("s3://b/books", "s3://b/books2/new.txt", False),
        ("s3://b/books/", "s3://b/books/_SUCCESS", False),
        ("s3://b/books/", "s3://b/books/.part.txt", False),
        ("s3://b/books/", "s3://b/books/more/", False),
        ("s3://b/books/a.txt", "s3://b/books/a.txt", True),
        ("s3://b/books/a.txt", "s3://b/books/b.txt", False),
        ("s3://b/Hamlet [1603].txt", "s3://b/Hamlet [1603].txt", True),
        ("s3://b/books/*.txt", "s3://other/books/new.txt", False),
    ],
)
def test_an_upload_counts_when_the_corpus_reads_that_object(pattern, uri, read):
    assert in_corpus(uri, pattern) is read


@pytest.mark.parametrize(
    "pattern, bucket_and_prefix",
    [
        ("s3://b/books/*.txt", ("b", "books/")),
        ("s3://b/books/**/*.txt", ("b", "books/")),
        ("s3://b/books/", ("b", "books/")),
        ("s3://b/books/a.txt", ("b", "books/a.txt")),
        ("s3://b/*.txt", ("b", "")),
        ("s3://b/", ("b", "")),
    ],
)
def test_the_notifications_prefix_is_the_corpuss_folders_before_any_glob(pattern, bucket_and_prefix):
    assert notification_filter(pattern) == bucket_and_prefix


def test_the_pipelines_own_writes_never_count_as_uploads():
    bucket = {"corpus": f"s3://{BUCKET}", "s3": {"bucket": BUCKET}, "emr": {"log_uri": f"s3://{BUCKET}/emr-logs/"}}
    config = load_config(overrides=[bucket])
    ignored = own_folders(config)
    assert {f"s3://{BUCKET}/runs/", f"s3://{BUCKET}/emr-logs/"} <= set(ignored)
    body = s3_event("runs/books-1/samples.txt", "emr-logs/x.txt", "books/new.txt", "runs.txt")
    assert corpus_uploads([body], config.corpus, ignored) == [f"s3://{BUCKET}/books/new.txt", f"s3://{BUCKET}/runs.txt"]


def test_uploads_are_named_once_in_order():
    bodies = [s3_event("books/b.txt", "books/a.txt"), s3_event("books/a.txt")]
    assert corpus_uploads(bodies, [f"s3://{BUCKET}/books/*.txt"], []) == [
        f"s3://{BUCKET}/books/a.txt",
        f"s3://{BUCKET}/books/b.txt",
    ]


def test_the_queues_region_is_its_urls_and_a_local_endpoints_is_the_connections():
    assert queue_region(QUEUE_URL) == "eu-west-1"
    assert queue_region("https://ap-south-1.queue.amazonaws.com/123456789012/uploads") == "ap-south-1"
    assert queue_region("http://127.0.0.1:5000/123456789012/uploads") is None


def test_without_a_queue_the_corpus_has_no_watcher():
    assert load_config().corpus_queue is None
    assert corpus_watchers(load_config(), "aws_default") == []


def test_a_queue_gives_the_corpus_one_watcher_of_its_uploads():
    config = load_config(overrides=[{"corpus": f"s3://{BUCKET}/books/*.txt", "corpus_queue": QUEUE_URL}])
    (watcher,) = corpus_watchers(config, "aws_default")
    trigger = watcher.trigger
    assert watcher.name == WATCHER_NAME and isinstance(trigger, CorpusUploadTrigger)
    assert (trigger.queue_url, trigger.corpus, trigger.region_name) == (QUEUE_URL, config.corpus, "eu-west-1")
    assert trigger.ignored == own_folders(config)


def test_a_queue_for_a_corpus_not_on_s3_is_refused_naming_the_setting():
    config = load_config(overrides=[{"corpus": [f"s3://{BUCKET}/books/*.txt", "README.md"], "corpus_queue": QUEUE_URL}])
    with pytest.raises(ConfigError, match=r"^corpus_queue: .* the corpus file://.*/README\.md is not on S3"):
        corpus_watchers(config, "aws_default")


@pytest.mark.parametrize(
    "url",
    [
        "gpt-pipeline-corpus-uploads",
        "arn:aws:sqs:eu-west-1:123456789012:gpt-pipeline-corpus-uploads",
        "https://sqs.eu-west-1.amazonaws.com/123456789012/gpt-pipeline-corpus-uploads.fifo",
        "s3://corpus-bucket/books/",
        "https://sqs.eu-west-1.amazonaws.com/gpt-pipeline-corpus-uploads",
    ],
    ids=["name", "arn", "fifo", "s3", "no account"],
)
def test_a_corpus_queue_must_be_a_standard_queues_url(url):
    with pytest.raises(
        ConfigError, match=r"^invalid configuration: corpus_queue: .* is not the URL of a standard SQS queue"
    ):
        load_config(overrides=[{"corpus_queue": url}])


# The DAG's own trigger on a moto server: the bucket notifies the queue of new objects under books/.


@pytest.fixture
def uploads(moto) -> UploadQueue:
    return UploadQueue(moto.endpoint_url, BUCKET, prefix="books/")


def dags_trigger(monkeypatch, tmp_path, queue_url: str) -> CorpusUploadTrigger:
    """The trigger of the corpus asset's watcher in the DAG parsed with corpus_queue set, made again
    from its serialized form as Airflow's triggerer makes it."""
    deploy(monkeypatch, tmp_path / "pipeline.yaml", {"corpus": f"s3://{BUCKET}/books/*.txt", "corpus_queue": queue_url})
    dag = runpy.run_path(str(DAG_FILE))["dag"]
    (asset,) = dag.timetable.asset_condition.objects
    (watcher,) = asset.watchers
    classpath, kwargs = watcher.trigger.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


async def first_event(trigger: CorpusUploadTrigger, seconds: float):
    """The trigger's first event, or TimeoutError after `seconds`."""
    events = trigger.run()
    try:
        return await asyncio.wait_for(anext(events), seconds)
    finally:
        await events.aclose()


def test_an_upload_under_the_corpus_prefix_fires_the_dags_trigger_with_its_uri(uploads, monkeypatch, tmp_path):
    trigger = dags_trigger(monkeypatch, tmp_path, uploads.url)
    trigger.wait_seconds = 1  # the DAG's long poll (20 s), which ends a burst of uploads, shortened
    uploads.upload("notes/todo.txt")  # outside the notification's prefix: S3 sends nothing
    uploaded = uploads.upload("books/new.txt")
    event = asyncio.run(first_event(trigger, seconds=60))
    assert event.payload == {"uploads": [uploaded], "count": 1}
    assert uploads.messages_left() == 0  # its notification and S3's test event taken off the queue


def test_a_burst_of_uploads_read_in_several_polls_fires_once(uploads, monkeypatch, tmp_path):
    trigger = dags_trigger(monkeypatch, tmp_path, uploads.url)
    trigger.wait_seconds = 1
    monkeypatch.setattr(upload_trigger, "NAMED_UPLOADS", 5)
    uploaded = sorted(uploads.upload(f"books/{i:02}.txt") for i in range(12))  # a poll takes at most 10 messages
    event = asyncio.run(first_event(trigger, seconds=60))
    assert event.payload == {"uploads": uploaded[:5], "count": 12}


def test_uploads_that_keep_coming_fire_after_the_bursts_longest(uploads, monkeypatch, tmp_path):
    trigger = dags_trigger(monkeypatch, tmp_path, uploads.url)
    monkeypatch.setattr(upload_trigger, "BURST_SECONDS", 0)  # the first poll with an upload ends the burst
    for i in range(12):
        uploads.upload(f"books/{i:02}.txt")
    event = asyncio.run(first_event(trigger, seconds=60))
    assert 1 <= event.payload["count"] <= 10


def test_objects_the_corpus_does_not_read_fire_nothing_and_leave_the_queue(uploads, monkeypatch, tmp_path):
    trigger = dags_trigger(monkeypatch, tmp_path, uploads.url)
    trigger.wait_seconds = 1
    for key in ("notes/todo.txt", "books/notes.md", "books/_SUCCESS", "books/more/deep.txt"):
        uploads.upload(key)
    with pytest.raises(TimeoutError):
        asyncio.run(first_event(trigger, seconds=5))
    assert uploads.messages_left() == 0
