"""A corpus bucket that notifies an SQS queue of new objects under the corpus's prefix, on a moto
server, set up as docs/dag.md#retraining-on-upload says: the queue, its access policy letting the
bucket send to it, and the bucket's event notification with the prefix filter."""

from __future__ import annotations

import json

import boto3
from botocore.config import Config

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's
QUEUE_NAME = "gpt-pipeline-corpus-uploads"


def queue_policy(queue_arn: str, bucket: str, account: str) -> dict:
    """The queue's access policy: S3 may send it the notifications of the bucket, in the account."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "s3.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {
                    "ArnLike": {"aws:SourceArn": f"arn:aws:s3:::{bucket}"},
                    "StringEquals": {"aws:SourceAccount": account},
                },
            }
        ],
    }


def notification(queue_arn: str, prefix: str) -> dict:
    """The bucket's event notification: each new object under the prefix, to the queue."""
    rules = [{"Name": "prefix", "Value": prefix}]
    return {
        "QueueConfigurations": [
            {
                "Id": "corpus-uploads",
                "QueueArn": queue_arn,
                "Events": ["s3:ObjectCreated:*"],
                "Filter": {"Key": {"FilterRules": rules}},
            }
        ]
    }


class UploadQueue:
    def __init__(self, endpoint_url: str, bucket: str, prefix: str):
        # The environment's credentials; a loopback server, never through this machine's proxy.
        clients = {"endpoint_url": endpoint_url, "region_name": REGION, "config": Config(proxies={})}
        self.s3, self.sqs = boto3.client("s3", **clients), boto3.client("sqs", **clients)
        self.bucket = bucket
        self.s3.create_bucket(Bucket=bucket)
        self.url = self.sqs.create_queue(QueueName=QUEUE_NAME)["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.sqs.set_queue_attributes(
            QueueUrl=self.url, Attributes={"Policy": json.dumps(queue_policy(arn, bucket, ACCOUNT))}
        )
        self.s3.put_bucket_notification_configuration(
            Bucket=bucket, NotificationConfiguration=notification(arn, prefix)
        )

    def upload(self, key: str, text: str = "To be, or not to be, that is the question.\n") -> str:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=text.encode())
        return f"s3://{self.bucket}/{key}"

    def messages_left(self) -> int:
        """The messages on the queue, those a reader holds included."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        attributes = self.sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=names)["Attributes"]
        return sum(int(attributes[name]) for name in names)
