"""A small Spark stage for tests/spark_jobs/test_spark_metrics.py, run with spark-submit through
spark_jobs.spark.stage_app.run_stage as every stage is: Spark writes ROWS rows of Parquet, reads them back
and counts them by key (a shuffle), so that its metrics hold input, output and shuffle."""

from __future__ import annotations

from pipeline import lake
from spark_jobs.spark.stage_app import run_stage

STAGE = "metrics-check"
ROWS = 5000
KEYS = 7


def body(spark, config, run) -> dict:
    path = lake.local_path(lake.join(run, "numbers"))
    spark.range(ROWS, numPartitions=4).selectExpr("id", f"id % {KEYS} AS key").write.parquet(path)
    counts = spark.read.parquet(path).groupBy("key").count().collect()
    return {"keys": len(counts)}


if __name__ == "__main__":
    run_stage(STAGE, body)
