"""Retraining on upload: a new object under the corpus's S3 prefix starts a run.

The corpus bucket sends its ObjectCreated event notifications to an SQS queue, the deployment's
`corpus_queue` (docs/dag.md#retraining-on-upload). Each s3:// corpus asset of the DAG then carries
an AssetWatcher holding one CorpusUploadTrigger, which Airflow's triggerer runs: it long-polls the
queue for notifications naming objects the corpus reads (as the tokenize stage matches them: a
folder's files, globs, hidden names left out). It fires once a burst of such uploads is over (a
poll of wait_seconds brought no message, or the burst has lasted BURST_SECONDS), so that copying a
folder of a thousand files starts one run, not hundreds; the event updates the corpus assets, which
starts a run. That run takes the deployment's settings: the DAG reads no asset event, and the event
holds only the uploaded objects' URIs.

The trigger reads the queue with boto3 in a thread rather than with the amazon provider's
SqsSensorTrigger, whose aiobotocore client cannot be installed beside this project's botocore.
It deletes each message as it reads it, also those it does not act on (S3's test event, an object
the corpus does not read): the queue is the watcher's alone, and a message left on it would come
again and start a run each time. An object under the pipeline's own S3 folders (the lake's run
folders, the records, EMR's logs and code) starts no run, whatever the corpus names: a run's own
writes would otherwise start the next one.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from urllib.parse import unquote_plus

from airflow.sdk import AssetWatcher
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from pipeline import corpus_files
from pipeline.config import ConfigError, PipelineConfig
from pipeline.errors import name_some

WATCHER_NAME = "corpus_upload"
MAX_MESSAGES = 10  # the most one ReceiveMessage returns
LONG_POLL_SECONDS = 20  # the longest SQS holds a ReceiveMessage open: three requests a minute while idle
RETRY_SECONDS = 60  # after the queue could not be read (permissions, network), before the next try
BURST_SECONDS = 300  # uploads that keep coming fire at the latest this long after the first
NAMED_UPLOADS = 100  # the most an event names: its extra is kept in Airflow's database
# https://sqs.<region>.amazonaws.com/..., and the older https://<region>.queue.amazonaws.com/...
AWS_QUEUE_HOST = re.compile(r"^https://(?:sqs\.([a-z0-9-]+)|([a-z0-9-]+)\.queue)\.amazonaws\.com(?:\.cn)?/")


def corpus_watchers(config: PipelineConfig, aws_conn_id: str) -> list[AssetWatcher]:
    """The watchers of the corpus assets: none without corpus_queue. ConfigError, naming it, for a
    corpus that is not all on S3, whose uploads no bucket notification could report."""
    if config.corpus_queue is None:
        return []
    off_s3 = [uri for uri in config.corpus if not uri.startswith("s3://")]
    if off_s3:
        raise ConfigError(
            f"corpus_queue: a queue of S3 event notifications starts runs on uploads to a corpus on S3, but the "
            f"corpus {name_some(off_s3)} is not on S3: give an s3:// corpus, or set corpus_queue to null"
        )
    trigger = CorpusUploadTrigger(
        queue_url=config.corpus_queue,
        corpus=config.corpus,
        ignored=own_folders(config),
        aws_conn_id=aws_conn_id,
        region_name=queue_region(config.corpus_queue),
    )
    return [AssetWatcher(name=WATCHER_NAME, trigger=trigger)]


def own_folders(config: PipelineConfig) -> list[str]:
    """The S3 folders the pipeline writes to: the lake's run folders, the records, EMR's logs and code."""
    folders = [f"{config.lake}/runs", config.s3.record_folder(), config.emr.log_uri, config.emr.code_prefix]
    return [folder.rstrip("/") + "/" for folder in folders if folder.startswith("s3://")]


def queue_region(queue_url: str) -> str | None:
    """The region in an AWS queue URL, where SQS takes its requests; None for another endpoint's
    (LocalStack, moto), whose region the Airflow connection gives."""
    found = AWS_QUEUE_HOST.match(queue_url)
    return (found.group(1) or found.group(2)) if found else None


def notification_filter(pattern: str) -> tuple[str, str]:
    """The bucket and the key prefix of the event notification an s3:// corpus pattern needs: its
    folders before any glob ("s3://bucket/books/*.txt" -> "bucket", "books/"), or the object's key."""
    folder, globs = corpus_files.split_glob(pattern)
    bucket, _, key = folder.removeprefix("s3://").partition("/")
    key = key.rstrip("/")
    return bucket, f"{key}/" if key and (globs or pattern.endswith("/")) else key


def in_corpus(uri: str, pattern: str) -> bool:
    """Whether the object at uri is one the corpus pattern reads: the object it names, or a file
    below its folder that its glob matches (every unhidden one for a folder)."""
    if uri == pattern:
        return True
    folder, globs = corpus_files.split_glob(pattern)
    folder = folder.rstrip("/") + "/"
    if not uri.startswith(folder) or uri.endswith("/"):
        return False
    return corpus_files.matches(uri[len(folder) :].split("/"), globs or ["**"])


def uploaded_objects(body: str) -> list[str]:
    """The s3:// URIs of the objects an S3 event notification reports created; none for S3's test
    event or a message of another kind. A notification passed on by an SNS topic is read too."""
    try:
        message = json.loads(body)
        if isinstance(message, dict) and message.get("Type") == "Notification":
            message = json.loads(message["Message"])
        records = message["Records"]
        return [
            f"s3://{record['s3']['bucket']['name']}/{unquote_plus(record['s3']['object']['key'])}"
            for record in records
            if record.get("eventSource") == "aws:s3" and record.get("eventName", "").startswith("ObjectCreated:")
        ]
    except (ValueError, TypeError, KeyError, AttributeError):
        return []


def corpus_uploads(bodies: list[str], corpus: list[str], ignored: list[str]) -> list[str]:
    """The objects the messages report created that the corpus reads, outside the ignored folders."""
    uploads = [uri for body in bodies for uri in uploaded_objects(body)]
    return sorted(
        {
            uri
            for uri in uploads
            if any(in_corpus(uri, pattern) for pattern in corpus) and not uri.startswith(tuple(ignored))
        }
    )


class CorpusUploadTrigger(BaseEventTrigger):
    """Fires, naming the uploads, after each burst of corpus uploads the queue brings notifications of."""

    def __init__(
        self,
        queue_url: str,
        corpus: list[str],
        ignored: list[str],
        aws_conn_id: str,
        region_name: str | None = None,
        wait_seconds: int = LONG_POLL_SECONDS,
    ):
        super().__init__()
        self.queue_url = queue_url
        self.corpus = list(corpus)
        self.ignored = list(ignored)
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.wait_seconds = wait_seconds

    def serialize(self) -> tuple[str, dict]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "queue_url": self.queue_url,
                "corpus": self.corpus,
                "ignored": self.ignored,
                "aws_conn_id": self.aws_conn_id,
                "region_name": self.region_name,
                "wait_seconds": self.wait_seconds,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        client = await asyncio.to_thread(self.sqs_client)
        watched = ", ".join("s3://{}/{}".format(*notification_filter(pattern)) for pattern in self.corpus)
        self.log.info("watching %s for uploads to %s", self.queue_url, watched)
        while True:
            uploads = await self.next_burst(client)
            self.log.info("%d corpus upload(s): %s", len(uploads), name_some(uploads, shown=10))
            yield TriggerEvent({"uploads": uploads[:NAMED_UPLOADS], "count": len(uploads)})

    async def next_burst(self, client) -> list[str]:
        """The corpus uploads of the next burst: read until a poll after the first brings no message,
        or BURST_SECONDS after the first."""
        uploads: set[str] = set()
        first = 0.0
        while True:
            messages = await self.take(client, await self.receive(client))
            new = corpus_uploads([message["Body"] for message in messages], self.corpus, self.ignored)
            if new and not uploads:
                first = time.monotonic()
            uploads.update(new)
            if uploads and (not messages or time.monotonic() - first > BURST_SECONDS):
                return sorted(uploads)

    def sqs_client(self):
        """A boto3 SQS client from the Airflow connection (credentials, region, endpoint)."""
        from airflow.providers.amazon.aws.hooks.sqs import SqsHook

        return SqsHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name).get_conn()

    async def receive(self, client) -> list[dict]:
        """The next messages, after up to wait_seconds of long polling."""
        answer = await self.call(
            client.receive_message,
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=MAX_MESSAGES,
            WaitTimeSeconds=self.wait_seconds,
        )
        return answer.get("Messages", [])

    async def take(self, client, messages: list[dict]) -> list[dict]:
        """The messages deleted from the queue, before any is acted on: a message that stayed would
        come again and start another run each time."""
        if not messages:
            return []
        entries = [{"Id": str(i), "ReceiptHandle": message["ReceiptHandle"]} for i, message in enumerate(messages)]
        answer = await self.call(client.delete_message_batch, QueueUrl=self.queue_url, Entries=entries)
        deleted = {entry["Id"] for entry in answer.get("Successful", [])}
        return [message for i, message in enumerate(messages) if str(i) in deleted]

    async def call(self, method, **kwargs) -> dict:
        """An SQS call, in a thread; {} after a pause when it fails (a missing permission or queue,
        the network), which the log names and the next call tries again."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return await asyncio.to_thread(method, **kwargs)
        except (BotoCoreError, ClientError) as error:
            self.log.warning("%s: %s (trying again in %d s)", self.queue_url, error, RETRY_SECONDS)
            await asyncio.sleep(RETRY_SECONDS)
            return {}
