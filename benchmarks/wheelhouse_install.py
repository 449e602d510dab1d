"""What an EMR node's bootstrap does with the wheelhouse, timed on this machine: the wheelhouse's
size, then a fresh Python 3.11 virtual environment and the offline `pip install --no-index
--find-links` of the jobs' requirements into it, then `pip check`.

    .venv/bin/python -m benchmarks.wheelhouse_install --wheelhouse DIR [--python python3.11] [--s3]
        [--uv UV] [--repeats N]

DIR is a built wheelhouse (`python -m include.wheelhouse build --no-upload --dest DIR`). With --s3
the wheels are also uploaded to a moto S3 server on loopback (include/wheelhouse.upload) and
downloaded back, as the bootstrap's `aws s3 cp --recursive` does, and that download is timed too
(loopback: a floor for what S3 takes). With --uv (a uv executable) the same install is also done
with `uv pip install --offline --no-index --find-links DIR --compile-bytecode` (pip byte-compiles
too) into a fresh environment of its own, and the ratio of the two install times is printed.
--repeats runs each installer N times, interleaved (pip, uv, pip, uv, ...), and takes the
medians. pip and uv run without this machine's pip configuration, as on a node. Prints the figures
and the load average.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from include import emr_code, wheelhouse


def node_env() -> dict[str, str]:
    """This environment without pip's and uv's settings: a node has no pip.conf (nor uv.toml)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("PIP_", "UV_"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull}


def timed(argv: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=node_env())
    return time.monotonic() - started


def folder_mb(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 1e6


def requirement_args(wheels: Path) -> list[str]:
    requirements, constraints = emr_code.requirement_files()
    return ["--no-index", "--find-links", str(wheels), "-r", str(requirements), "-c", str(constraints)]


def pip_install(python: Path, wheels: Path) -> list[str]:
    """The bootstrap's install."""
    options = ["--no-cache-dir", "--disable-pip-version-check"]
    return [str(python), "-m", "pip", "install", *options, *requirement_args(wheels)]


def uv_install(python: Path, wheels: Path, uv: str) -> list[str]:
    """The same install with uv, byte-compiling as pip does, without a cache to reuse (a node has none)."""
    options = ["--offline", "--no-cache", "--no-config", "--compile-bytecode", "--python", str(python)]
    return [uv, "pip", "install", *options, *requirement_args(wheels)]


# An installer's command line, given the environment's python and the wheelhouse.
Installer = Callable[[Path, Path], list[str]]


def install(installer: Installer, wheels: Path, python: str, venv: Path) -> dict[str, float]:
    """The bootstrap's steps, offline: a fresh environment at `venv`, the install, pip check."""
    venv_python = venv / "bin" / "python"
    figures = {"venv_seconds": timed([python, "-m", "venv", str(venv)])}
    figures["install_seconds"] = timed(installer(venv_python, wheels))
    figures["check_seconds"] = timed([str(venv_python), "-m", "pip", "check"])
    figures["venv_mb"] = folder_mb(venv)
    shutil.rmtree(venv)
    return figures


def install_rounds(installers: dict[str, Installer], wheels: Path, python: str, folder: Path, repeats: int) -> dict:
    """Each installer `repeats` times, interleaved, each into a fresh environment.
    Returns {installer: {figure: [one value per run]}}."""
    runs: dict[str, dict[str, list[float]]] = {name: {} for name in installers}
    for repeat in range(repeats):
        for name, installer in installers.items():
            for figure, value in install(installer, wheels, python, folder / f"{name}-{repeat}").items():
                runs[name].setdefault(figure, []).append(value)
    return runs


def print_installs(runs: dict[str, dict[str, list[float]]]) -> None:
    """Each installer's medians, its install times one by one, and pip's time over uv's."""
    medians = {name: {key: statistics.median(values) for key, values in runs[name].items()} for name in runs}
    for name, figures in medians.items():
        each = ", ".join(f"{seconds:,.1f}" for seconds in runs[name]["install_seconds"])
        print(
            f"{name + ' install:':<19}{figures['install_seconds']:,.1f} s (offline, median of: {each} s); "
            f"venv {figures['venv_seconds']:,.1f} s, pip check {figures['check_seconds']:,.1f} s, "
            f"environment {figures['venv_mb']:,.0f} MB"
        )
    if "uv" in medians:
        ratio = medians["pip"]["install_seconds"] / medians["uv"]["install_seconds"]
        print(f"pip / uv install:  {ratio:.2f}x")


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
    parser.add_argument("--uv", help="a uv executable: also time `uv pip install --offline` of the same wheelhouse")
    parser.add_argument("--repeats", type=int, default=1, help="installs per installer, interleaved (medians)")
    args = parser.parse_args(argv)
    wheels = sorted(args.wheelhouse.glob("*.whl"))
    if not wheels:
        print(f"ERROR --wheelhouse: no wheels in {args.wheelhouse}", file=sys.stderr)
        return 2
    installers: dict[str, Installer] = {"pip": pip_install}
    if args.uv:
        installers["uv"] = functools.partial(uv_install, uv=args.uv)
    print(f"wheelhouse:        {args.wheelhouse} ({emr_code.requirements_hash()} is the current requirements hash)")
    print(f"size:              {len(wheels)} wheels, {folder_mb(args.wheelhouse):,.0f} MB")
    print(f"python:            {args.python}" + (f", {version(args.uv)}" if args.uv else ""))
    with tempfile.TemporaryDirectory(prefix="wheelhouse-benchmark-") as folder:
        if args.s3:
            (Path(folder) / "download").mkdir()
            print(f"moto S3 download:  {s3_download_seconds(wheels, Path(folder) / 'download'):,.1f} s")
        print_installs(install_rounds(installers, args.wheelhouse, args.python, Path(folder), args.repeats))
    print(f"load average:      {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores")
    return 0


def version(executable: str) -> str:
    return subprocess.run([executable, "--version"], check=True, capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
