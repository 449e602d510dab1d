"""Spark applications, one per pipeline stage, and the library they share (spark_jobs.lib)."""
