"""An SNS topic with an SQS queue subscribed to it, on a moto server: where a test reads the alerts
the DAG publishes (include/alerts.py), as a subscriber of the topic would get them."""

from __future__ import annotations

import json

import boto3
from botocore.config import Config

REGION = "us-east-1"


class AlertTopic:
    def __init__(self, endpoint_url: str, name: str = "gpt-pipeline-alerts"):
        # The environment's made-up credentials; a loopback server, never through this machine's proxy.
        clients = {"endpoint_url": endpoint_url, "region_name": REGION, "config": Config(proxies={})}
        self.sns, self.sqs = boto3.client("sns", **clients), boto3.client("sqs", **clients)
        self.arn = self.sns.create_topic(Name=name)["TopicArn"]
        self.queue_url = self.sqs.create_queue(QueueName=name)["QueueUrl"]
        attributes = self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])
        self.sns.subscribe(TopicArn=self.arn, Protocol="sqs", Endpoint=attributes["Attributes"]["QueueArn"])

    def received(self) -> list[dict]:
        """The notifications the queue holds, each as SNS delivers it ("Subject", "Message", ...),
        taken off the queue."""
        answer = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10)
        messages = answer.get("Messages", [])
        for message in messages:
            self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        return [json.loads(message["Body"]) for message in messages]
