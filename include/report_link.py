"""The run's report.html one click from the run in the Airflow UI: the collect task's extra link
("Run report", on the task instance's page) leads to the report in the run's S3 record.

Airflow 3 works out an operator's extra links on the worker when the task ends and keeps them as
XComs; the collect task leaves the report's address as its `report_url` XCom for the link to read.
"""

from __future__ import annotations

from urllib.parse import urlencode

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import BaseOperatorLink, BaseXCom

from pipeline import run_folder

REPORT_URL_KEY = "report_url"
LINK_SECONDS = 7 * 24 * 3600  # the longest a presigned URL lasts


def report_url(s3_uri: str, hook) -> str:
    """Where a browser opens the report.html of the record at `s3_uri`. On an S3 endpoint of the
    connection's own (the moto server of `make airflow`, LocalStack), a presigned URL of the object:
    S3 serves a private object to no one else. On AWS, the S3 console's page of the object, which
    signs the user in: no address that is itself an access to the record."""
    bucket, key = hook.parse_s3_url(s3_uri.rstrip("/") + "/" + run_folder.REPORT_HTML)
    if hook.conn_config.get_service_endpoint_url("s3"):
        params = {"Bucket": bucket, "Key": key}
        return hook.generate_presigned_url("get_object", params=params, expires_in=LINK_SECONDS)
    region = hook.conn_region_name
    query = {"prefix": key} | ({"region": region} if region else {})
    return f"https://console.aws.amazon.com/s3/object/{bucket}?{urlencode(query)}"


class RunReportLink(BaseOperatorLink):
    name = "Run report"

    def get_link(self, operator, *, ti_key) -> str:
        return BaseXCom.get_value(ti_key=ti_key, key=REPORT_URL_KEY) or ""


class CollectOperator(PythonOperator):
    """The collect task: a PythonOperator with the run report's link."""

    operator_extra_links = (RunReportLink(),)
