"""The run's report.html one click from the run in the Airflow UI: the collect task's extra link
("Run report", on the task instance's page) leads to the report in the run's S3 record.

Airflow 3 works out an operator's extra links on the worker when the task ends and keeps them as
XComs; the collect task leaves the report's address as its `report_url` XCom for the link to read.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import BaseOperatorLink, BaseXCom

from spark_jobs.lib import run_folder

REPORT_URL_KEY = "report_url"


def report_url(s3_uri: str, endpoint_url: str | None, region: str | None) -> str:
    """Where a browser opens the report.html of the record at `s3_uri`: on an S3 endpoint of the
    connection's own (the moto server, LocalStack) the object itself, path-style; on AWS the S3
    console's page of it (the record is private: the console signs the user in)."""
    bucket, _, prefix = s3_uri.removeprefix("s3://").partition("/")
    key = f"{prefix.rstrip('/')}/{run_folder.REPORT_HTML}"
    if endpoint_url:
        return f"{endpoint_url.rstrip('/')}/{bucket}/{quote(key)}"
    query = {"prefix": key} | ({"region": region} if region else {})
    return f"https://console.aws.amazon.com/s3/object/{bucket}?{urlencode(query)}"


class RunReportLink(BaseOperatorLink):
    name = "Run report"

    def get_link(self, operator, *, ti_key) -> str:
        return BaseXCom.get_value(ti_key=ti_key, key=REPORT_URL_KEY) or ""


class CollectOperator(PythonOperator):
    """The collect task: a PythonOperator with the run report's link."""

    operator_extra_links = (RunReportLink(),)
