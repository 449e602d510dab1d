# The image every Airflow service of docker-compose.yaml runs: the official Airflow 3 image for
# Python 3.11, plus Java 17 for Spark and this project's pinned Python environment, so the DAG's
# local target (spark-submit in local mode, multi-worker TensorFlow) runs inside the container.
# The project's code is not copied in: docker-compose.yaml mounts dags/, pipeline/, spark_jobs/ and include/.
# AIRFLOW_BASE: the image to build on; a machine that cannot pull the official image passes a
# local image with the same user, paths and entrypoint.
ARG AIRFLOW_BASE=apache/airflow:3.3.2-python3.11
FROM ${AIRFLOW_BASE}

USER root
# Spark 3.5 runs on Java 17 (procps: Spark's launch scripts call ps). JAVA_HOME gets an
# architecture-independent name (the JVM folder ends in amd64 or arm64).
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/java-17 \
    && apt-get autoremove -yqq --purge \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17

USER airflow
COPY --chown=airflow:0 requirements.txt /opt/airflow/requirements.txt
# Naming the image's own Airflow version next to the pinned environment makes pip fail loudly,
# instead of silently moving Airflow, should the two ever disagree.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /opt/airflow/requirements.txt
