"""What an EMR node's bootstrap does with the wheelhouse, timed on this machine: the wheelhouse's
size, then a fresh Python 3.11 virtual environment and the offline `pip install --no-index
--find-links` of the jobs' requirements into it, then `pip check`.

    .venv/bin/python -m benchmarks.wheelhouse_install --wheelhouse DIR [--python python3.11] [--s3]

DIR is a built wheelhouse (`python -m include.wheelhouse build --no-upload --dest DIR`). With --s3
the wheels are also uploaded to a moto S3 server on loopback (include/wheelhouse.upload) and
downloaded back, as the bootstrap's `aws s3 cp --recursive` does, and that download is timed too
(loopback: a floor for what S3 takes). Prints the figures and the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from include import emr_code, wheelhouse


def timed(argv: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def folder_mb(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 1e6


def install(wheels: Path, python: str, folder: Path) -> dict[str, float]:
    """The bootstrap's venv and pip commands, offline from `wheels`."""
    venv = folder / "venv"
    requirements, constraints = emr_code.requirement_files()
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    figures = {"venv_seconds": timed([python, "-m", "venv", str(venv)])}
    figures["install_seconds"] = timed(
        [*pip, "install", "--no-cache-dir", "--disable-pip-version-check", "--no-index", "--find-links", str(wheels)]
        + ["-r", str(requirements), "-c", str(constraints)]
    )
    figures["check_seconds"] = timed([*pip, "check"])
    figures["venv_mb"] = folder_mb(venv)
    return figures


def s3_download_seconds(wheels: list[Path], folder: Path) -> float:
    from local_platform.moto_s3 import LocalS3

    with LocalS3(buckets=("wheelhouse-benchmark",)) as s3:
        uri = "s3://wheelhouse-benchmark/code/wheelhouse/benchmark"
        wheelhouse.upload(wheels, uri, s3.client())
        client = s3.client()
        started = time.monotonic()
        for item in client.list_objects_v2(Bucket="wheelhouse-benchmark", Prefix="code/")["Contents"]:
            client.download_file("wheelhouse-benchmark", item["Key"], str(folder / Path(item["Key"]).name))
        return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheelhouse", type=Path, required=True, help="a built wheelhouse folder")
    parser.add_argument("--python", default=shutil.which("python3.11") or "python3.11", help="the nodes' Python 3.11")
    parser.add_argument("--s3", action="store_true", help="also time the download from a moto S3 on loopback")
    args = parser.parse_args(argv)
    wheels = sorted(args.wheelhouse.glob("*.whl"))
    if not wheels:
        print(f"ERROR --wheelhouse: no wheels in {args.wheelhouse}", file=sys.stderr)
        return 2
    print(f"wheelhouse:        {args.wheelhouse} ({emr_code.requirements_hash()} is the current requirements hash)")
    print(f"size:              {len(wheels)} wheels, {folder_mb(args.wheelhouse):,.0f} MB")
    with tempfile.TemporaryDirectory(prefix="wheelhouse-benchmark-") as folder:
        if args.s3:
            (Path(folder) / "download").mkdir()
            print(f"moto S3 download:  {s3_download_seconds(wheels, Path(folder) / 'download'):,.1f} s")
        figures = install(args.wheelhouse, args.python, Path(folder))
    print(f"venv:              {figures['venv_seconds']:,.1f} s ({args.python})")
    print(f"pip install:       {figures['install_seconds']:,.1f} s (offline, --no-index --find-links)")
    print(f"pip check:         {figures['check_seconds']:,.1f} s")
    print(f"environment:       {figures['venv_mb']:,.0f} MB on disk")
    print(f"load average:      {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
